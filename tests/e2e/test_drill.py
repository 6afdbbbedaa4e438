"""The fault drill: a shortened ``make demo`` on the real Prometheus and Alertmanager.

A straggler, a hang and an OOM are injected into a 2-node x 2-rank torchrun elastic job; each
must be alerted on by Prometheus, delivered by Alertmanager to the remediation service, acted
on, and training must finish at its final step. Then: the hang's Flight Recorder dumps name
the rank that never joined, exemplars lead to exported spans that hold every rank's sync of
that step in one trace, every dashboard query has data, and ``build/drill-report.json`` holds
the detection, action and recovery latencies (printed against the targets).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainguard import contract
from trainguard.demo.config import DEMO_JOB_ID, DemoConfig, Ports
from trainguard.demo.run import TARGETS, DemoResult, run_demo
from trainguard.demo.stack import SCRAPE_SECONDS
from trainguard.diagnose import flight_recorder as fr_analyzer
from trainguard.instrumentation import tracing, worker

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PLAN = "straggler:rank=2,at=15s,factor=1.5;hang:rank=1,at=45s;oom:rank=0,at=70s"
STEPS = 650
# Panels whose series only exist on hardware this machine does not have (a real NVIDIA GPU's
# Xid/ECC/NVLink/throttling, NVML's own health, NCCL's own logs): the simulated exporter cannot
# make them (it reads no NVML, so it exports no trainguard_nvml_up).
NEEDS_REAL_HARDWARE = re.compile(
    r"xid|ecc|nvlink|remapped|pcie|clock_throttled|nvml_up|nccl_|DCGM_|energy"
)


def _free_ports() -> Ports:
    chosen: list[int] = []
    for _ in vars(Ports()):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            chosen.append(sock.getsockname()[1])
    return Ports(*chosen)


def _binaries_or_skip() -> None:
    missing = [b for b in ("prometheus", "prometheus-alertmanager") if not shutil.which(b)]
    if missing and os.environ.get("TRAINGUARD_REQUIRE_BINARIES") != "1":
        pytest.skip(f"needs {', '.join(missing)} (Debian packages)")


def _panel_queries() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted((REPO / "trainguard" / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())

        def walk(panel: dict[str, Any], name: str = path.stem) -> None:
            for target in panel.get("targets", []):
                if "expr" in target:
                    found.append((name, str(panel.get("title", "")), target["expr"]))
            for child in panel.get("panels", []):
                walk(child)

        for panel in dashboard.get("panels", []):
            walk(panel)
    return found


def _substitute(expr: str) -> str:
    values = {"job_id": DEMO_JOB_ID, "__rate_interval": "30s", "__interval": "10s"}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), ".*"), expr)


def _inspect(cfg: DemoConfig, result: DemoResult, findings: dict[str, Any]) -> None:
    prometheus = httpx.Client(base_url=cfg.url("prometheus"), timeout=10)
    start = min(e["t"] for e in result.events)
    end = time.time()
    empty = []
    for dashboard, title, expr in _panel_queries():
        response = prometheus.get(
            "/api/v1/query_range",
            params={"query": _substitute(expr), "start": start, "end": end, "step": 5},
        )
        assert response.status_code == 200, (dashboard, title, expr, response.text)
        if not response.json()["data"]["result"]:
            empty.append((dashboard, title, expr))
    findings["empty_panels"] = empty
    # Which ranks TrainingRankDown fired for, over the whole run.
    fired = prometheus.get(
        "/api/v1/query",
        params={
            "query": f'max_over_time(ALERTS{{alertname="{contract.Alert.TRAINING_RANK_DOWN.value}",'
            f'alertstate="firing"}}[{int(end - start) + 60}s])',
            "time": end,
        },
    ).json()["data"]["result"]
    findings["rank_down"] = sorted(int(series["metric"][contract.LABEL_RANK]) for series in fired)
    exemplars = prometheus.get(
        "/api/v1/query_exemplars",
        params={
            "query": f'{contract.GRAD_SYNC_DURATION.name}_bucket{{job_id="{DEMO_JOB_ID}"}}',
            "start": start,
            "end": end,
        },
    ).json()["data"]
    findings["exemplar_trace_ids"] = {
        e["labels"][contract.EXEMPLAR_TRACE_ID] for series in exemplars for e in series["exemplars"]
    }
    # The service attached a diagnose report to every action it carried out.
    service = httpx.Client(
        base_url=cfg.url("remediation"),
        headers={"Authorization": f"Bearer {cfg.token_file.read_text().strip()}"},
        timeout=10,
    )
    reports: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 60  # each diagnosis runs on the service's own thread
    for action in (a for a in result.actions if a["state"] in ("succeeded", "failed")):
        while (answer := service.get(f"/v1/actions/{action['id']}/report")).status_code == 404:
            assert time.monotonic() < deadline, f"no report for action {action['id']}"
            time.sleep(0.5)
        reports[action["action"]] = answer.json()
    findings["action_reports"] = reports


def _spans(cfg: DemoConfig) -> list[dict[str, Any]]:
    spans = []
    for path in cfg.spans_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                spans.append(json.loads(line))
    return spans


def _steps_cut_by_restarts(events: list[dict[str, Any]], margin: int = 5) -> set[int]:
    """Steps whose spans a worker restart may have cut off.

    A worker killed by its agent loses the spans it had not yet exported: those of the last
    export interval, plus the worker thread's wake-up. Cut every step logged within that window
    (and a second of slack for the kill itself) before the last step logged ahead of each restart,
    and ``margin`` steps either side of it (the ones re-run after resuming from a checkpoint)."""
    window_s = tracing.EXPORT_INTERVAL_SECONDS + worker.WAKE_SECONDS + 1.0
    steps = [e for e in events if e["event"] == "step"]
    cut: set[int] = set()
    last: dict[str, Any] | None = None
    for event in events:
        if event["event"] == "step":
            last = event
        elif event["event"] == "start" and event["restart"] > 0 and last is not None:
            cut.update(range(last["step"] - margin, last["step"] + margin + 1))
            cut.update(s["step"] for s in steps if last["t"] - window_s <= s["t"] <= last["t"])
    return cut


def test_the_drill(tmp_path: Path) -> None:
    _binaries_or_skip()
    # Compute is a sleep (the demo's default, no matmul share): the report's factor is held to
    # the injected one within 10%, which real arithmetic on shared cores does not keep (a
    # straggler's extra matmuls run while its peers wait, on freer cores: a 1.5x straggler
    # measured 1.28x with two busy loops beside the suite).
    cfg = DemoConfig(workdir=tmp_path / "drill", ports=_free_ports(), steps=STEPS, faults=PLAN)
    assert cfg.compute_share == 0.0
    cfg.workdir.mkdir()
    findings: dict[str, Any] = {}
    result = run_demo(cfg, timeout_s=330, inspect=lambda c, r: _inspect(c, r, findings))
    report = result.drill_report()
    build = REPO / "build"
    build.mkdir(exist_ok=True)
    (build / "drill-report.json").write_text(json.dumps(report, indent=2))
    for fault, outcome in result.outcomes.items():
        print(
            f"{fault}: detection {outcome.detection_s} s, action {outcome.action_s} s, "
            f"MTTR {outcome.recovered_s} s, verified {outcome.verified_recovery_s} s, "
            f"outcome {outcome.outcome}, rung {outcome.rung}"
        )
    print(f"targets: {TARGETS}")

    # Every fault detected, acted on, recovered from; training reached its last step.
    assert result.finished and result.final_step == STEPS, result.events[-3:]
    assert set(result.outcomes) == {"straggler", "hang", "oom"}
    for fault, outcome in result.outcomes.items():
        assert outcome.action is not None and outcome.action["state"] == "succeeded", fault
        # Generous limits: the targets (README) are met by configuration, not asserted here.
        assert outcome.detection_s is not None and outcome.detection_s < 120, fault
        assert outcome.action_s is not None and outcome.action_s < 60, fault
        assert outcome.recovered_s is not None and outcome.recovered_s < 240, fault
    # The service verified every repair: each fault's incident ended recovered, on the first rung
    # of its ladder, and the run's success rate is 100%.
    for fault, outcome in result.outcomes.items():
        assert outcome.outcome == "recovered" and outcome.rung == 0, (fault, outcome.incident)
        incident = outcome.incident
        assert incident is not None and not incident["paged"], fault
        times = ("detected_at", "acted_at", "recovered_at")
        detected, acted, recovered = (datetime.fromisoformat(incident[key]) for key in times)
        assert detected <= acted <= recovered, (fault, incident)
    reliability = result.drill_report()["reliability"]
    assert reliability["success_rate"] == 1.0 and reliability["open"] == 0, reliability
    # The excluded node's ranks (2 and 3) were removed on purpose: no TrainingRankDown for them.
    assert not {2, 3} & set(findings["rank_down"]), findings["rank_down"]
    excluded = result.outcomes["straggler"].action
    assert excluded is not None and excluded["subject"] == DEMO_JOB_ID
    assert excluded["alert"]["labels"][contract.LABEL_NODE] == "node-b"
    # The ranks said where the job runs (rank_info); the rules put it on the alert, and the
    # service acted through that scheduler's executor.
    assert excluded["alert"]["labels"][contract.LABEL_SCHEDULER] == contract.SCHEDULER_LOCAL
    assert excluded["executor"] == contract.SCHEDULER_LOCAL
    # The repairs took: node-b's agent left and node-a trained on at world size 2, started
    # twice (after the exclusion and after the hang's restart; rank 0 writes the events), each
    # time from a checkpoint rather than from step 0.
    starts = [e for e in result.events if e["event"] == "start"]
    on_two = [e for e in starts if e["world"] == 2]
    assert len(on_two) >= 2, starts
    assert all(e["node"] == "node-a" and e["resumed_from"] > 0 for e in on_two), starts
    assert all(e["world"] == 2 for e in result.events if e["event"] == "finish")

    # The hang's dumps: torch's analyzer names the rank that never joined.
    (stall,) = sorted((cfg.dumps / DEMO_JOB_ID).glob("stall-*"))
    mismatches = fr_analyzer.analyze(stall)
    assert set().union(*(m.missing_ranks for m in mismatches)) == {1}

    # Trace drill-down: exemplars are trace ids of exported spans, each holding the sync of
    # every rank of that step. Workers killed by a restart lose the spans of their last steps
    # (SIGTERM ends them before the export), so steps just before a restart are left out.
    spans = _spans(cfg)
    syncs: dict[str, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    steps_of: dict[str, int] = {}
    for span in spans:
        if span["name"] == contract.SPAN_GRAD_SYNC:
            trace_id = span["context"]["trace_id"].removeprefix("0x")
            attributes = span["attributes"]
            world = attributes[contract.ATTR_WORLD_SIZE]
            syncs[trace_id][world].add(attributes[contract.ATTR_RANK])
            steps_of[trace_id] = attributes[contract.ATTR_STEP]
    exemplar_ids = findings["exemplar_trace_ids"]
    assert exemplar_ids, "Prometheus stored grad-sync exemplars"
    assert exemplar_ids <= set(syncs), "every exemplar is the trace of an exported sync"
    cut = _steps_cut_by_restarts(result.events)
    checked = [t for t in exemplar_ids if steps_of[t] not in cut]
    assert len(checked) >= 10, (len(exemplar_ids), sorted(cut))
    for trace_id in checked:
        assert any(ranks == set(range(world)) for world, ranks in syncs[trace_id].items()), (
            trace_id,
            steps_of[trace_id],
            dict(syncs[trace_id]),
        )

    # The incident report (trainguard diagnose) found all three failures and drew its charts.
    incident = json.loads((cfg.workdir / "incident" / "report.json").read_text())
    failures = {symptom["failure"] for symptom in incident["symptoms"]}
    assert {"straggler", "hang", "oom"} <= failures, incident["symptoms"]
    # Each symptom is pinned on the rank (and node) the plan injected it into ...
    symptoms = {symptom["failure"]: symptom for symptom in incident["symptoms"]}
    assert (symptoms["straggler"]["ranks"], symptoms["straggler"]["nodes"]) == ([2], ["node-b"])
    assert symptoms["hang"]["ranks"] == [1]
    assert symptoms["oom"]["ranks"] == [0]
    # ... and the causes name it too, each with something to do now and next time.
    causes = {candidate["cause"]: candidate for candidate in incident["candidates"]}
    assert causes["rank_never_joined"]["facts"]["suspect_ranks"] == [1]
    assert causes["rank_never_joined"]["facts"]["recommended_timeout_seconds"] >= 60
    assert causes["slow_gpu_or_process"]["summary"].startswith("Rank 2 "), causes
    # Each symptom is dated by its first evidence, within a scrape interval of the fault's
    # injection, and the straggler measured at the factor injected (PLAN: 1.5x), within 10%.
    # The first evidence is the first scrape after the first faulty step ended: a step of the
    # straggler (1.5x the demo's step) can end just after a scrape, the next 2 s later.
    first_step = 1.5 * DemoConfig.step_seconds
    for fault, outcome in result.outcomes.items():
        since = symptoms[fault]["since"]
        late = SCRAPE_SECONDS + first_step
        assert -SCRAPE_SECONDS <= since - outcome.injected_at <= late, (fault, since, outcome)
    assert causes["slow_gpu_or_process"]["facts"]["ratio"] == pytest.approx(1.5, rel=0.1)
    oom_causes = [c for c in incident["candidates"] if "oom_time" in c["facts"]]
    assert oom_causes and all(c["facts"]["rank"] == 0 for c in oom_causes), causes
    assert all(c["do_now"] and c["prevention"] for c in incident["candidates"]), causes
    charts = incident["charts"]
    assert len(charts) >= 3
    for chart in charts:
        png = cfg.workdir / "incident" / chart["path"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart

    # Every action carries its diagnosis; the one for the hang names the rank that never joined.
    reports = findings["action_reports"]
    assert {"exclude_node", "restart_from_checkpoint", "split_micro_batches"} <= set(reports)
    assert all(r["error"] is None and r["job_id"] == DEMO_JOB_ID for r in reports.values())
    restart = reports["restart_from_checkpoint"]["report"]
    assert "hang" in {s["failure"] for s in restart["symptoms"]}, restart["symptoms"]

    # Every dashboard query has data, except series only real GPUs/NCCL produce.
    missing = [p for p in findings["empty_panels"] if not NEEDS_REAL_HARDWARE.search(p[2])]
    assert not missing, "\n".join(f"{d} / {t}: {e}" for d, t, e in missing)
