"""``trainguard remediation`` and ``trainguard-remediation``: run the service.

Settings come from the environment (``TRAINGUARD_REMEDIATION_*``); the flags here override the
ones an operator changes most. ``--check-policy`` validates a policy file and exits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainguard import contract

# The verifier's timing flags, each the setting of the same name (defaults in the settings).
_VERIFY_FLAGS = (
    ("verify_interval_seconds", "how often the verifier looks at open incidents (5)"),
    ("verify_directive_seconds", "verification deadline after a directive (180)"),
    ("verify_restart_seconds", "verification deadline after restart_from_checkpoint (300)"),
    ("verify_exclude_seconds", "verification deadline after exclude_node (300)"),
    ("verify_drain_seconds", "verification deadline after drain_node (600)"),
    ("verify_page_seconds", "verification deadline after page, annotate or advice (300)"),
    ("verify_progress_seconds", "how long a job must keep stepping after a repair (60)"),
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (default 9095)")
    parser.add_argument("--db", type=Path, help="SQLite database file")
    parser.add_argument(
        "--database-url", help="Postgres URL (postgresql://...) instead of the SQLite file"
    )
    parser.add_argument("--policy", type=Path, help="YAML policy (default: the shipped policy)")
    parser.add_argument("--token-file", type=Path, help="file holding the bearer token")
    parser.add_argument(
        "--live",
        action="store_true",
        help="execute actions (the default is dry-run: decisions are only recorded)",
    )
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="accept requests without a bearer token (local development only)",
    )
    parser.add_argument(
        "--prometheus-url", help="Prometheus the verifier reads jobs' progress from"
    )
    parser.add_argument("--alertmanager-url", help="Alertmanager the page action posts to")
    parser.add_argument(
        "--public-url", help="this service's base URL in pages' links (default http://HOST:PORT)"
    )
    for name, description in _VERIFY_FLAGS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, help=description)
    parser.add_argument("--check-policy", action="store_true", help="validate the policy and exit")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument(
        "--log-format",
        default="ecs",
        choices=["ecs", "text"],
        help="ECS JSON (to $TRAINGUARD_LOG_FILE, else stdout; no per-request access log) or "
        "text with uvicorn's access log (default ecs)",
    )


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from trainguard.logs import configure_process_logging
    from trainguard.remediation.policy import PolicyError, load_policy
    from trainguard.remediation.settings import ConfigurationError, Settings
    from trainguard.remediation.store import StoreError

    if args.check_policy:
        try:
            policy = load_policy(args.policy)
        except PolicyError as exc:
            print(f"invalid policy: {exc}", file=sys.stderr)
            return 1
        print(f"policy ok: {len(policy.rules)} rules for {len(policy.alerts())} alerts")
        return 0

    overrides: dict[str, Any] = {
        name: value
        for name, value in (
            ("host", args.host),
            ("port", args.port),
            ("db_path", args.db),
            ("database_url", args.database_url),
            ("policy_file", args.policy),
            ("token_file", args.token_file),
            ("prometheus_url", args.prometheus_url),
            ("alertmanager_url", args.alertmanager_url),
            ("public_url", args.public_url),
            *((name, getattr(args, name)) for name, _ in _VERIFY_FLAGS),
        )
        if value is not None
    }
    if args.live:
        overrides["dry_run"] = False
    if args.insecure_no_auth:
        overrides["insecure_no_auth"] = True
    configure_process_logging(
        service_name=contract.SERVICE_REMEDIATION,
        dataset="remediation",
        level=args.log_level,
        log_format=args.log_format,
    )
    try:
        settings = Settings(**overrides)
        from trainguard.remediation.app import create_app

        app = create_app(settings)
    except (ConfigurationError, PolicyError, StoreError, ValidationError) as exc:
        print(f"trainguard-remediation: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    if args.log_format == "ecs":
        # uvicorn's own loggers go through the root logger's ECS handler; an access line per
        # webhook call would dominate the log in an alert storm (the audit trail has them).
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level=args.log_level.lower(),
            log_config=None,
            access_log=False,
        )
    else:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level.lower())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trainguard-remediation", description="The trainguard remediation service."
    )
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
