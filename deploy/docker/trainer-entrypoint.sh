#!/bin/sh
# Entry point of the trainer image: hands the remediation token to the ranks' directive client,
# which reads it from TRAINGUARD_REMEDIATION_TOKEN, when it comes as a file (a compose or
# Kubernetes secret), then runs the given command (torchrun ... by default).
set -eu
if [ -z "${TRAINGUARD_REMEDIATION_TOKEN:-}" ] && [ -n "${TRAINGUARD_REMEDIATION_TOKEN_FILE:-}" ]; then
    TRAINGUARD_REMEDIATION_TOKEN="$(cat "$TRAINGUARD_REMEDIATION_TOKEN_FILE")"
    export TRAINGUARD_REMEDIATION_TOKEN
fi
exec "$@"
