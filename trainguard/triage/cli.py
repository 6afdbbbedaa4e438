"""``trainguard triage FILE|DIR|-``: say what went wrong in raw training logs, where, what to do.

For jobs that are not instrumented: torchrun output, ranks' stderr, NCCL debug files, kernel
logs. Standard library and the core's PyYAML only (the packaged thresholds), so it runs on any
machine that has the logs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TextIO

from trainguard.contract import FAILURES
from trainguard.thresholds import load_default
from trainguard.triage.detectors import default_detectors
from trainguard.triage.findings import Finding
from trainguard.triage.scanner import Progress, Scanner, ScanStats

EXIT_NOTHING_FOUND = 0
EXIT_FOUND = 1
# 2 is argparse's usage error.
EXIT_UNREADABLE = 3

_EPILOG = f"""\
exit status: {EXIT_FOUND} when a failure was found, {EXIT_NOTHING_FOUND} when nothing was found,
{EXIT_UNREADABLE} when nothing was found and some input could not be read, 2 on a usage error.
Directories are read recursively; *.gz files are decompressed; '-' reads standard input."""

# Findings are listed failure by failure in the catalogue's order: causes before what they cause.
_ORDER = {failure: index for index, failure in enumerate(FAILURES)}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("inputs", nargs="+", metavar="FILE|DIR|-", help="logs to read")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per finding (NDJSON)"
    )
    parser.add_argument(
        "--straggler-threshold",
        type=float,
        default=None,
        help="a rank is a straggler when its median time exceeds its peers' by at least this "
        "share (default: thresholds.yml's straggler_factor less 1, what the TrainingStraggler "
        "alert uses)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress line even on a terminal"
    )


def _total_bytes(inputs: list[str]) -> int | None:
    total = 0
    for name in inputs:
        if name == "-":
            return None
        paths = [Path(name)]
        if paths[0].is_dir():
            paths = [Path(root) / f for root, _, files in os.walk(name) for f in files]
        for path in paths:
            try:
                total += path.stat().st_size
            except OSError:
                continue
    return total


def _render(finding: Finding, out: TextIO) -> None:
    repeat = f" (seen {finding.count} times)" if finding.count > 1 else ""
    out.write(f"[{finding.failure.value}] {finding.summary}\n")
    out.write(f"  at {finding.location.file}:{finding.location.line}{repeat}\n")
    for key, value in finding.fields.items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        out.write(f"  {key}: {text}\n")
    out.write(f"  advice: {finding.advice}\n\n")


def _summary(stats: ScanStats, findings: int) -> str:
    parts = [
        f"triage: {findings} finding(s) in {stats.files} input(s), "
        f"{stats.bytes / 1e6:,.1f} MB, {stats.lines:,} lines"
    ]
    if stats.binary_lines or stats.overlong_lines:
        parts.append(
            f"skipped {stats.binary_lines} binary and {stats.overlong_lines} overlong line(s)"
        )
    if stats.dropped_findings:
        parts.append(f"{stats.dropped_findings} further distinct failure(s) not kept")
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    show_progress = not args.no_progress and sys.stderr.isatty()
    progress = Progress(sys.stderr, _total_bytes(args.inputs)) if show_progress else None
    thresholds = load_default()
    factor = None if args.straggler_threshold is None else 1.0 + args.straggler_threshold
    scanner = Scanner(default_detectors(thresholds, straggler_factor=factor), progress=progress)
    try:
        scanner.scan_paths(args.inputs)
    finally:
        if progress is not None:
            progress.close()
    findings = sorted(
        scanner.findings(),
        key=lambda f: (_ORDER[f.failure], f.location.file, f.location.line),
    )
    for finding in findings:
        if args.json:
            sys.stdout.write(json.dumps(finding.to_json(), sort_keys=False) + "\n")
        else:
            _render(finding, sys.stdout)
    for path, reason in scanner.stats.unreadable:
        sys.stderr.write(f"triage: cannot read {path}: {reason}\n")
    sys.stderr.write(_summary(scanner.stats, len(findings)) + "\n")
    if findings:
        return EXIT_FOUND
    return EXIT_UNREADABLE if scanner.stats.unreadable else EXIT_NOTHING_FOUND
