"""The report's Validate section (the remediation service's incidents of the job) and its
Prevent section (settings with the evidence they rest on), in Markdown and JSON, on the real
Prometheus of the synthetic history.

Incident documents are the service's IncidentView (``tests/diagnose/incidents/``): a hang
recovered by a restart from checkpoint, a straggler escalated to a page (with another job's
incident and a malformed entry beside it), and a truncated file.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.diagnose import synthetic
from tests.diagnose.conftest import HangRun, History
from trainguard.cli import main
from trainguard.contract import Failure, IncidentOutcome, JobOutcome
from trainguard.diagnose import Report, diagnose
from trainguard.diagnose.model import Setting
from trainguard.diagnose.render import as_dict, markdown
from trainguard.diagnose.validate import IncidentsError, load_file, parse

INCIDENTS = Path(__file__).parent / "incidents"
TOKEN = "incidents-token"


def section(text: str, number: int) -> str:
    """One numbered section of the Markdown report, up to the next one."""
    start = text.index(f"\n## {number}. ")
    following = text.find("\n## ", start + 1)
    return text[start : following if following != -1 else len(text)]


def setting(report: Report, cause: str, name: str) -> Setting:
    (entry,) = [p for p in report.prevention if p.cause == cause]
    (found,) = [s for s in entry.settings if s.name == name]
    return found


def command(history: History, job_id: str, out: Path, *extra: str) -> int:
    return main(
        ["diagnose", "--prometheus", history.url, "--job-id", job_id, "--until",
         str(history.now), "--out", str(out), "--json", "--no-charts", "--timeout", "5", *extra]
    )  # fmt: skip


# --- Validate ---------------------------------------------------------------------------------
def test_a_recovered_incident_says_what_was_done_and_when_training_recovered(
    history: History, hang: HangRun
) -> None:
    report = diagnose(
        history.url,
        synthetic.HANG,
        until=history.now,
        thresholds=synthetic.SHIPPED,
        dumps=hang.dumps,
        logs=[str(hang.logs)],
        incidents=load_file(INCIDENTS / "recovered.json"),
        incidents_source="the incidents file recovered.json",
    )
    text = markdown(report)
    validate = section(text, 5)
    assert "From the incidents file recovered.json: 1 incident(s) of this job." in validate
    assert "### Incident 7: TrainingCollectiveStalled on job-hang rank 2 (hang): recovered" in (
        validate
    )
    assert (
        "- Timeline: first evidence 2026-12-03 03:00:00 UTC -> detected (alert firing) "
        "2026-12-03 03:00:45 UTC (45 s after evidence) -> received 2026-12-03 03:00:46 UTC -> "
        "acted 2026-12-03 03:00:48 UTC (3 s after detection) -> recovered 2026-12-03 03:04:15 "
        "UTC (3 min 30 s after detection) -> closed 2026-12-03 03:04:20 UTC."
    ) in validate
    assert (
        "- Recovered 3 min 30 s after detection (time to act 3 s), by restart_from_checkpoint."
    ) in validate
    assert (
        "  - rung 0: `restart_from_checkpoint` (action 41) succeeded at 2026-12-03 03:00:48 UTC; "
        "verdict recovered"
    ) in validate
    assert "- Escalated: no (rung 0, the first plan)." in validate
    assert "- Human paged: no." in validate
    assert (
        "- Outcome: recovered; job outcome: resumed: training passed step 4100, the step it had "
        "reached with 3 ranks up."
    ) in validate
    assert "- This report also finds hang in its window." in validate
    data = as_dict(report)["validation"]
    (incident,) = data["incidents"]
    assert data["gap"] is None and data["source"] == "the incidents file recovered.json"
    assert (incident["outcome"], incident["job_outcome"]) == ("recovered", "resumed")
    assert incident["time_to_detect_seconds"] == 45
    assert incident["time_to_act_seconds"] == 3
    assert incident["time_to_recover_seconds"] == 210
    assert incident["recovered_by"] == "restart_from_checkpoint"
    assert (incident["escalated"], incident["paged"], incident["diagnosed"]) == (False, False, True)
    assert incident["tried"] == [
        {"rung": 0, "action": "restart_from_checkpoint", "action_id": 41, "state": "succeeded",
         "at": datetime(2026, 12, 3, 3, 0, 48, tzinfo=timezone.utc).timestamp(),
         "verdict": "recovered", "count": 1}
    ]  # fmt: skip

    # Prevent: the hang's settings, each citing this report's facts ...
    timeout = setting(report, "rank_never_joined", "init_process_group(timeout=...)")
    assert timeout.value == "timedelta(seconds=90)"
    assert "the slowest 0.1% of gradient syncs took 9" in timeout.evidence[0]
    dump = setting(report, "rank_never_joined", "TORCH_NCCL_DUMP_ON_TIMEOUT")
    assert dump.value == "1"
    assert dump.evidence == [
        "this hang's Flight Recorder dumps (1 folder(s)) named rank 2 as the rank that never joined"
    ]
    handling = setting(report, "rank_never_joined", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
    assert handling.value == "3"
    assert re.match(r"a collective stayed in flight \d+ s", handling.evidence[0])
    # ... and the checkpoint interval from what the restart of incident 7 cost (no checkpoint
    # event in the logs says how much of it was recomputation: half of it is the bound).
    interval = setting(report, "rank_never_joined", "checkpoint interval")
    assert interval.evidence[0] == (
        "incident 7: the restart from checkpoint took 207 s from the action to training passing "
        "step 4100 again (its step before the failure)"
    )
    assert "at most half of it (104 s) is advised" in interval.evidence[1]
    every = re.fullmatch(r"every (\d+) steps", interval.value)
    step = re.search(r"steps x ([\d.]+) s \(the job's median step time\)", interval.evidence[2])
    assert every and step, interval
    # Half of the 207 s in steps (the step time is printed to 3 digits).
    assert int(every.group(1)) == pytest.approx(103.5 / float(step.group(1)), rel=0.01)
    prevent = section(text, 6)
    assert "- `TORCH_NCCL_ASYNC_ERROR_HANDLING=3` (every rank's environment). Evidence:" in prevent
    assert "- init_process_group(timeout=...): `timedelta(seconds=90)` (the training script)." in (
        prevent
    )
    assert f"- checkpoint interval: `{interval.value}` (the training script). Evidence:" in prevent
    # The candidate's own advice follows the settings, and is not a setting said twice.
    assert "- Keep trainguard's collective watchdog on" in prevent
    assert prevent.count("timedelta(seconds=90)") == 1


def test_a_checkpoint_in_the_logs_splits_the_restart_into_recompute_and_overhead(
    history: History, tmp_path: Path
) -> None:
    log = tmp_path / "rank0.ndjson"
    log.write_text(
        json.dumps(
            {"@timestamp": "2026-12-03T02:50:00Z", "message": "checkpoint of step 4000 saved",
             "event": {"action": "checkpoint"},
             "labels": {"job_id": synthetic.HANG, "rank": "0", "step": "4000"}}
        ) + "\n"
    )  # fmt: skip
    report = diagnose(
        history.url,
        synthetic.HANG,
        until=history.now,
        thresholds=synthetic.SHIPPED,
        logs=[str(log)],
        incidents=load_file(INCIDENTS / "recovered.json"),
    )
    interval = setting(report, "rank_never_joined", "checkpoint interval")
    recompute = re.search(
        r"the last checkpoint was of step 4000: 100 steps \((\d+) s at ([\d.]+) s per step\) were "
        r"computed again; the rest, (\d+) s, is the restart itself",
        interval.evidence[1],
    )
    assert recompute, interval.evidence
    overhead = int(recompute.group(3))
    assert int(recompute.group(1)) + overhead == pytest.approx(207, abs=1)
    step = float(recompute.group(2))
    every = int(interval.value.split()[1])
    # No more recomputation per restart than the restart's own overhead.
    assert every * step <= max(60, overhead) + 1 < (every + 1) * step + 1


def test_an_escalated_and_paged_incident_in_both_renderings(
    history: History, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    code = command(
        history, synthetic.STRAGGLER_RANK, out, "--incidents", str(INCIDENTS / "escalated.json")
    )
    assert code == 1
    assert "incidents not read" not in capsys.readouterr().err
    validate = section((out / "report.md").read_text(), 5)
    assert "### Incident 12: TrainingStraggler on strag-rank rank 5 (straggler): not recovered" in (
        validate
    )
    rungs = [line for line in validate.splitlines() if line.startswith("  - rung ")]
    assert rungs == [
        "  - rung 0: `recommend` (action 50) succeeded at 2026-12-03 04:05:02 UTC; verdict "
        "not_recovered",
        "  - rung 1: `exclude_node` (action 51) failed at 2026-12-03 04:10:02 UTC; verdict "
        "not_recovered",
        # The service lists the actions a guard held back alike on a rung once, with a count.
        "  - rung 1: `exclude_node` (action 61 and 39 more alike) suppressed at 2026-12-03 "
        "04:10:30 UTC; verdict held back: cooldown: exclude_node for strag-rank (28s ago)",
        "  - rung 2: `page` (action 52) succeeded at 2026-12-03 04:15:02 UTC; verdict paged",
    ]
    assert "- Escalated: from rung 0 (`recommend`) to rung 2 (`page`)." in validate
    assert "- Human paged: **yes**." in validate
    assert "- Training did not recover." in validate
    assert (
        "- Outcome: not_recovered; job outcome: lost: training did not pass step 9000, the step "
        "it had reached with 8 ranks up."
    ) in validate
    assert "- Note: exclude_node failed: no spare node" in validate
    assert "Incident 13" not in validate and "Incident 14" not in validate
    notes = (out / "report.md").read_text().split("## Inputs and notes")[1]
    assert "- incident 13 is of job 'other-job', not this one: left out" in notes
    assert "- incident entry 2 left out: 'alert' is not an object" in notes
    data = json.loads((out / "report.json").read_text())["validation"]
    (incident,) = data["incidents"]
    assert incident["id"] == 12
    assert (incident["escalated"], incident["paged"], incident["rung"]) == (True, True, 2)
    assert (incident["outcome"], incident["job_outcome"]) == ("not_recovered", "lost")
    assert incident["recovered_at"] is None and incident["time_to_recover_seconds"] is None
    assert incident["time_to_detect_seconds"] == 300
    assert [(t["action"], t["count"]) for t in incident["tried"]] == [
        ("recommend", 1),
        ("exclude_node", 1),
        ("exclude_node", 40),
        ("page", 1),
    ]
    assert len(data["notes"]) == 2


@pytest.mark.parametrize("count", [0, -3, "40", True])
def test_a_tried_entry_with_a_count_that_is_no_positive_integer_is_named(count: Any) -> None:
    (doc,) = [i for i in load_file(INCIDENTS / "escalated.json") if i.get("id") == 12]
    doc["tried"][-1]["count"] = count
    with pytest.raises(IncidentsError, match="'count' is not"):
        parse(doc)


def test_a_truncated_incidents_file_is_a_named_gap_and_the_report_stands(
    history: History, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    broken = INCIDENTS / "truncated.json"
    code = command(history, synthetic.STRAGGLER_RANK, out, "--incidents", str(broken))
    assert code == 1  # the straggler is still found
    assert f"incidents not read: the incidents file {broken} is not JSON" in (
        capsys.readouterr().err
    )
    text = (out / "report.md").read_text()
    assert f"**Not validated**: the incidents file {broken} is not JSON" in section(text, 5)
    assert "rank 5" in section(text, 2) and "slow_gpu_or_process" in section(text, 6)
    data = json.loads((out / "report.json").read_text())
    assert data["validation"]["gap"].startswith(f"the incidents file {broken} is not JSON")
    assert data["validation"]["incidents"] == []
    assert data["failure"] == Failure.STRAGGLER.value


def test_a_file_that_is_not_an_incidents_document_is_a_gap(
    history: History, tmp_path: Path
) -> None:
    odd = tmp_path / "actions.json"
    odd.write_text('{"actions": []}')
    out = tmp_path / "report"
    assert command(history, synthetic.HEALTHY, out, "--incidents", str(odd)) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["validation"]["gap"] == (
        f'the incidents file {odd} holds no incidents: expected {{"incidents": [...]}}'
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_remediation_service_is_a_named_gap(
    history: History, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    out = tmp_path / "report"
    code = command(history, synthetic.OOM_FRAG, out, "--remediation-url", url)
    assert code == 1
    assert f"incidents not read: the remediation service at {url} is unreachable" in (
        capsys.readouterr().err
    )
    text = (out / "report.md").read_text()
    assert f"**Not validated**: the remediation service at {url} is unreachable" in section(text, 5)
    assert "The rest of this report stands." in section(text, 5)
    data = json.loads((out / "report.json").read_text())
    assert data["failure"] == "oom"
    assert (
        f"remediation incidents: 0 of this job from the remediation service at {url}"
        in (data["inputs"][-1])
    )


@pytest.fixture
def service() -> Iterator[str]:
    """A stand-in for the remediation service's GET /v1/incidents: the escalated document for
    the bearer token, 401 without it."""
    body = (INCIDENTS / "escalated.json").read_bytes()
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if ok else b'{"detail": "unauthorized"}')

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
    assert asked and all(p == f"/v1/incidents?job_id={synthetic.STRAGGLER_RANK}" for p in asked)


def test_incidents_are_fetched_from_the_service_with_its_token(
    history: History, service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    out = tmp_path / "with-file"
    args = ("--remediation-url", service, "--remediation-token-file", str(token_file))
    assert command(history, synthetic.STRAGGLER_RANK, out, *args) == 1
    data = json.loads((out / "report.json").read_text())["validation"]
    assert data["source"] == f"the remediation service at {service}"
    assert [i["id"] for i in data["incidents"]] == [12]
    # The token from the environment, and a wrong one.
    monkeypatch.setenv("TRAINGUARD_REMEDIATION_TOKEN", TOKEN)
    out = tmp_path / "with-env"
    assert command(history, synthetic.STRAGGLER_RANK, out, "--remediation-url", service) == 1
    assert [i["id"] for i in json.loads((out / "report.json").read_text())["validation"][
        "incidents"]] == [12]  # fmt: skip
    monkeypatch.setenv("TRAINGUARD_REMEDIATION_TOKEN", "wrong")
    out = tmp_path / "refused"
    assert command(history, synthetic.STRAGGLER_RANK, out, "--remediation-url", service) == 1
    gap = json.loads((out / "report.json").read_text())["validation"]["gap"]
    assert gap.startswith(f"the remediation service at {service} refused the token (HTTP 401)")


def test_without_incidents_validate_says_how_to_give_them(history: History) -> None:
    report = diagnose(
        history.url, synthetic.HEALTHY, until=history.now, thresholds=synthetic.SHIPPED
    )
    assert report.validation is None
    assert "Not asked: give the remediation service (`--remediation-url`)" in section(
        markdown(report), 5
    )
    assert as_dict(report)["validation"] is None
    assert "Nothing to change: no root cause found." in section(markdown(report), 6)
    # Asked, and there are none.
    report = diagnose(
        history.url,
        synthetic.HEALTHY,
        until=history.now,
        thresholds=synthetic.SHIPPED,
        incidents=[],
    )
    assert "No incident of this job in the caller." in section(markdown(report), 5)
    assert as_dict(report)["validation"]["incidents"] == []


def test_outcomes_are_the_contract_s_values() -> None:
    (incident,) = load_file(INCIDENTS / "recovered.json")
    assert IncidentOutcome(incident["outcome"]) is IncidentOutcome.RECOVERED
    assert JobOutcome(incident["job_outcome"]) is JobOutcome.RESUMED


# --- Prevent ----------------------------------------------------------------------------------
def test_fragmentation_is_prevented_by_expandable_segments_citing_the_free_share(
    history: History, tmp_path: Path
) -> None:
    log = tmp_path / "rank1.log"
    log.write_text(synthetic.OOM_LOG)
    report = diagnose(
        history.url,
        synthetic.OOM_FRAG,
        until=history.now,
        thresholds=synthetic.SHIPPED,
        logs=[str(log)],
    )
    found = setting(report, "memory_fragmentation", "PYTORCH_CUDA_ALLOC_CONF")
    assert found.value == "expandable_segments:True"
    assert found.where == "every rank's environment"
    assert re.fullmatch(r"(4[6-9]|5[0-2])% of the reserved memory held no tensor before the OOM",
                        found.evidence[0])  # fmt: skip
    assert re.fullmatch(r"\d+ allocator retries \(cudaMalloc after emptying the cache\)",
                        found.evidence[1])  # fmt: skip
    assert any(e.startswith("log: CUDA out of memory") for e in found.evidence)
    prevent = section(markdown(report), 6)
    assert "- `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (every rank's environment)." in (
        prevent
    )
    assert prevent.count("expandable_segments") == 1
    (entry,) = as_dict(report)["prevention"]
    assert (entry["cause"], entry["failure"]) == ("memory_fragmentation", "oom")
    assert entry["settings"][0]["name"] == "PYTORCH_CUDA_ALLOC_CONF"
    assert entry["practices"] == [
        "Avoid tensor shapes that change every step (pad variable-length batches to buckets): "
        "each new shape leaves cached blocks no later request fits."
    ]


def test_a_step_that_does_not_fit_gets_a_micro_batch_split_from_peak_and_capacity(
    history: History,
) -> None:
    report = diagnose(
        history.url, synthetic.OOM_NO_FIT, until=history.now, thresholds=synthetic.SHIPPED
    )
    split = setting(report, "does_not_fit", "micro-batch size / gradient accumulation steps")
    # 74 GiB held of 80: under 85% of capacity (68 GiB) takes halving the activations.
    assert split.value == "micro-batch / 2, gradient_accumulation_steps x 2 (global batch kept)"
    assert split.evidence[0].startswith("the step held 74.0 GiB on a 80.0 GiB GPU; 2 micro-batches")
    assert (
        setting(report, "does_not_fit", "activation checkpointing")
        .evidence[0]
        .startswith("74.0 GiB of 80.0 GiB allocated at the failing step")
    )
    assert "micro-batch size / gradient accumulation steps: `micro-batch / 2" in section(
        markdown(report), 6
    )


def test_the_oom_guard_s_own_split_wins_over_the_estimate(history: History, tmp_path: Path) -> None:
    log = tmp_path / "rank1.ndjson"
    log.write_text(
        json.dumps(
            {"message": "step 61 recovered in 4 micro-batches",
             "event": {"action": "oom_recovered"},
             "labels": {"job_id": synthetic.OOM_NO_FIT, "rank": "1"},
             "trainguard": {"micro_batches": 4}}
        ) + "\n"
    )  # fmt: skip
    report = diagnose(
        history.url,
        synthetic.OOM_NO_FIT,
        until=history.now,
        thresholds=synthetic.SHIPPED,
        logs=[str(log)],
    )
    split = setting(report, "does_not_fit", "micro-batch size / gradient accumulation steps")
    assert split.value == "micro-batch / 4, gradient_accumulation_steps x 4 (global batch kept)"
    assert split.evidence == [
        "trainguard's OOM guard recovered the step in 4 micro-batches (1 oom_recovered event(s))"
    ]


def test_a_data_bound_job_gets_loader_workers_scaled_by_its_data_wait(history: History) -> None:
    report = diagnose(
        history.url, synthetic.DATA_BOUND, until=history.now, thresholds=synthetic.SHIPPED
    )
    loader = setting(report, "data_loading", "DataLoader(...)")
    # 0.3 s of data wait in a 0.6 s step whose other work is 0.3 s: twice as fast.
    assert loader.value == (
        "num_workers x 2 at least, prefetch_factor=4, pin_memory=True, persistent_workers=True"
    )
    assert loader.evidence == [
        "ranks 0, 1 waited 0.300 s for data in a 0.600 s step whose other work takes 0.300 s: "
        "the loader must deliver 2.00x as fast"
    ]


def test_a_throttled_node_gets_an_elastic_minimum_and_a_health_check(history: History) -> None:
    report = diagnose(
        history.url, synthetic.THERMAL, until=history.now, thresholds=synthetic.SHIPPED
    )
    elastic = setting(report, "gpu_throttling", "torchrun --nnodes")
    assert elastic.value == "2:3"
    assert "on th-b; the job ran on 3 node(s)" in elastic.evidence[0]
    check = setting(report, "gpu_throttling", "GPU health check")
    assert "fail on clocks-event reasons hw_thermal_slowdown" in check.value
    assert "GPU temperature up to 91 C" in check.evidence
    assert any("reason=hw_thermal_slowdown" in e for e in check.evidence)
    (entry,) = [p for p in report.prevention if p.cause == "gpu_throttling"]
    assert entry.failure is Failure.GPU_THROTTLING
    assert any("cooling" in p for p in entry.practices)
