#!/usr/bin/env bash
# trainguard's Slurm prolog (slurm.conf: Prolog=/etc/trainguard/slurm/prolog.sh, with
# PrologFlags=Alloc so it runs on every node of the job as soon as the job is allocated).
#
# Records the job on this node and, unless the exporter runs on its own, starts the node's
# trainguard-exporter if none runs (one per node, shared by the jobs on it) and announces it
# to Prometheus. Idempotent: running it again for the same job changes nothing. It always exits
# 0: a monitoring failure is logged, never a reason to drain the node or requeue the job.
trap 'exit 0' EXIT

# shellcheck source=common.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/common.sh" || exit 0

tg_prolog() {
	: >"$tg_state/jobs/$tg_job" || tg_log "cannot record job $tg_job in $tg_state/jobs"
	[ "$tg_manage" = 1 ] || return 0
	tg_start_exporter && tg_register_exporter
}

tg_valid_job && tg_locked tg_prolog
