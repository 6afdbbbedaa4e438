"""``trainguard dashboards``: write the dashboard JSON from the generator, or check them.

``--configmaps FILE`` writes them instead as ConfigMaps for Grafana's dashboard sidecar
(``deploy/kubernetes/base/dashboards.yaml`` in the repository).

grafana-foundation-sdk is imported only when the command runs (the ``mixin`` extra).
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
        default=None,
        help="thresholds YAML whose values the panels draw as threshold lines (default: the "
        "packaged thresholds.yml)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=HERE,
        help="folder to write the dashboard JSON files to (default: dashboards/)",
    )
    parser.add_argument(
        "--configmaps",
        type=Path,
        default=None,
        help="write (or --check) one YAML file of Grafana-sidecar ConfigMaps instead of the JSON",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a file in --out-dir differs from the generator's output",
    )


def run(args: argparse.Namespace) -> int:
    try:
        from trainguard.dashboards.build import render_all
        from trainguard.dashboards.kubernetes import render_configmaps
    except ImportError as error:
        print(f"trainguard dashboards: {error}; install trainguard[mixin]", file=sys.stderr)
        return 2
    from trainguard.thresholds import Thresholds, ThresholdsError, default_path

    try:
        thresholds = Thresholds.load(args.thresholds or default_path())
    except (OSError, ThresholdsError) as error:
        print(f"trainguard dashboards: {error}", file=sys.stderr)
        return 2
    if args.configmaps is not None:
        return _configmaps(args.configmaps, render_configmaps(thresholds), check=args.check)
    out_dir: Path = args.out_dir
    stale = []
    for name, text in render_all(thresholds).items():
        path = out_dir / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            out_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(
            f"trainguard dashboards: stale in {out_dir}: {', '.join(stale)}; "
            "run `trainguard dashboards`",
            file=sys.stderr,
        )
        return 1
    return 0


def _configmaps(path: Path, text: str, *, check: bool) -> int:
    if not check:
        path.write_text(text)
        return 0
    if not path.exists() or path.read_text() != text:
        print(
            f"trainguard dashboards: {path} is stale; "
            f"run `trainguard dashboards --configmaps {path}`",
            file=sys.stderr,
        )
        return 1
    return 0
