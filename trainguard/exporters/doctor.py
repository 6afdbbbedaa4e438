"""``trainguard doctor``: the NCCL configuration lint of this node, for a human.

Prints, for each failing check, which training ranks fail it, why it matters, the fix and the
page that explains it. Exits 1 when something should be fixed, 0 when all is well (or when no
training process runs here), so it fits in a job's pre-flight script. Settings whose default
changed across torch releases (the Flight Recorder's buffer: off before torch 2.11, 2000 entries
since) are judged against the torch installed where doctor runs, read from its package metadata
without importing it; without torch, doctor says that default is unknown.
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
    *,
    torch_version: str | None,
) -> Report:
    """The report; ``torch_version`` is the torch the ranks run (None: unknown), which decides
    the defaults of the settings they leave unset."""
    from trainguard.exporters.nccl_lint import Check, flight_recorder_defaults, lint

    lines = [f"trainguard doctor: {len(processes)} training process(es) on this node"]
    defaults = flight_recorder_defaults(torch_version)
    if defaults is None:
        lines.append(
            "  torch: not installed here (or its version is unreadable), so its defaults "
            "are unknown"
        )
    else:
        state = "off" if defaults.default_entries == 0 else f"{defaults.default_entries} entries"
        lines.append(
            f"  torch: {torch_version} (Flight Recorder by default: {state}; "
            f"set with {' or '.join(defaults.names)})"
        )
    if unreadable:
        lines.append(
            f"  ({unreadable} process(es) could not be read; run as root to check them too)"
        )
    findings = lint(processes, host, latencies, torch_version)
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
    from trainguard.exporters.nccl_lint import RankMetricsLatency, installed_torch_version
    from trainguard.exporters.procs import ProcfsSource, SysfsHost

    scan = ProcfsSource(args.proc_root).scan()
    host = SysfsHost(args.sys_root).facts()
    latencies = None if args.no_latency else RankMetricsLatency()
    # The torch installed here, read from its metadata (doctor never imports torch): the
    # ranks' own torch when doctor runs in the training image, as its pre-flight script does.
    report = render(
        scan.processes,
        scan.unreadable,
        host,
        latencies,
        torch_version=installed_torch_version(),
    )
    print(report.text)
    return 1 if report.findings else 0
