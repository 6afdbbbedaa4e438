"""``trainguard demo``: the detect -> alert -> remediate loop on one machine, no Docker.

Starts the stack (:mod:`.stack`), runs the fault-injecting job as two torchrun elastic nodes,
shows a live view (steps/s, per-rank step time, alerts firing, actions taken, the service's
success rate and MTTR), and at the end measures each fault's detection latency, action latency
and time to recovery, waits for the service to verify each repair (the incident's outcome and
the rung of its ladder it reached), writes the incident report and prints where everything is.
Ctrl-C stops every process it started.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from trainguard import contract
from trainguard.demo.config import DEMO_JOB_ID, DemoConfig
from trainguard.demo.faults import FaultKind, FaultLedger
from trainguard.demo.faults.hang import HANG
from trainguard.demo.faults.oom import OOM
from trainguard.demo.faults.straggler import STRAGGLER
from trainguard.demo.stack import (
    SCRAPE_SECONDS,
    SIMULATED_GPUS,
    Stack,
    demo_thresholds,
    ensure_binaries,
)

# What each fault should set off: the alert, then the action that repairs it.
EXPECTED: dict[FaultKind, tuple[contract.Alert, contract.Action]] = {
    STRAGGLER: (contract.Alert.TRAINING_STRAGGLER, contract.Action.EXCLUDE_NODE),
    HANG: (contract.Alert.TRAINING_COLLECTIVE_STALLED, contract.Action.RESTART_FROM_CHECKPOINT),
    OOM: (contract.Alert.TRAINING_OOM, contract.Action.SPLIT_MICRO_BATCHES),
}
TARGETS = {"hang_detection_s": 30.0, "straggler_detection_s": 60.0, "mttr_s": 120.0}
# After training ends, how long the demo waits for the service to close every incident (the
# last fault's alert resolves, and the verifier sees it, some seconds after the repair).
VERIFY_WAIT_SECONDS = 90.0
CLOSED = "closed"


@dataclass
class FaultOutcome:
    """What happened to one injected fault, in seconds from its injection."""

    fault: str
    injected_at: float
    alert_received_s: float | None = None
    action_done_s: float | None = None
    recovered_s: float | None = None
    action: dict[str, Any] | None = None
    incident: dict[str, Any] | None = None  # the service's verdict on the repair

    @property
    def detection_s(self) -> float | None:
        return self.alert_received_s

    @property
    def outcome(self) -> str | None:
        """recovered / not_recovered / worse as the service verified it; None while open."""
        return None if self.incident is None else self.incident.get("outcome")

    @property
    def rung(self) -> int | None:
        return None if self.incident is None else int(self.incident["rung"])

    @property
    def verified_recovery_s(self) -> float | None:
        """From injection to the service's verified recovery (alert resolved, steps past)."""
        return self._since_injection("recovered_at")

    @property
    def acted_s(self) -> float | None:
        return self._since_injection("acted_at")

    def _since_injection(self, key: str) -> float | None:
        moment = None if self.incident is None else self.incident.get(key)
        return None if moment is None else _timestamp(moment) - self.injected_at

    @property
    def action_s(self) -> float | None:
        if self.alert_received_s is None or self.action_done_s is None:
            return None
        return self.action_done_s - self.alert_received_s


@dataclass
class DemoResult:
    finished: bool
    final_step: int | None
    outcomes: dict[str, FaultOutcome] = field(default_factory=dict)
    actions: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    incidents: list[dict[str, Any]] = field(default_factory=list)

    def drill_report(self) -> dict[str, Any]:
        return {
            "detection_s": {k: o.detection_s for k, o in self.outcomes.items()},
            "action_s": {k: o.action_s for k, o in self.outcomes.items()},
            "mttr_s": {k: o.recovered_s for k, o in self.outcomes.items()},
            "acted_s": {k: o.acted_s for k, o in self.outcomes.items()},
            "verified_recovery_s": {k: o.verified_recovery_s for k, o in self.outcomes.items()},
            "outcome": {k: o.outcome for k, o in self.outcomes.items()},
            "rung": {k: o.rung for k, o in self.outcomes.items()},
            "reliability": Reliability.of(self.incidents).as_dict(),
        }


@dataclass(frozen=True)
class Reliability:
    """The numbers a team's reliability report leads with, over the service's incidents."""

    closed: int
    recovered: int
    open: int
    mttr_s: float | None  # mean of detected -> verified recovery, over recovered incidents

    @property
    def success_rate(self) -> float | None:
        return None if not self.closed else self.recovered / self.closed

    @classmethod
    def of(cls, incidents: list[dict[str, Any]]) -> Reliability:
        closed = [i for i in incidents if i.get("state") == CLOSED]
        recovered = [i for i in closed if i.get("outcome") == "recovered" and i["recovered_at"]]
        times = [_timestamp(i["recovered_at"]) - _timestamp(i["detected_at"]) for i in recovered]
        return cls(
            closed=len(closed),
            recovered=len(recovered),
            open=len(incidents) - len(closed),
            mttr_s=sum(times) / len(times) if times else None,
        )

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "closed": self.closed,
            "recovered": self.recovered,
            "open": self.open,
            "success_rate": self.success_rate,
            "mttr_s": self.mttr_s,
        }

    def line(self) -> str:
        rate = "-" if self.success_rate is None else f"{100 * self.success_rate:.0f}%"
        return (
            f"incidents: {self.closed} closed ({self.recovered} recovered), {self.open} open | "
            f"success rate {rate} | MTTR {_fmt(self.mttr_s)} s"
        )


def read_events(cfg: DemoConfig) -> list[dict[str, Any]]:
    path = cfg.checkpoint_dir / "events.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written while we read
    return events


def _timestamp(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def fetch_actions(cfg: DemoConfig) -> list[dict[str, Any]]:
    token = cfg.token_file.read_text().strip()
    response = httpx.get(
        f"{cfg.url('remediation')}/v1/actions",
        params={"limit": 500},
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )
    response.raise_for_status()
    actions: list[dict[str, Any]] = response.json()["actions"]
    return actions


def fetch_incidents(cfg: DemoConfig, job_id: str = DEMO_JOB_ID) -> list[dict[str, Any]]:
    """The service's incidents of the demo's job, or ``job_id`` (its verdict on each repair)."""
    token = cfg.token_file.read_text().strip()
    response = httpx.get(
        f"{cfg.url('remediation')}/v1/incidents",
        params={"job_id": job_id, "limit": 100},
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )
    response.raise_for_status()
    incidents: list[dict[str, Any]] = response.json()["incidents"]
    return incidents


def incident_of(
    kind: FaultKind, injected_at: float, incidents: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The first incident of this fault's failure detected after its injection."""
    later = [
        i
        for i in incidents
        if i.get("failure") == kind.failure.value and _timestamp(i["detected_at"]) >= injected_at
    ]
    return min(later, key=lambda i: _timestamp(i["detected_at"]), default=None)


def outcomes(
    cfg: DemoConfig,
    actions: list[dict[str, Any]],
    events: list[dict[str, Any]],
    incidents: list[dict[str, Any]] | None = None,
) -> dict[str, FaultOutcome]:
    """Match each injected fault to its alert, its action and the training's recovery."""
    ledger = FaultLedger(cfg.checkpoint_dir)
    steps = [e for e in events if e.get("event") == "step"]
    result = {}
    for kind, (alert, repair) in EXPECTED.items():
        fired = ledger.fired(kind)
        if fired is None:
            continue
        outcome = FaultOutcome(kind.name, fired.at)
        outcome.incident = incident_of(kind, fired.at, incidents or [])
        matching = sorted(
            (
                a
                for a in actions
                if a["alert"]["name"] == alert.value
                and a["action"] == repair.value
                and _timestamp(a["alert"]["received_at"]) >= fired.at
            ),
            key=lambda a: a["created_at"],
        )
        resume_after = fired.at
        if matching:
            action = outcome.action = matching[0]
            outcome.alert_received_s = _timestamp(action["alert"]["received_at"]) - fired.at
            done = [t for t in action["transitions"] if t["state"] == "succeeded"]
            if done:
                done_at = _timestamp(done[0]["at"])
                outcome.action_done_s = done_at - fired.at
                if kind is not OOM:
                    # Recovery is training progressing again after the repair restarted it;
                    # an OOM is recovered in place by guarded_step.
                    resume_after = done_at
        if kind is OOM or outcome.action_done_s is not None:
            later = [e["t"] for e in steps if e["t"] > resume_after]
            if later:
                outcome.recovered_s = min(later) - fired.at
        result[kind.name] = outcome
    return result


class LiveView:
    """A few lines every few seconds: what a person watching the demo wants to see."""

    def __init__(self, cfg: DemoConfig) -> None:
        self.cfg = cfg
        self.prometheus = httpx.Client(base_url=cfg.url("prometheus"), timeout=3)
        self.started = time.monotonic()
        self.seen_actions: set[int] = set()

    def _query(self, expr: str) -> list[dict[str, Any]]:
        try:
            data = self.prometheus.get("/api/v1/query", params={"query": expr}).json()
        except (httpx.HTTPError, ValueError):
            return []
        result: list[dict[str, Any]] = data.get("data", {}).get("result", [])
        return result

    def show(self) -> None:
        job = f'{contract.LABEL_JOB_ID}="{DEMO_JOB_ID}"'
        steps = self._query(f"max(rate({contract.STEPS.name}{{{job}}}[10s]))")
        compute = contract.STEP_COMPUTE_DURATION.name
        per_rank = self._query(
            f"sum by (rank, node) (rate({compute}_sum{{{job}}}[10s]))"
            f" / sum by (rank, node) (rate({compute}_count{{{job}}}[10s]))"
        )
        alerts = self._query('ALERTS{alertstate="firing"}')
        elapsed = time.monotonic() - self.started
        rate = float(steps[0]["value"][1]) if steps else 0.0
        ranks = "  ".join(
            f"r{m.get('rank')}@{m.get('node')} {1000 * float(v):.0f}ms"
            for m, (_, v) in sorted(
                ((s["metric"], s["value"]) for s in per_rank),
                key=lambda pair: int(pair[0].get("rank", 0)),
            )
            if v not in ("NaN", "+Inf")
        )
        firing = ", ".join(sorted({a["metric"]["alertname"] for a in alerts})) or "none"
        print(f"[{elapsed:5.0f}s] {rate:5.1f} steps/s | compute/step {ranks or '-'}", flush=True)
        print(f"         alerts firing: {firing}", flush=True)
        try:
            actions = fetch_actions(self.cfg)
            incidents = fetch_incidents(self.cfg)
        except (httpx.HTTPError, OSError):
            return
        if incidents:
            print(f"         {Reliability.of(incidents).line()}", flush=True)
        for action in sorted(actions, key=lambda a: a["id"]):
            if action["id"] not in self.seen_actions and action["state"] in (
                "succeeded",
                "failed",
            ):
                self.seen_actions.add(action["id"])
                print(
                    f"         action {action['action']} ({action['alert']['name']}, "
                    f"{action['subject']}): {action['state']}",
                    flush=True,
                )


def run_demo(
    cfg: DemoConfig,
    timeout_s: float,
    keep_running: bool = False,
    inspect: Callable[[DemoConfig, DemoResult], None] | None = None,
) -> DemoResult:
    """Run the whole demo; returns what happened. Every process is stopped before returning
    unless ``keep_running`` (then Ctrl-C stops them). ``inspect`` runs while the stack is still
    up (the drill queries Prometheus there)."""
    ensure_binaries()
    with Stack(cfg) as stack:
        stack.start_services()
        wait_ready(cfg)
        print_urls(cfg, stack.gpus)
        agents = stack.start_training()
        view = LiveView(cfg)
        deadline = time.monotonic() + timeout_s
        finished = False
        while time.monotonic() < deadline:
            time.sleep(3)
            view.show()
            failed = stack.failed_services()
            if failed:
                raise RuntimeError(f"{', '.join(failed)} stopped; see {cfg.logs}")
            finish = [e for e in read_events(cfg) if e.get("event") == "finish"]
            if finish and not any(stack.alive(agent) for agent in agents):
                finished = True
                break
        time.sleep(2)  # let the last scrape and evaluation land
        incidents = wait_for_verdicts(cfg, view)
        events = read_events(cfg)
        actions = fetch_actions(cfg)
        finishes = [e for e in events if e.get("event") == "finish"]
        result = DemoResult(
            finished=finished,
            final_step=finishes[-1]["step"] if finishes else None,
            outcomes=outcomes(cfg, actions, events, incidents),
            actions=actions,
            events=events,
            incidents=incidents,
        )
        write_incident_report(cfg, result)
        write_summary(cfg, result)
        if inspect is not None:
            inspect(cfg, result)
        if keep_running:
            print_where(cfg, result)
            print_urls(cfg, stack.gpus)
            print("the stack stays up; Ctrl-C stops it", flush=True)
            signal.pause()
    return result


def wait_for_verdicts(
    cfg: DemoConfig, view: LiveView, timeout_s: float = VERIFY_WAIT_SECONDS
) -> list[dict[str, Any]]:
    """Wait until the service has closed every incident of the job (or ``timeout_s``), showing
    the live view meanwhile; returns the incidents as they then stand."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            incidents = fetch_incidents(cfg)
        except (httpx.HTTPError, OSError) as error:
            print(f"no incidents from the remediation service: {error}", flush=True)
            return []
        waiting = [i for i in incidents if i.get("state") != CLOSED]
        if not waiting or time.monotonic() >= deadline:
            return incidents
        print(f"waiting for the service to verify {len(waiting)} repair(s) ...", flush=True)
        time.sleep(3)
        view.show()


def wait_ready(cfg: DemoConfig, timeout_s: float = 60.0) -> None:
    checks = {
        "remediation": f"{cfg.url('remediation')}/readyz",
        "prometheus": f"{cfg.url('prometheus')}/-/ready",
        "alertmanager": f"{cfg.url('alertmanager')}/-/ready",
        "exporter": f"{cfg.url('exporter')}/metrics",
    }
    deadline = time.monotonic() + timeout_s
    pending = dict(checks)
    while pending and time.monotonic() < deadline:
        for name, url in list(pending.items()):
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    del pending[name]
            except httpx.HTTPError:
                continue
        time.sleep(0.5)
    if pending:
        raise RuntimeError(f"{', '.join(pending)} did not become ready; see {cfg.logs}")


def write_incident_report(cfg: DemoConfig, result: DemoResult) -> Path | None:
    """``trainguard diagnose`` over the run: Markdown + JSON + PNG charts in ``incident/``."""
    from trainguard.diagnose import NoDataError, PrometheusError, diagnose
    from trainguard.diagnose.render import as_json, markdown

    out = cfg.workdir / "incident"
    started = min((e["t"] for e in result.events), default=time.time() - 600)
    try:
        report = diagnose(
            cfg.url("prometheus"),
            DEMO_JOB_ID,
            since_seconds=time.time() - started + 30,
            dumps=cfg.dumps,
            logs=[str(p) for p in sorted((cfg.logs / "training").glob("*.ndjson"))],
            charts_dir=out / "charts",
            # The demo's faults last seconds, not the minutes a real job's alerts wait for.
            sustain_seconds=10.0,
            min_step_seconds=SCRAPE_SECONDS,
            thresholds=demo_thresholds(),
        )
    except (PrometheusError, NoDataError) as error:
        print(f"no incident report: {error}", flush=True)
        return None
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(as_json(report))
    path = out / "report.md"
    path.write_text(markdown(report, relative_to=out))
    return path


def write_summary(cfg: DemoConfig, result: DemoResult) -> Path:
    """The drill report (JSON) and the incident summary (Markdown) in the work folder."""
    (cfg.workdir / "drill-report.json").write_text(json.dumps(result.drill_report(), indent=2))
    lines = [
        "# trainguard demo: incident summary",
        "",
        f"Training {'finished' if result.finished else 'did NOT finish'} at step "
        f"{result.final_step}.",
        "",
        "Seconds from each fault's injection: the alert reached the service (detected), the "
        "repair was carried out (acted), training stepped again, and the service verified the "
        "recovery (a state alert resolved, or no new event since the repair for an event alert "
        "such as the OOM's; and the steps passed the one reached before and kept rising).",
        "",
        "| fault | detected | action | acted | training again | verified | outcome | rung |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, outcome in result.outcomes.items():
        action = outcome.action["action"] if outcome.action else "none"
        lines.append(
            f"| {name} | {_fmt(outcome.detection_s)} | {action} | {_fmt(outcome.acted_s)} | "
            f"{_fmt(outcome.recovered_s)} | {_fmt(outcome.verified_recovery_s)} | "
            f"{outcome.outcome or 'open'} | {'-' if outcome.rung is None else outcome.rung} |"
        )
    lines += [
        "",
        Reliability.of(result.incidents).line(),
        "",
        "The incident report (`trainguard diagnose`, with charts): `incident/report.md`.",
        "",
        "Actions taken by the remediation service:",
        "",
    ]
    for action in sorted(result.actions, key=lambda a: a["id"]):
        lines.append(
            f"- {action['created_at']} {action['action']} for {action['alert']['name']} "
            f"({action['subject']}): {action['state']}"
        )
    path = cfg.workdir / "incident-summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_urls(cfg: DemoConfig, gpus: int) -> None:
    """Where each running service answers (the stack is up while these are printed)."""
    provider = f"{gpus} GPUs through NVML" if gpus else f"{SIMULATED_GPUS} simulated GPUs"
    lines = {
        "Prometheus": f"{cfg.url('prometheus')} (alerts: /alerts, exemplars: /graph)",
        "Alertmanager": cfg.url("alertmanager"),
        "remediation": f"{cfg.url('remediation')}/v1/actions (audit trail; API docs: /docs)",
        "exporter": f"{cfg.url('exporter')}/metrics ({provider})",
        "ranks' /metrics": f"from port {cfg.ports.metrics} (targets listed in {cfg.file_sd})",
    }
    for name, where in lines.items():
        print(f"{name + ':':<18} {where}", flush=True)


def print_where(cfg: DemoConfig, result: DemoResult) -> None:
    print("", flush=True)
    print((cfg.workdir / "incident-summary.md").read_text(), flush=True)
    for name, outcome in result.outcomes.items():
        print(
            f"{name}: detection {_fmt(outcome.detection_s)} s, action {_fmt(outcome.action_s)} s,"
            f" MTTR {_fmt(outcome.recovered_s)} s, verified {_fmt(outcome.verified_recovery_s)}"
            f" s, outcome {outcome.outcome or 'open'}, rung {outcome.rung}",
            flush=True,
        )
    print(Reliability.of(result.incidents).line(), flush=True)
    print(
        f"targets: stalled-collective alert <= {TARGETS['hang_detection_s']:.0f} s, straggler "
        f"alert <= {TARGETS['straggler_detection_s']:.0f} s, MTTR <= {TARGETS['mttr_s']:.0f} s",
        flush=True,
    )
    print(f"work folder:       {cfg.workdir}", flush=True)
    print(f"logs:              {cfg.logs} (ECS JSON of the ranks in {cfg.logs / 'training'})")
    print(f"Flight Recorder:   {cfg.dumps}", flush=True)
    print(f"spans (JSON):      {cfg.spans_dir}", flush=True)
    print(f"drill report:      {cfg.workdir / 'drill-report.json'}", flush=True)
    print(f"incident report:   {cfg.workdir / 'incident' / 'report.md'}", flush=True)
