"""``trainguard diagnose``: write the incident report of one job.

Exit status: 1 a failure was found (the report says which), 0 nothing was found, 2 the
diagnosis could not run (bad arguments, Prometheus unreachable, no data about the job).
Incidents that cannot be read (the remediation service unreachable, a bad file) do not stop
it: the report names the gap in its Validate section and a warning goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainguard import contract

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``1d`` as seconds."""
    match = _DURATION.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a duration like 30m, 2h or 1d: {text!r}")
    return float(match.group(1)) * _UNIT[match.group(2)]


def timestamp(text: str) -> float:
    """Unix seconds, or an ISO 8601 time (UTC unless it names its offset)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a unix time or ISO 8601 time: {text!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL")
    parser.add_argument("--job-id", required=True, help="the job's job_id label")
    parser.add_argument(
        "--since", type=duration, default=duration("2h"), help="window length (default 2h)"
    )
    parser.add_argument(
        "--sustain",
        type=duration,
        default=300.0,
        help="a condition counts once it has held this long (default 5m)",
    )
    parser.add_argument(
        "--until", type=timestamp, default=None, help="window end (unix or ISO time; default now)"
    )
    parser.add_argument(
        "--dumps", type=Path, help="Flight Recorder dump folder (the hook's dump_dir)"
    )
    parser.add_argument(
        "--logs", nargs="+", default=[], metavar="FILE", help="ECS event logs and raw logs"
    )
    parser.add_argument(
        "--thresholds",
        type=Path,
        metavar="FILE",
        help="the thresholds.yml the rules were rendered from (default: the shipped one)",
    )
    parser.add_argument("--out", type=Path, help="report folder (default ./diagnose-<job_id>)")
    parser.add_argument("--json", action="store_true", help="also write report.json")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds per Prometheus query and per remediation request (default 30)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--remediation-url",
        metavar="URL",
        help="the remediation service: its incidents of the job fill the Validate section",
    )
    source.add_argument(
        "--incidents",
        type=Path,
        metavar="FILE",
        help='a saved GET /v1/incidents answer ({"incidents": [...]}) instead of the service',
    )
    parser.add_argument(
        "--remediation-token-file",
        type=Path,
        metavar="FILE",
        help=f"the service's bearer token (default ${contract.ENV_REMEDIATION_TOKEN})",
    )


def incidents(args: argparse.Namespace) -> tuple[list[Any] | None, str, str | None]:
    """The job's incident documents, where they came from, and why not when they could not be
    read (None, None when none were asked for)."""
    from trainguard.diagnose.validate import IncidentsError, fetch, load_file

    if args.incidents is not None:
        where = f"the incidents file {args.incidents}"
        try:
            return load_file(args.incidents), where, None
        except IncidentsError as exc:
            return None, where, str(exc)
    if args.remediation_url is None:
        return None, "", None
    where = f"the remediation service at {args.remediation_url}"
    token = os.environ.get(contract.ENV_REMEDIATION_TOKEN)
    if args.remediation_token_file is not None:
        try:
            token = args.remediation_token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            return None, where, f"cannot read the token file {args.remediation_token_file}: {exc}"
    try:
        return fetch(args.remediation_url, args.job_id, token, args.timeout), where, None
    except IncidentsError as exc:
        return None, where, str(exc)


def run(args: argparse.Namespace) -> int:
    from trainguard.diagnose import NoDataError, PrometheusError, diagnose
    from trainguard.diagnose.render import as_json, markdown

    documents, source, gap = incidents(args)
    if gap:
        print(f"trainguard diagnose: incidents not read: {gap}", file=sys.stderr)
    from trainguard.thresholds import Thresholds, ThresholdsError, default_path

    try:
        limits = Thresholds.load(args.thresholds or default_path())
    except (ThresholdsError, OSError) as exc:
        print(f"trainguard diagnose: {exc}", file=sys.stderr)
        return 2
    safe_job = re.sub(r"[^A-Za-z0-9_.-]", "_", args.job_id)
    out: Path = args.out or Path(f"diagnose-{safe_job}")
    try:
        report = diagnose(
            args.prometheus,
            args.job_id,
            since_seconds=args.since,
            until=args.until,
            dumps=args.dumps,
            logs=args.logs,
            charts_dir=None if args.no_charts else out / "charts",
            timeout=args.timeout,
            sustain_seconds=args.sustain,
            incidents=documents,
            incidents_source=source,
            incidents_gap=gap,
            thresholds=limits,
        )
    except (PrometheusError, NoDataError) as exc:
        print(f"trainguard diagnose: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    md_path = out / "report.md"
    md_path.write_text(markdown(report, relative_to=out))
    written = [md_path]
    if args.json:
        json_path = out / "report.json"
        json_path.write_text(as_json(report))
        written.append(json_path)
    headline = report.symptoms[0].summary if report.symptoms else "no failure found"
    print(f"{headline}\nscope: {report.scope.level.value}; report: {', '.join(map(str, written))}")
    return 1 if report.symptoms else 0
