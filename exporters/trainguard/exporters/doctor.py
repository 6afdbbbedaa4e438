"""``trainguard doctor``: the NCCL configuration lint of this node, for a human.

Prints, for each failing check, which training ranks fail it, why it matters, the fix and the
page that explains it. Exits 1 when something should be fixed, 0 when all is well (or when no
training process runs here), so it fits in a job's pre-flight script.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainguard.exporters.nccl_lint import Finding, LatencySource
    from trainguard.exporters.procs import HostFacts, TrainingProcess


@dataclass(frozen=True)
class Report:
    text: str
    findings: list[Finding]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--proc-root", type=Path, default=Path("/proc"), help="where to find processes"
    )
    parser.add_argument(
        "--sys-root", type=Path, default=Path("/sys"), help="where to find IB devices and NICs"
    )
    parser.add_argument(
        "--no-latency",
        action="store_true",
        help="do not ask the ranks' metrics endpoints for their collective latency",
    )


def render(
    processes: Sequence[TrainingProcess],
    unreadable: int,
    host: HostFacts,
    latencies: LatencySource | None,
) -> Report:
    from trainguard.exporters.nccl_lint import Check, lint

    lines = [f"trainguard doctor: {len(processes)} training process(es) on this node"]
    if unreadable:
        lines.append(
            f"  ({unreadable} process(es) could not be read; run as root to check them too)"
        )
    findings = lint(processes, host, latencies)
    if not processes:
        lines.append("No training process (RANK and LOCAL_RANK in its environment) found.")
        return Report("\n".join(lines), findings)
    for check in Check:
        of_check = [f for f in findings if f.check is check]
        if not of_check:
            continue
        who = ", ".join(f"rank {f.rank or '?'} (pid {f.pid})" for f in of_check)
        first = of_check[0]
        lines += [
            "",
            f"[{check.value}] {who}",
            f"  problem: {first.problem}",
            f"  fix:     {first.fix}",
            f"  see:     {first.runbook_url}",
        ]
    if findings:
        failing = len({f.check for f in findings})
        lines += ["", f"{failing} check(s) failed."]
    else:
        lines.append("All NCCL configuration checks passed.")
    return Report("\n".join(lines), findings)


def run(args: argparse.Namespace) -> int:
    from trainguard.exporters.nccl_lint import RankMetricsLatency
    from trainguard.exporters.procs import ProcfsSource, SysfsHost

    scan = ProcfsSource(args.proc_root).scan()
    host = SysfsHost(args.sys_root).facts()
    latencies = None if args.no_latency else RankMetricsLatency()
    report = render(scan.processes, scan.unreadable, host, latencies)
    print(report.text)
    return 1 if report.findings else 0
