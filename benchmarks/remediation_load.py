"""Webhook throughput and latency of the remediation service on loopback, against a floor.

The service runs in its own process (``trainguard-remediation``, default settings: SQLite in WAL
mode with ``synchronous=FULL``, every notification committed before its 200, the shipped
policy, dry-run) and this process is the load generator: ``--connections`` keep-alive HTTP/1.1
connections post Alertmanager notifications of ``--alerts-per-request`` alerts each (Alertmanager
groups alerts; 10 is a typical group) for ``--seconds`` per round. Every alert is new except
``--duplicate-ratio`` of the notifications, which are re-deliveries of an earlier one and so
exercise the (fingerprint, startsAt) dedupe. Each new alert is a ``TrainingStraggler``, for
which the policy plans (and records) one action, so every alert costs a policy decision too.

The floor is the least any webhook receiver in this stack does: a bare FastAPI app, served by
uvicorn exactly as the service's command serves its own (one process, the same ``uvicorn.run``
arguments), with one route that checks the same bearer token and validates the body as the
service's own ``WebhookPayload`` model, answers the same ``WebhookResult`` document, and stores
nothing. Both servers run side by side for the whole run and the same generator loads them in
alternating rounds (ours then the floor, the floor then ours, ...), so both see the same
machine load; the ratios say what the store, the policy and the metrics cost on top.

Latency is per request, from sending it to reading the full response. alerts_per_s counts the
alerts in notifications answered 200 over the measured wall time (after a warm-up second per
round), pooled over the rounds; p99 is over every request of every round.

    .venv/bin/python benchmarks/remediation_load.py [--rounds 6] [--seconds 10] [--connections 4]

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
from trainguard.remediation.models import WebhookPayload, WebhookResult

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

    @app.post(WEBHOOK, response_model=WebhookResult, dependencies=[Depends(authenticated)])
    async def alertmanager(payload: WebhookPayload) -> WebhookResult:
        return WebhookResult(
            stored=len(payload.alerts),
            duplicates=0,
            resolved=0,
            cancelled_actions=0,
            planned_actions=[],
        )

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

    async def round(self, url: str, tally: Tally) -> None:
        """One round against ``url``: a warm-up second, then ``--seconds`` measured."""
        args = self.args
        latencies: list[float] = []
        alerts_ok = 0
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        warmup_end = time.perf_counter() + 1.0
        end = warmup_end + args.seconds
        limits = httpx.Limits(max_connections=args.connections)

        async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits) as client:

            async def connection() -> None:
                nonlocal alerts_ok
                while (now := time.perf_counter()) < end:
                    body = self.body()
                    started = time.perf_counter()
                    response = await client.post(WEBHOOK, content=body)
                    elapsed = time.perf_counter() - started
                    if now < warmup_end:
                        continue
                    if response.status_code == 200:
                        latencies.append(elapsed)
                        alerts_ok += args.alerts_per_request
                    else:
                        tally.failures += 1

            await asyncio.gather(*(connection() for _ in range(args.connections)))
        wall = time.perf_counter() - warmup_end
        tally.latencies += latencies
        tally.alerts_ok += alerts_ok
        tally.wall += wall
        tally.rounds.append((alerts_ok / wall, _p99(latencies)))


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
    targets = ((ours, tallies[0]), (floor, tallies[1]))
    for index in range(args.rounds):
        for (url, pid), tally in targets if index % 2 == 0 else targets[::-1]:
            cpu_before = _cpu_seconds(pid)
            generator_before = time.process_time()
            asyncio.run(generator.round(url, tally))
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
