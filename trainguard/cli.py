"""The ``trainguard`` command line.

Each subcommand lives in the component that owns it and is imported only when it runs, so
``trainguard --help`` works in an image that has neither torch nor fastapi installed.
A subcommand module exposes ``configure(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from trainguard.version import VERSION

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "exporter": ("trainguard.exporters.app", "Run the node exporter (GPUs, NCCL logs and config)."),
    "doctor": ("trainguard.exporters.doctor", "Check this node's NCCL settings and print fixes."),
    "rules": ("trainguard.alerts.cli", "render or check the Prometheus rules from thresholds"),
    "dashboards": ("trainguard.dashboards.cli", "write or check the Grafana dashboards"),
    "triage": ("trainguard.triage.cli", "find what went wrong in raw training logs"),
    "logs-setup": (
        "trainguard.logs.cli",
        "install the Elasticsearch template, ILM policy and Kibana data view for logs",
    ),
    "remediation": ("trainguard.remediation.cli", "run the remediation service"),
    "demo": ("trainguard.demo.cli", "run the detect -> alert -> remediate demo on this machine"),
    "diagnose": (
        "trainguard.diagnose.cli",
        "write the incident report of a job: symptom, scope, root causes, advice, charts",
    ),
    "catalogue": (
        "trainguard.catalogue",
        "write or check docs/catalogue.md, the failure catalogue as the code has it",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainguard", description="Monitoring and remediation for distributed training."
    )
    parser.add_argument("--version", action="version", version=f"trainguard {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_module=module_name)
        module = importlib.import_module(module_name)
        module.configure(sub_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; a reader of its output that goes away early (``| head``) ends it
    quietly with status 1, the recipe of https://docs.python.org/3/library/signal.html#note-on-sigpipe
    (Python ignores SIGPIPE, so each write to the closed pipe raises BrokenPipeError)."""
    try:
        try:
            result = _run(argv)
        except SystemExit:  # argparse's --help and usage errors
            sys.stdout.flush()
            raise
        # Flush here rather than at interpreter exit, so a closed pipe is caught below and not
        # reported by Python as an exception ignored while flushing stdout.
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        return 1
    return result


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(args._module)
    result: int = module.run(args)
    return result


def _discard_stdout() -> None:
    """Point stdout's descriptor at /dev/null: what is still buffered in it is flushed there at
    exit instead of raising BrokenPipeError again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing is flushed to a descriptor at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
