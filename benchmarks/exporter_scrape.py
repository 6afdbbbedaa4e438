"""Scrape latency and memory of the node exporter, and how fast it follows NCCL logs.

Runs the exporter in a child process with 8, then 16, fake GPUs (the fake provider answers
instantly, so this measures trainguard's own cost: collectors, exposition, HTTP) and every
collector on, while its NCCL collector follows a generated NCCL debug log (1 GB by default)
from the start. The parent scrapes over HTTP on 127.0.0.1 every 10 ms (Prometheus scrapes every
15 s; this is a stress rate) with a Prometheus scrape's headers (OpenMetrics asked for first,
gzip), first while the log is being read, then once it has been read, and reads the RSS of the
exporter and of its children (log follower, resource tracker).
``cpu_ms_per_scrape`` is the exporter's CPU time per scrape once the log is read: the cost of a
scrape, whatever else competes for the CPU. Following speed is the log size over the time until
``trainguard_nccl_log_bytes_total`` reached it (and over the follower process's CPU time, which
other load on the machine does not inflate).

    .venv/bin/python benchmarks/exporter_scrape.py [--log-mb 1024] [--scrapes 500]

Targets (issue #3): p99 <= 10 ms at 16 GPUs, RSS <= 80 MB, following >= 50 MB/s.
The last line is ``scrape_p99_ms_16gpu=<float>``.
"""

from __future__ import annotations

import argparse
import gzip
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from trainguard.exporters.serving import PROMETHEUS_SCRAPE_ACCEPT

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "exporters" / "fixtures"
COLLECTIVE = (
    b"gpu-node-07:2231:2290 [0] NCCL INFO AllReduce: opCount %x sendbuff 0x7f2a1c000000 "
    b"recvbuff 0x7f2a1c000000 count 26214400 datatype 7 op 0 root 0 comm 0x55d4c8a0e2f0 "
    b"[nranks=16] stream 0x55d4c7e0\n"
)
BYTES_READ = re.compile(rb"^trainguard_nccl_log_bytes_total (\S+)$", re.MULTILINE)


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


def serve(gpus: int, log_glob: str) -> None:
    """The child: an exporter on the fake provider, until stdin closes."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    from trainguard.exporters.fake import FakeProvider
    from trainguard.exporters.procs import HostFacts, ProcessScan, TrainingProcess
    from trainguard.exporters.registry import (
        ExporterContext,
        ExporterSettings,
        ScrapeSupervisor,
        registered,
    )
    from trainguard.exporters.serving import serve_metrics

    class Ranks:
        def scan(self) -> ProcessScan:
            env = {"RANK": "0", "LOCAL_RANK": "0", "NCCL_DEBUG": "INFO"}
            return ProcessScan([TrainingProcess(1000 + i, env) for i in range(gpus)])

    class Host:
        def facts(self) -> HostFacts:
            return HostFacts(("mlx5_0",), ("eth0", "ib0"))

    provider = FakeProvider(gpus=gpus)
    provider.processes = {i: (1000 + i,) for i in range(gpus)}
    settings = ExporterSettings(hostname="bench", nccl_log_globs=(log_glob,))
    context = ExporterContext(provider, Ranks(), Host(), settings)
    collectors = {name: spec.factory(context) for name, spec in registered().items()}
    registry = CollectorRegistry()
    registry.register(ScrapeSupervisor(collectors, provider.kind))
    ProcessCollector(registry=registry)  # as the exporter registers it
    server, _ = serve_metrics(registry, "127.0.0.1", 0)
    print(server.server_address[1], flush=True)
    sys.stdin.read()


def _percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _rss(proc: psutil.Process) -> tuple[int, int]:
    """RSS of the exporter and of its children (the NCCL follower and multiprocessing's
    resource tracker)."""
    children = 0
    for child in proc.children(recursive=True):
        try:
            children += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return proc.memory_info().rss, children


def measure(
    gpus: int, log: Path, log_bytes: int, steady_scrapes: int, interval: float
) -> dict[str, float]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(gpus), "--log", str(log)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    url = f"http://127.0.0.1:{child.stdout.readline().strip()}/metrics"
    # What Prometheus sends: it asks for OpenMetrics first, and for gzip.
    request = urllib.request.Request(
        url, headers={"Accept": PROMETHEUS_SCRAPE_ACCEPT, "Accept-Encoding": "gzip"}
    )
    proc = psutil.Process(child.pid)
    following: list[float] = []
    steady: list[float] = []
    peak_rss = peak_follower_rss = 0
    start = time.perf_counter()
    caught_up_at = None
    cpu_before = follower_cpu = 0.0
    try:
        while len(steady) < steady_scrapes:
            t0 = time.perf_counter()
            with urllib.request.urlopen(request, timeout=30) as response:
                body = gzip.decompress(response.read())
            elapsed = time.perf_counter() - t0
            match = BYTES_READ.search(body)
            read = float(match.group(1)) if match else 0.0
            if caught_up_at is None:
                following.append(elapsed)
                if read >= log_bytes:
                    caught_up_at = time.perf_counter()
                    cpu_before = sum(proc.cpu_times()[:2])
                    follower_cpu = sum(sum(c.cpu_times()[:2]) for c in proc.children())
            else:
                steady.append(elapsed)
            if (len(following) + len(steady)) % 25 == 0:
                rss, follower_rss = _rss(proc)
                peak_rss = max(peak_rss, rss)
                peak_follower_rss = max(peak_follower_rss, follower_rss)
            time.sleep(max(0.0, interval - (time.perf_counter() - t0)))
        rss, follower_rss = _rss(proc)
        cpu_per_scrape = (sum(proc.cpu_times()[:2]) - cpu_before) / len(steady)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert caught_up_at is not None
    everything = following + steady
    return {
        "gpus": gpus,
        "scrapes": len(everything),
        "p50_ms": _percentile(everything, 50) * 1e3,
        "p99_ms": _percentile(everything, 99) * 1e3,
        "p99_ms_while_following": _percentile(following, 99) * 1e3,
        "p99_ms_after": _percentile(steady, 99) * 1e3,
        "cpu_ms_per_scrape": cpu_per_scrape * 1e3,
        "rss_mb": rss / 2**20,
        "peak_rss_mb": max(peak_rss, rss) / 2**20,
        "children_rss_mb": follower_rss / 2**20,
        "peak_total_rss_mb": (max(peak_rss, rss) + max(peak_follower_rss, follower_rss)) / 2**20,
        "follow_mb_per_s": log_bytes / 1e6 / (caught_up_at - start),
        "follow_mb_per_cpu_s": log_bytes / 1e6 / follower_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-mb", type=int, default=1024, help="size of the NCCL log (MiB)")
    parser.add_argument("--scrapes", type=int, default=500, help="scrapes after the log is read")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="time between scrapes")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.log)
        return
    with tempfile.TemporaryDirectory(prefix="trainguard-bench-") as tmp:
        log = Path(tmp) / "nccl.log"
        log_bytes = make_log(log, args.log_mb)
        print(f"nccl log: {log_bytes / 1e6:.0f} MB")
        interval = args.interval_ms / 1000
        results = [measure(g, log, log_bytes, args.scrapes, interval) for g in (8, 16)]
    for r in results:
        print(
            " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
        )
    print(f"scrape_p99_ms_16gpu={results[1]['p99_ms']:.2f}")


if __name__ == "__main__":
    main()
