"""``trainguard demo`` on the command line; the work happens in :mod:`.run` (imported when it
runs, so ``trainguard --help`` needs none of the demo's dependencies)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from pathlib import Path
from types import FrameType

from trainguard.demo.config import DemoConfig, Ports, compute_share
from trainguard.demo.faults import DEFAULT_PLAN, parse_plan


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=Path("out/demo"))
    parser.add_argument("--faults", default=DEFAULT_PLAN, help="fault plan (see demo.faults)")
    parser.add_argument("--steps", type=int, default=DemoConfig.steps)
    parser.add_argument("--step-seconds", type=float, default=DemoConfig.step_seconds)
    parser.add_argument(
        "--compute-share",
        type=compute_share,
        default=DemoConfig.compute_share,
        help="share of each step's compute that is real matmuls, the rest a sleep (0-1)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after (s)")
    parser.add_argument("--keep-running", action="store_true", help="leave the stack up")
    defaults = Ports()
    for name in vars(defaults):
        parser.add_argument(
            f"--{name.replace('_', '-')}-port", type=int, default=getattr(defaults, name)
        )


def run(args: argparse.Namespace) -> int:
    parse_plan(args.faults)  # a bad plan is reported before anything starts
    ports = Ports(**{name: getattr(args, f"{name}_port") for name in vars(Ports())})
    cfg = DemoConfig(
        workdir=args.workdir.resolve(),
        ports=ports,
        steps=args.steps,
        step_seconds=args.step_seconds,
        compute_share=args.compute_share,
        faults=args.faults,
    )
    if cfg.workdir.exists():
        shutil.rmtree(cfg.workdir)
    cfg.workdir.mkdir(parents=True)

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    from trainguard.demo.run import print_where, run_demo

    try:
        result = run_demo(cfg, args.timeout, keep_running=args.keep_running)
    except KeyboardInterrupt:
        print("stopped; every process the demo started has been stopped", file=sys.stderr)
        return 130
    if not args.keep_running:  # with it, run_demo printed this before waiting for Ctrl-C
        print_where(cfg, result)
    return 0 if result.finished else 1
