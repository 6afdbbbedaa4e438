"""``trainguard rules``: render the rules file from a thresholds file, or check it.

PyYAML is imported only when the command runs, so ``trainguard --help`` needs no extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--thresholds",
        type=Path,
        default=HERE / "thresholds.yml",
        help="thresholds YAML to read (default: the packaged thresholds.yml)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE / "trainguard.rules.yml",
        help="rules file to write (default: alerts/trainguard/alerts/trainguard.rules.yml)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if --out differs from what the thresholds render",
    )


def run(args: argparse.Namespace) -> int:
    from trainguard.alerts.rules import render
    from trainguard.thresholds import Thresholds, ThresholdsError

    try:
        text = render(Thresholds.load(args.thresholds))
    except (OSError, ThresholdsError) as error:
        print(f"trainguard rules: {error}", file=sys.stderr)
        return 2
    out: Path = args.out
    if args.check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            print(f"trainguard rules: {out} is stale; run `trainguard rules`", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    return 0
