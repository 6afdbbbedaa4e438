"""Parts of the diagnosis that need no Prometheus: queries, counters, errors, arguments."""

from __future__ import annotations

import argparse
import json
import math
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.diagnose.synthetic import OOM_LOG
from trainguard import contract
from trainguard.cli import main
from trainguard.contract import Failure
from trainguard.diagnose.cli import duration, timestamp
from trainguard.diagnose.evidence import read_logs
from trainguard.diagnose.model import Chart, Report
from trainguard.diagnose.prometheus import PrometheusClient, PrometheusError, Series
from trainguard.diagnose.render import as_json
from trainguard.diagnose.signals import increments, promql_string, rule_query
from trainguard.thresholds import load_default

SHIPPED = load_default()


def test_a_raw_rule_is_queried_with_its_expression_as_fallback() -> None:
    query = rule_query(contract.REC_RANK_COMPUTE_MEAN, 'job_id="j"', SHIPPED)
    recorded, raw = query.split("\nor\n")
    assert recorded == f'{contract.REC_RANK_COMPUTE_MEAN}{{job_id="j"}}'
    # Every raw selector of the rule's expression carries the job's matcher.
    assert f'{contract.STEP_COMPUTE_DURATION.name}_sum{{job_id="j"}}[5m]' in raw
    assert f'{contract.STEP_COMPUTE_DURATION.name}_count{{job_id="j"}}[5m]' in raw


def test_a_rule_reading_other_rules_is_queried_by_name_only() -> None:
    assert rule_query(contract.REC_JOB_STALL_THRESHOLD, 'job_id="j"', SHIPPED) == (
        f'{contract.REC_JOB_STALL_THRESHOLD}{{job_id="j"}}'
    )


def test_job_ids_are_escaped_in_promql() -> None:
    assert promql_string('a"b\\c') == '"a\\"b\\\\c"'


def test_counter_increments_survive_resets() -> None:
    series = Series({}, [(0, 0), (1, 0), (2, 1), (3, 1), (4, 0), (5, 2), (6, float("nan"))])
    assert increments(series) == [(2, 1), (5, 2)]


def test_durations_and_times_parse() -> None:
    assert duration("2h") == 7200 and duration("90s") == 90 and duration("1.5d") == 129600
    with pytest.raises(argparse.ArgumentTypeError):
        duration("2 hours")
    assert timestamp("1700000000") == 1700000000
    assert timestamp("2023-11-14T22:13:20Z") == 1700000000
    assert timestamp("2023-11-14T22:13:20") == 1700000000


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_prometheus_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    code = main(["diagnose", "--prometheus", url, "--job-id", "j", "--timeout", "2"])
    assert code == 2
    assert f"cannot reach Prometheus at {url}" in capsys.readouterr().err


def test_an_error_answer_names_the_query() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            400, json={"status": "error", "errorType": "bad_data", "error": "parse error"}
        )

    client = PrometheusClient("http://prom:9090", transport=httpx.MockTransport(answer))
    with pytest.raises(PrometheusError, match=re.escape("refused 'up{': parse error")):
        client.query("up{", 0)


def test_a_non_prometheus_answer_is_a_clear_error() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>login</html>")

    client = PrometheusClient("http://prom:9090", transport=httpx.MockTransport(answer))
    with pytest.raises(PrometheusError, match="not JSON"):
        client.query_range("up", 0, 60, 15)


def test_a_bad_url_is_refused() -> None:
    with pytest.raises(PrometheusError, match="http:// or https://"):
        PrometheusClient("prom:9090")


def test_logs_give_events_of_this_job_and_triage_findings(tmp_path) -> None:
    events = tmp_path / "rank0.ndjson"
    events.write_text(
        '{"@timestamp": "2026-01-01T00:00:00Z", "message": "oom on rank 1", '
        '"event": {"action": "oom"}, "labels": {"job_id": "j", "rank": "1"}, '
        '"trainguard": {"tried_bytes": 1}}\n'
        '{"message": "other", "event.action": "oom", "labels.job_id": "k"}\n'
        "not json {\n"
        '{"event": 3}\n'
    )
    raw = tmp_path / "stderr.log"
    raw.write_bytes(b"\x00\x01binary\n" + OOM_LOG.encode())
    evidence = read_logs([str(tmp_path), str(tmp_path / "missing.log")], "j", SHIPPED)
    (event,) = evidence.events
    assert (event.kind, event.rank, event.details) == ("oom", 1, {"tried_bytes": 1})
    assert evidence.other_jobs_skipped == 1
    assert [f.failure for f in evidence.findings] == [Failure.OOM]
    assert evidence.findings[0].fields["verdict"] == "fragmentation"
    assert evidence.unreadable and "missing.log" in evidence.unreadable[0]


def test_the_json_report_writes_non_finite_values_as_null() -> None:
    chart = Chart("step", "Step time", "step.png", {"p99": [[0.0, math.inf], [1.0, math.nan]]})
    report = Report("job", 0.0, 1.0, 1.0, "http://prometheus:9090", charts=[chart])
    (data,) = json.loads(as_json(report))["charts"]
    assert data["data"]["p99"] == [[0.0, None], [1.0, None]]


def test_diagnosing_dumps_on_two_threads_at_once_leaves_stdout_as_it_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The Flight Recorder analyzer prints; its output is captured. Two overlapping captures
    # once left sys.stdout pointing at the first one's buffer.
    from trainguard.diagnose import evidence, flight_recorder

    def analyze(folder: Path, allow_incomplete: bool = False) -> list[Any]:
        print("analyzer output")
        time.sleep(0.3 if folder.name == "first" else 0.5)
        return []

    monkeypatch.setattr(flight_recorder, "analyze", analyze)
    before = sys.stdout
    dumps = [
        evidence.StallDump(folder=tmp_path / name, ranks_dumped=[0]) for name in ("first", "second")
    ]
    first = threading.Thread(target=evidence._analyze, args=(dumps[0],))
    second = threading.Thread(target=evidence._analyze, args=(dumps[1],))
    first.start()
    time.sleep(0.1)
    second.start()
    first.join()
    second.join()
    assert sys.stdout is before
