"""Stand-ins for the verifier's outside world: Prometheus' answers, Alertmanager's alert API.

:class:`FakePrometheus` is the verifier's :class:`~trainguard.remediation.prometheus.Query`,
injected through ``create_app(prometheus=...)``: it answers the few queries the verifier makes
from values a test sets, before and after the failure's detection. :class:`AlertmanagerStub` is a
loopback HTTP server that follows Alertmanager's ``POST /api/v2/alerts`` contract (a JSON array
of postable alerts; 200 when valid, 400 naming the problem) and keeps what it accepted.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from trainguard import contract
from trainguard.remediation.prometheus import Sample
from trainguard.remediation.settings import Settings

# When the test alerts start (conftest.alert's default startsAt).
DETECTED_AT = datetime.fromisoformat("2026-01-01T00:00:00+00:00").timestamp()
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class FakePrometheus:
    """Answers as Prometheus would for one job: its step and ranks up before and after the
    detection, which alerts it has firing, when the first alert went pending, the events its
    counters counted since a moment (``events``: counter name -> [(when, how many)]), its
    restart count, and whether its ranks' targets are still listed (``listed``; False: every
    rank withdrew, ``down_at_last_scrape`` naming the nodes whose last scrape failed)."""

    baseline_step: float | None = 100.0
    step: float | None = 100.0
    baseline_ranks: dict[str, int] = field(default_factory=lambda: {"n1": 2, "n2": 2})
    ranks: dict[str, int] = field(default_factory=lambda: {"n1": 2, "n2": 2})
    firing: set[str] = field(default_factory=set)
    pending_since: float = DETECTED_AT - 60.0
    events: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    restarts: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0)])
    listed: bool = True
    down_at_last_scrape: set[str] = field(default_factory=set)
    queries: list[tuple[str, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __setattr__(self, name: str, value: Any) -> None:
        # The step as the test set it over time: the verifier asks for the step at the moment
        # a repair was carried out, not only for the current one.
        if name == "step":
            self.__dict__.setdefault("step_history", []).append((time.time(), value))
        object.__setattr__(self, name, value)

    def _step_at(self, at: float) -> float | None:
        history: list[tuple[float, float | None]] = self.__dict__["step_history"]
        earlier = [value for when, value in history if when <= at]
        return earlier[-1] if earlier else history[0][1]

    def __call__(self, expr: str, at: float) -> list[Sample]:
        with self.lock:
            self.queries.append((expr, at))
            before = at <= DETECTED_AT + 1
            labels = dict(_LABEL.findall(expr))
            if expr.startswith(f"max({contract.TRAINING_STEP.name}"):
                value = self.baseline_step if before else self._step_at(at)
                return [] if value is None else [Sample({}, value)]
            if expr.startswith(f"max(last_over_time({contract.TRAINING_STEP.name}"):
                steps = [v for _, v in self.__dict__["step_history"] if v is not None]
                return [Sample({}, max(steps))] if steps else []
            if expr.startswith("sum(increase("):
                name = expr.removeprefix("sum(increase(").split("{")[0]
                seconds = float(re.findall(r"\[(\d+)ms\]", expr)[-1]) / 1000
                counted = sum(n for when, n in self.events.get(name, []) if at - seconds <= when)
                return [Sample({}, counted)]
            if expr.startswith(f"max({contract.ELASTIC_RESTARTS.name}"):
                counts = [value for when, value in self.restarts if when <= at]
                return [Sample({}, counts[-1])] if counts else []
            if expr.startswith("count by (node) (last_over_time(up"):
                return [Sample({"node": node}, 1.0) for node in sorted(self.down_at_last_scrape)]
            if expr.startswith("count(up") and "== 1" not in expr:
                return [Sample({}, 4.0)] if self.listed else []
            if expr.startswith("count(up"):
                ranks = self.baseline_ranks if before else self.ranks
                node = labels.get(contract.LABEL_NODE)
                up = sum(n for name, n in ranks.items() if node in (None, name))
                return [Sample({}, float(up))] if up else []
            if expr.startswith("ALERTS_FOR_STATE"):
                return [Sample(labels, self.pending_since)]
            if expr.startswith("ALERTS{"):
                return [Sample(labels, 1.0)] if labels["alertname"] in self.firing else []
        raise AssertionError(f"unexpected query {expr}")


@dataclass
class AlertmanagerStub:
    """Alertmanager's alert API on a loopback port: what it accepted, and its URL."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200  # what to answer valid posts with (a test may make it fail)


def _problem(alerts: Any) -> str | None:
    """What Alertmanager would refuse in a ``POST /api/v2/alerts`` body, if anything."""
    if not isinstance(alerts, list) or not alerts:
        return "body must be a non-empty array of alerts"
    for alert in alerts:
        labels = alert.get("labels")
        if not isinstance(labels, dict) or not labels:
            return "labels: at least one label is required"
        for name, value in {**labels, **alert.get("annotations", {})}.items():
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) or not isinstance(value, str):
                return f"invalid label or annotation {name!r}"
        if any(value == "" for value in labels.values()):
            return "label values must not be empty"
        for key in ("startsAt", "endsAt"):
            if key in alert:
                datetime.fromisoformat(alert[key].replace("Z", "+00:00"))
        unknown = set(alert) - {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
        if unknown:
            return f"unknown fields {sorted(unknown)}"
    return None


@contextmanager
def alertmanager() -> Iterator[AlertmanagerStub]:
    stub = AlertmanagerStub()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/api/v2/alerts":
                self._answer(404, "not found")
                return
            if not self.headers.get("Content-Type", "").startswith("application/json"):
                self._answer(415, "application/json expected")
                return
            try:
                alerts = json.loads(body)
                problem = _problem(alerts)
            except (ValueError, AttributeError) as exc:
                problem = str(exc)
            if problem is not None:
                self._answer(400, problem)
                return
            if stub.status == 200:
                stub.received.extend(alerts)
            self._answer(stub.status, "")

        def _answer(self, status: int, text: str) -> None:
            payload = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()


# Stragglers' nodes excluded, a rank down restarted: the policy of the membership tests.
EXCLUDE_STRAGGLERS: list[dict[str, Any]] = [
    {"alert": "TrainingStraggler", "actions": [{"action": "exclude_node"}]},
    {"alert": "TrainingRankDown", "actions": [{"action": "restart_from_checkpoint"}]},
]


def with_policy(settings: Settings, tmp_path: Path, rules: list[dict[str, Any]]) -> Settings:
    """``settings`` running ``rules`` as the policy, live, without approvals, verifying fast."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "rules": rules}))
    return settings.model_copy(
        update={
            "policy_file": path,
            "dry_run": False,
            "require_approval": False,
            "verify_interval_seconds": 0.05,
            "verify_progress_seconds": 0.5,
        }
    )
