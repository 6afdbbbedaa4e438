"""Throughput of ``trainguard triage`` on a large, mostly-noise training log.

Writes a log of ``--size`` MB (default 1024) made of what a real multi-rank job prints
(per-step lines, NCCL INFO debug output, torchrun and Python warnings, progress bars) with a
few failures sprinkled in, then scans it in-process and reports MB/s and memory. The file is
read back from the page cache, so the figure is triage's own CPU cost, not the disk's.

Memory: ``peak_rss_mb`` is the process's high-water mark, writing the log included. What the
scan itself holds is read from the process's current RSS, sampled every ``SAMPLE_SECONDS`` by a
thread while the scan runs: ``rss_growth_during_scan_mb`` is the highest sample minus the RSS
just before the scan (a spike shorter than the interval can be missed).
The last line is ``triage_mb_per_s=<float>``.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from trainguard.thresholds import load_default
from trainguard.triage.detectors import default_detectors
from trainguard.triage.scanner import Scanner

BLOCK_BYTES = 4 << 20
SAMPLE_SECONDS = 0.01


def _noise_lines(rng: random.Random, count: int) -> list[str]:
    lines = []
    for i in range(count):
        rank = rng.randrange(64)
        step = 1000 + i // 64
        kind = rng.random()
        if kind < 0.35:
            lines.append(
                f"[rank{rank}]:2024-11-07 10:{i % 60:02d}:{i % 59:02d},{i % 997:03d} INFO "
                f"train: step={step} loss={rng.uniform(1.5, 3):.4f} lr=3.0e-04 "
                f"grad_norm={rng.uniform(0.5, 2):.3f} tokens/s={rng.randrange(40000, 60000)}"
            )
        elif kind < 0.37:
            lines.append(
                f"[rank{rank}]:2024-11-07 10:21:03,112 INFO train: step={step} "
                f"step_time={rng.uniform(0.5, 0.52):.4f}s"
            )
        elif kind < 0.80:
            lines.append(
                f"gpu-node-{rank // 8:02d}:{4000 + rank}:{4100 + rank} [{rank % 8}] NCCL INFO "
                f"Channel {rng.randrange(32):02d}/0 : {rank}[{rank % 8}] -> "
                f"{(rank + 1) % 64}[{(rank + 1) % 8}] via P2P/CUMEM/read"
            )
        elif kind < 0.90:
            lines.append(
                f"W1107 10:20:11.512000 {139906 + rank} torch/distributed/run.py:793] "
                "Setting OMP_NUM_THREADS environment variable for each process to be 1 in "
                "default, to avoid your system being overloaded"
            )
        elif kind < 0.97:
            lines.append(
                f"Epoch 3:  {i % 100:2d}%|####1     | {i % 1000}/1000 [05:12<07:26,  1.32it/s, "
                f"loss={rng.uniform(0.5, 1):.3f}]"
            )
        else:
            lines.append(
                "/usr/local/lib/python3.11/site-packages/torch/utils/checkpoint.py:295: "
                "UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be "
                "passed explicitly."
            )
    return lines


_INCIDENTS = (
    "gpu-node-03:4024:4124 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from "
    "peer 10.20.1.18<54112> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
    "[rank5]:[E1107 10:32:33.511960421 ProcessGroupNCCL.cpp:616] [Rank 5] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=4821, OpType=ALLREDUCE, NumelIn=26214400, "
    "NumelOut=26214400, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
    "[ 9912.118722] NVRM: Xid (PCI:0000:3b:00): 48, pid=21877, name=python3, An uncorrectable "
    "double bit error (DBE) has been detected on GPU in the framebuffer.",
)


def write_log(path: Path, size_mb: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    noise = "\n".join(_noise_lines(rng, 40_000)) + "\n"
    text = (noise * (BLOCK_BYTES // len(noise) + 1))[:BLOCK_BYTES]
    block = text[: text.rfind("\n") + 1].encode()
    written = 0
    with path.open("wb") as out:
        index = 0
        while written < size_mb << 20:
            out.write(block)
            incident = (_INCIDENTS[index % len(_INCIDENTS)] + "\n").encode()
            out.write(incident)
            written += len(block) + len(incident)
            index += 1
    return written


class RssSampler:
    """The highest current RSS of this process seen while the ``with`` block runs."""

    def __init__(self, interval: float = SAMPLE_SECONDS) -> None:
        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.before = self.peak = 0

    def __enter__(self) -> RssSampler:
        self.before = self.peak = self._process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self._process.memory_info().rss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="log size in MB (default 1024)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the log")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        log = Path(tmp) / "noise.log"
        size = write_log(log, args.size)
        scanner = Scanner(default_detectors(load_default()))
        with RssSampler() as rss:
            # The scan's own thread: the sampler's CPU is not triage's.
            started, cpu_started = time.perf_counter(), time.thread_time()
            scanner.scan_paths([str(log)])
            findings = scanner.findings()
            elapsed = time.perf_counter() - started
            cpu = time.thread_time() - cpu_started
        peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rate = size / elapsed / 1e6
    print(f"log_bytes={size}")
    print(f"lines={scanner.stats.lines}")
    print(f"findings={len(findings)}")
    print(f"seconds={elapsed:.3f}")
    # On a shared machine wall time includes waiting for a core; CPU time is triage's own cost.
    print(f"cpu_seconds={cpu:.3f}")
    print(f"cpu_mb_per_s={size / cpu / 1e6:.1f}")
    print(f"peak_rss_mb={peak_rss_kib / 1024:.1f}")
    print(f"rss_before_scan_mb={rss.before / 2**20:.1f}")
    print(f"peak_rss_during_scan_mb={rss.peak / 2**20:.1f}")
    print(f"rss_growth_during_scan_mb={(rss.peak - rss.before) / 2**20:.1f}")
    print(f"triage_mb_per_s={rate:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
