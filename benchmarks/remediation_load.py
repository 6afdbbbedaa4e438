"""Webhook throughput and latency of the remediation service, on loopback.

The service runs in its own process (``trainguard-remediation``, default settings: SQLite in WAL
mode with ``synchronous=FULL``, every notification committed before its 200, the shipped
policy, dry-run) and this process is the load generator: ``--connections`` keep-alive HTTP/1.1
connections post Alertmanager notifications of ``--alerts-per-request`` alerts each (Alertmanager
groups alerts; 10 is a typical group) for ``--seconds``. Every alert is new except
``--duplicate-ratio`` of the notifications, which are re-deliveries of an earlier one and so
exercise the (fingerprint, startsAt) dedupe. Each new alert is a ``TrainingStraggler``, for
which the policy plans (and records) one action, so every alert costs a policy decision too.

Latency is per request, from sending it to reading the full response. alerts_per_s counts the
alerts in notifications answered 200 over the measured wall time (after a warm-up second).

    .venv/bin/python benchmarks/remediation_load.py [--seconds 10] [--connections 4]

``--database-url postgresql://...`` measures the Postgres store instead (an empty database;
the server shares the machine's cores with the service and the generator).

Target (issue #5): >= 2000 alerts/s and p99 <= 20 ms on 2 cores (SQLite, the default).
The last line is ``alerts_per_s=<float> p99_ms=<float>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TOKEN = "benchmark-token"


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


async def _load(url: str, args: argparse.Namespace) -> tuple[list[float], int, int, float]:
    latencies: list[float] = []
    alerts_ok = 0
    failures = 0
    seq = 0
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    warmup_end = time.perf_counter() + 1.0
    end = warmup_end + args.seconds
    measured_start = warmup_end
    limits = httpx.Limits(max_connections=args.connections)

    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits) as client:

        async def connection() -> None:
            nonlocal alerts_ok, failures, seq
            while (now := time.perf_counter()) < end:
                if seq > 0 and random.random() < args.duplicate_ratio:
                    body = _notification(random.randrange(seq), args.alerts_per_request)
                else:
                    seq += 1
                    body = _notification(seq, args.alerts_per_request)
                started = time.perf_counter()
                response = await client.post("/v1/alertmanager", content=body)
                elapsed = time.perf_counter() - started
                if now < warmup_end:
                    continue
                if response.status_code == 200:
                    latencies.append(elapsed)
                    alerts_ok += args.alerts_per_request
                else:
                    failures += 1

        await asyncio.gather(*(connection() for _ in range(args.connections)))
    return latencies, alerts_ok, failures, time.perf_counter() - measured_start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--alerts-per-request", type=int, default=10)
    parser.add_argument("--duplicate-ratio", type=float, default=0.1)
    parser.add_argument(
        "--database-url",
        help="a Postgres database (postgresql://...) for the service instead of SQLite; "
        "it should be empty",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="trainguard-remediation-bench-") as tmp:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "TRAINGUARD_REMEDIATION_TOKEN": TOKEN,
            "TRAINGUARD_REMEDIATION_DB_PATH": str(Path(tmp) / "bench.db"),
        }
        if args.database_url:
            env["TRAINGUARD_REMEDIATION_DATABASE_URL"] = args.database_url
        server = subprocess.Popen(
            [sys.executable, "-m", "trainguard.remediation.cli", "--port", str(port),
             "--log-level", "WARNING"],
            env=env,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    print("the service did not start", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            cpu_before = _cpu_seconds(server.pid)
            generator_before = time.process_time()
            latencies, alerts_ok, failures, wall = asyncio.run(_load(url, args))
            server_cpu = _cpu_seconds(server.pid) - cpu_before
            generator_cpu = time.process_time() - generator_before
            metrics = httpx.get(f"{url}/metrics").text
        finally:
            server.terminate()
            server.wait(10)

    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    dedup = next(
        (line.split()[-1] for line in metrics.splitlines()
         if line.startswith("trainguard_remediation_alerts_deduplicated_total ")),
        "0",
    )  # fmt: skip
    print(f"cores={os.cpu_count()} connections={args.connections} "
          f"alerts_per_request={args.alerts_per_request} seconds={wall:.1f}")  # fmt: skip
    cpu_ms = server_cpu * 1000 / max(1, len(latencies))
    generator_ms = generator_cpu * 1000 / max(1, len(latencies))
    print(f"requests_ok={len(latencies)} failures={failures} deduplicated_alerts={dedup} "
          f"server_cpu_ms_per_request={cpu_ms:.2f} "
          f"generator_cpu_ms_per_request={generator_ms:.2f}")  # fmt: skip
    print(f"requests_per_s={len(latencies) / wall:.1f} p50_ms={p50:.2f}")
    print(f"alerts_per_s={alerts_ok / wall:.1f} p99_ms={p99:.2f}")
    return 0 if failures == 0 else 1


def _cpu_seconds(pid: int) -> float:
    # utime + stime of the process, in clock ticks (Linux /proc).
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
