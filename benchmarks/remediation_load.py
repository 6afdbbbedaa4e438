"""Webhook throughput and latency of the remediation service on loopback, against a floor.

The service runs in its own process (``trainguard-remediation``, default settings: SQLite in WAL
mode with ``synchronous=FULL``, every notification committed to the inbox before its 200 and
decided after, in order; the shipped policy, dry-run) and this process is the load generator:
``--connections`` keep-alive HTTP/1.1 connections post Alertmanager notifications of
``--alerts-per-request`` alerts each (Alertmanager groups alerts; 10 is a typical group) for
``--seconds`` per round. Every alert is new except
``--duplicate-ratio`` of the notifications, which are re-deliveries of an earlier one and so
exercise the (fingerprint, startsAt) dedupe. Each new alert is a ``TrainingStraggler``, for
which the policy plans (and records) one action, so every alert costs a policy decision too.

The floor is the least any webhook receiver in this stack does: a bare FastAPI app, served by
uvicorn exactly as the service's command serves its own (one process, the same ``uvicorn.run``
arguments), with one route that checks the same bearer token and validates the body as the
service's own ``WebhookPayload`` model, answers the same ``WebhookAccepted`` document, and
stores nothing. Both servers run side by side for the whole run and the same generator loads them in
alternating rounds (ours then the floor, the floor then ours, ...), so both see the same
machine load; the ratios say what the store, the policy and the metrics cost on top.

Latency is per request, from sending it to reading the full response. alerts_per_s counts the
alerts in notifications answered 200 over the measured wall time (after a warm-up second per
round), pooled over the rounds; p99 is over every request of every round.

A 200 from the service means the notification is committed, not yet decided, so the figures
above are the intake's. After each of its rounds the generator also waits (a long-poll of
``GET /v1/notifications/{id}`` on the last id it was given: the service decides in order) until
every notification it accepted is decided, before the floor's round starts, and prints how long
that took after the round's last answer and the round's alerts over the time from its first
request to that last decision (the rate the service accepted *and* decided them).

    .venv/bin/python -m benchmarks.remediation_load [--rounds 6] [--seconds 10] [--connections 4]

``--database-url postgresql://...`` measures the Postgres store instead (an empty database;
the server shares the machine's cores with the service and the generator).

Targets: >= 2000 alerts/s and p99 <= 20 ms on 2 cores (issue #5, SQLite, the default); ours at
>= 60% of the floor's alerts/s with p99 <= 2x the floor's. The last line is
``alerts_per_s=<x> p99_ms=<y> floor_alerts_per_s=<a> floor_p99_ms=<b>``.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException, status

# The floor's route resolves its annotations from this module's globals (FastAPI reads them).
from trainguard.remediation.models import WebhookAccepted, WebhookPayload

TOKEN = "benchmark-token"
WEBHOOK = "/v1/alertmanager"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _notification(seq: int, per_request: int) -> bytes:
    alerts = [
        {
            "status": "firing",
            "labels": {
                "alertname": "TrainingStraggler",
                "severity": "warning",
                "job_id": f"job-{seq % 50}",
                "rank": str(i),
                "node": f"node-{i}",
            },
            "annotations": {"summary": "straggler"},
            "startsAt": "2026-01-01T00:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph",
            "fingerprint": f"{seq:012x}{i:04x}",
        }
        for i in range(per_request)
    ]
    return json.dumps(
        {
            "version": "4",
            "groupKey": f'{{}}:{{job_id="job-{seq % 50}"}}',
            "truncatedAlerts": 0,
            "status": "firing",
            "receiver": "trainguard",
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "alerts": alerts,
        }
    ).encode()


# --- the floor ------------------------------------------------------------------------------
def serve_floor(port: int) -> None:
    """The floor's server: authenticate, validate with the service's model, store nothing."""
    import uvicorn

    expected = f"Bearer {TOKEN}".encode()

    async def authenticated(authorization: Annotated[str, Header()] = "") -> None:
        if not hmac.compare_digest(authorization.encode(), expected):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "bad token")

    app = FastAPI()

    @app.post(WEBHOOK, response_model=WebhookAccepted, dependencies=[Depends(authenticated)])
    async def alertmanager(payload: WebhookPayload) -> WebhookAccepted:
        return WebhookAccepted(notification=1, alerts=len(payload.alerts))

    @app.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    # As the service's own command runs uvicorn (trainguard.remediation.cli with its default
    # --log-format ecs, and --log-level WARNING as this benchmark starts it).
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", log_config=None, access_log=False
    )


# --- load -----------------------------------------------------------------------------------
@dataclass
class Tally:
    """One server's requests over every round."""

    latencies: list[float] = field(default_factory=list)
    alerts_ok: int = 0
    failures: int = 0
    wall: float = 0.0
    server_cpu: float = 0.0
    generator_cpu: float = 0.0
    # Per round: (alerts/s, p99 seconds), for the spread of the ratios.
    rounds: list[tuple[float, float]] = field(default_factory=list)
    # Ours, per round: seconds from the last accepted notification until every one was decided,
    # and the alerts of the round over the time from its first request to that moment.
    drains: list[float] = field(default_factory=list)
    decided_alerts_per_s: list[float] = field(default_factory=list)

    @property
    def alerts_per_s(self) -> float:
        return self.alerts_ok / self.wall if self.wall else 0.0

    @property
    def p99_ms(self) -> float:
        return _p99(self.latencies) * 1000

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000 if self.latencies else 0.0


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


class Generator:
    """Notifications for every round, numbered across rounds so new alerts stay new."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seq = 0

    def body(self) -> bytes:
        if self.seq > 0 and random.random() < self.args.duplicate_ratio:
            return _notification(random.randrange(self.seq), self.args.alerts_per_request)
        self.seq += 1
        return _notification(self.seq, self.args.alerts_per_request)

    async def round(self, url: str, tally: Tally, *, drain: bool) -> None:
        """One round against ``url``: a warm-up second, then ``--seconds`` measured; with
        ``drain``, then waits until the service has decided every notification it accepted
        (so that its deciding never runs into the next round)."""
        args = self.args
        latencies: list[float] = []
        alerts_ok = alerts_accepted = last = 0
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        first = time.perf_counter()
        warmup_end = first + 1.0
        end = warmup_end + args.seconds
        limits = httpx.Limits(max_connections=args.connections)

        async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits) as client:

            async def connection() -> None:
                nonlocal alerts_ok, alerts_accepted, last
                while (now := time.perf_counter()) < end:
                    body = self.body()
                    started = time.perf_counter()
                    response = await client.post(WEBHOOK, content=body)
                    elapsed = time.perf_counter() - started
                    if response.status_code == 200:
                        alerts_accepted += args.alerts_per_request
                        last = max(last, response.json()["notification"])
                    if now < warmup_end:
                        continue
                    if response.status_code == 200:
                        latencies.append(elapsed)
                        alerts_ok += args.alerts_per_request
                    else:
                        tally.failures += 1

            await asyncio.gather(*(connection() for _ in range(args.connections)))
            answered = time.perf_counter()  # the round's last answer
            wall = answered - warmup_end
            if drain and last:
                await _drain(client, last)
                decided = time.perf_counter()
                tally.drains.append(decided - answered)
                tally.decided_alerts_per_s.append(alerts_accepted / (decided - first))
        tally.latencies += latencies
        tally.alerts_ok += alerts_ok
        tally.wall += wall
        tally.rounds.append((alerts_ok / wall, _p99(latencies)))


async def _drain(client: httpx.AsyncClient, notification: int) -> None:
    """Until ``notification`` is decided: the service decides in order, so every one before it
    is decided too."""
    while True:
        response = await client.get(
            f"/v1/notifications/{notification}", params={"wait": 30}, timeout=60
        )
        response.raise_for_status()
        if response.json()["decided_at"] is not None:
            return


# --- servers --------------------------------------------------------------------------------
@contextmanager
def _server(command: list[str], env: dict[str, str], url: str) -> Iterator[subprocess.Popen[bytes]]:
    # The servers' own output (the service logs ECS JSON to stdout) goes to stderr, so stdout
    # holds the figures alone.
    server = subprocess.Popen(command, env=env, stdout=sys.stderr)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(command)} did not start")
            time.sleep(0.1)
        yield server
    finally:
        server.terminate()
        server.wait(10)


def _measure(
    args: argparse.Namespace, ours: tuple[str, int], floor: tuple[str, int]
) -> tuple[Tally, Tally]:
    """Alternating rounds, each pair in the other order than the last."""
    generator = Generator(args)
    tallies = (Tally(), Tally())
    targets = ((ours, tallies[0], True), (floor, tallies[1], False))
    for index in range(args.rounds):
        for (url, pid), tally, drain in targets if index % 2 == 0 else targets[::-1]:
            cpu_before = _cpu_seconds(pid)
            generator_before = time.process_time()
            asyncio.run(generator.round(url, tally, drain=drain))
            tally.server_cpu += _cpu_seconds(pid) - cpu_before
            tally.generator_cpu += time.process_time() - generator_before
    return tallies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per server (default 6)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per round")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--alerts-per-request", type=int, default=10)
    parser.add_argument("--duplicate-ratio", type=float, default=0.1)
    parser.add_argument(
        "--database-url",
        help="a Postgres database (postgresql://...) for the service instead of SQLite; "
        "it should be empty",
    )
    parser.add_argument("--serve-floor", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor is not None:
        serve_floor(args.serve_floor)
        return 0

    with tempfile.TemporaryDirectory(prefix="trainguard-remediation-bench-") as tmp:
        port, floor_port = _free_port(), _free_port()
        url, floor_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{floor_port}"
        env = {
            **os.environ,
            "TRAINGUARD_REMEDIATION_TOKEN": TOKEN,
            "TRAINGUARD_REMEDIATION_DB_PATH": str(Path(tmp) / "bench.db"),
        }
        if args.database_url:
            env["TRAINGUARD_REMEDIATION_DATABASE_URL"] = args.database_url
        service = [sys.executable, "-m", "trainguard.remediation.cli", "--port", str(port),
                   "--log-level", "WARNING"]  # fmt: skip
        bare = [sys.executable, str(Path(__file__).resolve()), "--serve-floor", str(floor_port)]
        try:
            with (
                _server(service, env, url) as server,
                _server(bare, env, floor_url) as floor_server,
            ):
                ours, floor = _measure(args, (url, server.pid), (floor_url, floor_server.pid))
                metrics = httpx.get(f"{url}/metrics").text
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1

    dedup = next(
        (line.split()[-1] for line in metrics.splitlines()
         if line.startswith("trainguard_remediation_alerts_deduplicated_total ")),
        "0",
    )  # fmt: skip
    print(f"cores={os.cpu_count()} connections={args.connections} "
          f"alerts_per_request={args.alerts_per_request} rounds={args.rounds} "
          f"seconds_per_round={args.seconds:g} (alternating with the floor)")  # fmt: skip
    for name, tally in (("ours", ours), ("floor", floor)):
        requests = max(1, len(tally.latencies))
        print(f"{name}: requests_ok={len(tally.latencies)} failures={tally.failures} "
              f"server_cpu_ms_per_request={tally.server_cpu * 1000 / requests:.2f} "
              f"generator_cpu_ms_per_request={tally.generator_cpu * 1000 / requests:.2f} "
              f"requests_per_s={len(tally.latencies) / max(tally.wall, 1e-9):.1f} "
              f"p50_ms={tally.p50_ms:.2f}")  # fmt: skip
    print(f"ours: deduplicated_alerts={dedup}")
    if ours.drains:
        drains = sorted(ours.drains)
        rates = sorted(ours.decided_alerts_per_s)
        print(f"ours: decided every accepted notification {statistics.median(drains):.2f} s "
              f"after the round's last answer (median; {drains[0]:.2f}..{drains[-1]:.2f}), "
              f"decided_alerts_per_s median {statistics.median(rates):.1f} "
              f"({rates[0]:.1f}..{rates[-1]:.1f}) over each round from its first request "
              f"to its last decision")  # fmt: skip
    # Each round of ours against the floor's round beside it: the spread of the ratios.
    pairs = list(zip(ours.rounds, floor.rounds, strict=True))
    throughput = sorted(o[0] / f[0] for o, f in pairs if f[0])
    tails = sorted(o[1] / f[1] for o, f in pairs if f[1])
    if throughput and tails:
        print(f"rounds: alerts_per_s ratio median {statistics.median(throughput):.2f} "
              f"({throughput[0]:.2f}..{throughput[-1]:.2f}), p99 ratio median "
              f"{statistics.median(tails):.2f} ({tails[0]:.2f}..{tails[-1]:.2f})")  # fmt: skip
    ratio = ours.alerts_per_s / floor.alerts_per_s if floor.alerts_per_s else 0.0
    tail = ours.p99_ms / floor.p99_ms if floor.p99_ms else float("inf")
    print(f"ratio: alerts_per_s {ratio:.2f} of the floor (target >= 0.60: "
          f"{'met' if ratio >= 0.6 else 'not met'}), p99 {tail:.2f}x the floor's "
          f"(target <= 2: {'met' if tail <= 2 else 'not met'})")  # fmt: skip
    print(
        f"alerts_per_s={ours.alerts_per_s:.1f} p99_ms={ours.p99_ms:.2f} "
        f"floor_alerts_per_s={floor.alerts_per_s:.1f} floor_p99_ms={floor.p99_ms:.2f}"
    )
    return 0 if ours.failures == floor.failures == 0 else 1


def _cpu_seconds(pid: int) -> float:
    # utime + stime of the process, in clock ticks (Linux /proc).
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
