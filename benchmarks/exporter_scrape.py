"""Scrape latency of the node exporter against its floor, in one interleaved run.

**Ours** is the exporter as users run it: ``python -m trainguard.exporters.app --simulate-gpus N
--dcgm-compat`` (default sample interval and timeout, every collector on, no NCCL log to follow)
in a child process. **The floor** serves the same families and series the least a Python
exporter can: a child process builds a static prometheus_client registry from a snapshot of
ours' exposition (parsed back into families) and renders it with ``generate_latest`` at every
request, served by the same app and HTTP server as ours (``trainguard.exporters.serving``:
text format, gzip at level 1, thread per request), so only where the rendering happens differs.
The snapshot's series are checked to be ours' series before anything is measured.

Both servers of each size (16 and 64 simulated GPUs) run for the whole run. In each round, each
size's two servers are scraped ``--scrapes`` times one after the other, over a fresh HTTP
connection per scrape with Prometheus' headers (OpenMetrics asked for first, gzip), 5 ms apart;
which of the two goes first alternates between rounds. While one server is scraped the other
three are stopped (SIGSTOP on their process group), so neither's background work (our sampler,
every 5 s) lands in the other's figures; ours is resumed for its own turn and its sampler runs
then, in its own figures. p50 and p99 are over every round's scrapes.

The first scrape after start-up is measured ``--startups`` times for each at 16 GPUs,
alternating: a server is started, and scraped once as soon as it prints its address.

What sampling costs: ours' CPU time (its own process, not the log follower) while it is left
alone, not scraped, for ``--idle-seconds`` at each size, the other servers stopped.

    .venv/bin/python -m benchmarks.exporter_scrape [--rounds 8] [--scrapes 100] [--startups 10]

``--follow-mb MB`` also measures how fast ours follows an NCCL debug log of that size from its
start, and its memory (exporter and its children) while it does.

Targets (issue 18): p99 <= 1.2x the floor at 16 and 64 GPUs, first scrape within 1.2x the
floor's. The last line is ``p99_ratio_16=<x> p99_ratio_64=<y> first_scrape_ratio=<z>``.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from trainguard.exporters.serving import (
    PROMETHEUS_SCRAPE_ACCEPT,
    Exposition,
    metrics_server,
    serve_in_background,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "exporters" / "fixtures"
SIZES = (16, 64)
HEADERS = {"Accept": PROMETHEUS_SCRAPE_ACCEPT, "Accept-Encoding": "gzip"}
LISTENING = re.compile(r"listening on http://([\d.]+):(\d+)/metrics")
BYTES_READ = re.compile(rb"^trainguard_nccl_log_bytes_total (\S+)$", re.MULTILINE)
PAUSE_SECONDS = 0.005
COLLECTIVE = (
    b"gpu-node-07:2231:2290 [0] NCCL INFO AllReduce: opCount %x sendbuff 0x7f2a1c000000 "
    b"recvbuff 0x7f2a1c000000 count 26214400 datatype 7 op 0 root 0 comm 0x55d4c8a0e2f0 "
    b"[nranks=16] stream 0x55d4c7e0\n"
)


@dataclass
class Server:
    """A server child process in a process group of its own, and where it listens."""

    name: str
    proc: subprocess.Popen[str]
    port: int
    latencies: list[float] = field(default_factory=list)

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def scrape(port: int) -> tuple[float, bytes]:
    """One scrape as Prometheus makes it: seconds until the whole body is read, and the body."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", "/metrics", headers=HEADERS)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    elapsed = time.perf_counter() - start
    if response.status != 200:
        raise RuntimeError(f"scrape of :{port} answered {response.status}")
    return elapsed, body


def start_ours(gpus: int, log_glob: str, *extra: str) -> Server:
    """Our exporter, as users run it; its address comes on stderr once it serves."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "trainguard.exporters.app"),
            *("--web.listen-address", "127.0.0.1:0", "--simulate-gpus", str(gpus)),
            *("--dcgm-compat", "--nccl.log-glob", log_glob, *extra),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        match = LISTENING.search(line)
        if match:
            # Keep draining its stderr so a chatty exporter never blocks on a full pipe.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return Server(f"ours-{gpus}", proc, int(match.group(2)))
    raise RuntimeError(f"the exporter did not start (exit {proc.wait()})")


def start_floor(gpus: int, snapshot: Path) -> Server:
    """The floor, serving ``snapshot``'s families; its port comes on stdout once it serves."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--floor", str(snapshot)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    return Server(f"floor-{gpus}", proc, int(proc.stdout.readline()))


class Snapshot:
    """The families of an exposition, collected as they are (a static registry's content)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def serve_floor(snapshot: Path) -> None:
    """The floor's child process: ``generate_latest`` of a static registry at every request."""
    registry = CollectorRegistry()
    registry.register(Snapshot(list(text_string_to_metric_families(snapshot.read_text()))))
    server = metrics_server(lambda: Exposition.render(registry), "127.0.0.1", 0)
    serve_in_background(server)
    print(server.server_address[1], flush=True)
    threading.Event().wait()  # until the parent's SIGTERM


def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def measure_round(first: Server, second: Server, everyone: list[Server], scrapes: int) -> None:
    for server in (first, second):
        for other in everyone:
            if other is not server:
                other.pause()
        server.resume()
        for _ in range(scrapes):
            elapsed, _ = scrape(server.port)
            server.latencies.append(elapsed)
            time.sleep(PAUSE_SECONDS)
    for server in everyone:
        server.resume()


def idle_cpu(ours: Server, everyone: list[Server], seconds: float) -> float:
    """Ours' CPU seconds per second while nothing scrapes it: its sampling."""
    for server in everyone:
        if server is not ours:
            server.pause()
    proc = psutil.Process(ours.proc.pid)
    before = sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    used = sum(proc.cpu_times()[:2]) - before
    for server in everyone:
        server.resume()
    return used / seconds


def first_scrapes(snapshot: Path, log_glob: str, startups: int) -> tuple[list[float], list[float]]:
    ours: list[float] = []
    floor: list[float] = []
    for i in range(startups):
        order = ("ours", "floor") if i % 2 == 0 else ("floor", "ours")
        for which in order:
            server = start_ours(16, log_glob) if which == "ours" else start_floor(16, snapshot)
            try:
                (ours if which == "ours" else floor).append(scrape(server.port)[0])
            finally:
                server.stop()
    return ours, floor


def make_log(path: Path, megabytes: int) -> int:
    """An NCCL_DEBUG=INFO log with NCCL_DEBUG_SUBSYS=INIT,COLL: mostly per-collective lines,
    a communicator initialisation (new commId) every 50 collectives, warnings now and then."""
    init = (FIXTURES / "nccl-2.18.5-ib.log").read_bytes()
    warnings = (FIXTURES / "nccl-warnings.log").read_bytes()
    rng = random.Random(3)
    block = bytearray()
    op = 0
    while len(block) < 1 << 20:
        for _ in range(50):
            block += COLLECTIVE % op
            op += 1
        block += init.replace(b"0x7e1b2c3d4e5f6a7b", b"0x%016x" % rng.getrandbits(64))
        if op % 1000 == 0:
            block += warnings
    with path.open("wb") as f:
        for _ in range(megabytes):
            f.write(block)
    return len(block) * megabytes


def measure_following(tmp: Path, megabytes: int) -> str:
    """How fast ours reads a log from its start (sampling every 0.5 s, scraped every 50 ms),
    and the peak RSS of the exporter and of its children (log follower, resource tracker)."""
    log = tmp / "follow" / "nccl.log"
    log.parent.mkdir()
    size = make_log(log, megabytes)
    start = time.perf_counter()
    server = start_ours(16, str(log.parent / "*.log"), "--sample.interval", "0.5")
    proc = psutil.Process(server.proc.pid)
    peak = peak_children = 0
    try:
        while True:
            match = BYTES_READ.search(gzip.decompress(scrape(server.port)[1]))
            children = proc.children(recursive=True)
            peak = max(peak, proc.memory_info().rss)
            peak_children = max(peak_children, sum(c.memory_info().rss for c in children))
            if match and float(match.group(1)) >= size:
                break
            time.sleep(0.05)
        wall = time.perf_counter() - start
        follower_cpu = sum(sum(c.cpu_times()[:2]) for c in children)
    finally:
        server.stop()
    return (
        f"follow: log_mb={size / 1e6:.0f} follow_mb_per_s={size / 1e6 / wall:.1f} "
        f"follow_mb_per_cpu_s={size / 1e6 / follower_cpu:.1f} "
        f"peak_rss_mb={peak / 2**20:.1f} peak_children_rss_mb={peak_children / 2**20:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=100, help="per server and round")
    parser.add_argument("--startups", type=int, default=10, help="first scrapes, each")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="per size")
    parser.add_argument("--follow-mb", type=int, default=0, help="also follow a log (MiB)")
    parser.add_argument("--floor", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor is not None:
        serve_floor(args.floor)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="trainguard-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        no_logs = str(tmp / "no-such-dir" / "*.log")
        servers: dict[int, tuple[Server, Server]] = {}
        everyone: list[Server] = []
        try:
            for gpus in SIZES:
                ours = start_ours(gpus, no_logs)
                everyone.append(ours)
                text = gzip.decompress(scrape(ours.port)[1]).decode()
                snapshot = tmp / f"snapshot-{gpus}.prom"
                snapshot.write_text(text)
                floor = start_floor(gpus, snapshot)
                everyone.append(floor)
                servers[gpus] = (ours, floor)
                served = gzip.decompress(scrape(floor.port)[1]).decode()
                if series(served) != series(text):
                    raise RuntimeError(f"the floor's series differ from ours at {gpus} GPUs")
                print(
                    f"{gpus} GPUs: {len(series(text))} series, body {len(text)} bytes "
                    f"(floor {len(served)})"
                )
            for r in range(args.rounds):
                for ours, floor in servers.values():
                    first, second = (ours, floor) if r % 2 == 0 else (floor, ours)
                    measure_round(first, second, everyone, args.scrapes)
            idle = {
                gpus: idle_cpu(ours, everyone, args.idle_seconds)
                for gpus, (ours, _) in servers.items()
            }
        finally:
            for server in everyone:
                server.stop()
        ratios: dict[int, float] = {}
        for gpus, (ours, floor) in servers.items():
            for server in (ours, floor):
                print(
                    f"{server.name}: scrapes={len(server.latencies)} "
                    f"p50_ms={percentile(server.latencies, 50) * 1e3:.2f} "
                    f"p99_ms={percentile(server.latencies, 99) * 1e3:.2f}"
                )
            print(f"ours-{gpus} left alone: cpu_ms_per_s={idle[gpus] * 1e3:.2f}")
            ratios[gpus] = percentile(ours.latencies, 99) / percentile(floor.latencies, 99)
        ours_first, floor_first = first_scrapes(tmp / "snapshot-16.prom", no_logs, args.startups)
        print(
            "first scrape at 16 GPUs: "
            f"ours_ms={' '.join(f'{t * 1e3:.1f}' for t in ours_first)} "
            f"floor_ms={' '.join(f'{t * 1e3:.1f}' for t in floor_first)}"
        )
        if args.follow_mb:
            print(measure_following(tmp, args.follow_mb))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    first_ratio = statistics.median(ours_first) / statistics.median(floor_first)
    print(
        f"p99_ratio_16={ratios[16]:.3f} p99_ratio_64={ratios[64]:.3f} "
        f"first_scrape_ratio={first_ratio:.3f}"
    )


if __name__ == "__main__":
    main()
