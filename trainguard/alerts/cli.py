"""``trainguard rules``: render the rules file from a thresholds file, or check it.

``--format prometheus-rule`` writes the same rules as a Prometheus Operator ``PrometheusRule``
(``deploy/kubernetes/operator/prometheusrule.yaml`` in the repository).

PyYAML is imported only when the command runs, so ``trainguard --help`` needs no extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "trainguard.rules.yml"
FORMATS = ("rules", "prometheus-rule")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--thresholds",
        type=Path,
        default=None,
        help="thresholds YAML to read (default: the packaged thresholds.yml)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="file to write (default for --format rules: trainguard/alerts/trainguard.rules.yml)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="rules",
        help="rules: a Prometheus rules file; prometheus-rule: a Prometheus Operator "
        "PrometheusRule manifest (then --out is required)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if --out differs from what the thresholds render, or if the "
        "packaged runbook.md disagrees with the failure catalogue",
    )


def run(args: argparse.Namespace) -> int:
    from trainguard.alerts.kubernetes import render_prometheus_rule
    from trainguard.alerts.rules import render
    from trainguard.thresholds import Thresholds, ThresholdsError, default_path

    if args.format == "prometheus-rule" and args.out is None:
        print("trainguard rules: --format prometheus-rule needs --out", file=sys.stderr)
        return 2
    renderer = render_prometheus_rule if args.format == "prometheus-rule" else render
    try:
        text = renderer(Thresholds.load(args.thresholds or default_path()))
    except (OSError, ThresholdsError) as error:
        print(f"trainguard rules: {error}", file=sys.stderr)
        return 2
    out: Path = args.out or DEFAULT_OUT
    if args.check:
        from trainguard.alerts import runbook

        problems = runbook.check(runbook.packaged_text())
        for problem in problems:
            print(f"trainguard rules: runbook.md: {problem}", file=sys.stderr)
        if problems:
            return 1
        current = out.read_text() if out.exists() else ""
        if current != text:
            again = "" if args.format == "rules" else f" --format {args.format} --out {out}"
            print(
                f"trainguard rules: {out} is stale; run `trainguard rules{again}`", file=sys.stderr
            )
            return 1
        return 0
    out.write_text(text)
    return 0
