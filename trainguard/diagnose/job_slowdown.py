"""Job slowdowns: every rank slowed down together (no single straggler, not data-bound)."""

from __future__ import annotations

import re
import statistics

from trainguard import contract
from trainguard.contract import Cause, Failure
from trainguard.diagnose.analysis import explains
from trainguard.diagnose.context import Context, job_median, runs
from trainguard.diagnose.model import Candidate, Scope, ScopeLevel, Setting, Symptom
from trainguard.diagnose.prevent import ENV, prevents

# The job median compute time at the end of the window this many times the one at its start.
# Diagnose's own judgement: no alert of thresholds.yml watches whole-job slowdowns.
JOB_SLOWDOWN_FACTOR = 1.3


@explains(Failure.JOB_SLOWDOWN, after=(Failure.STRAGGLER, Failure.DATALOADER_BOUND))
def analyse(ctx: Context) -> None:
    """The job median compute time of the last quarter of the window against the first."""
    if ctx.has_symptom(Failure.STRAGGLER, Failure.DATALOADER_BOUND):
        return
    sig = ctx.sig
    median = list(job_median(sig.compute).items())
    if len(median) < 8:
        return
    quarter = len(median) // 4
    before = statistics.median(v for _, v in median[:quarter])
    after = statistics.median(v for _, v in median[-quarter:])
    if before <= 0 or after < JOB_SLOWDOWN_FACTOR * before:
        return
    # Since when: the longest sustained run above the factor, not the last quarter's start.
    slowed = runs([(t, v >= JOB_SLOWDOWN_FACTOR * before) for t, v in median], ctx.min_points)
    ranks = [r.rank for r in sig.ranks]
    ctx.symptom(
        Symptom(
            Failure.JOB_SLOWDOWN,
            f"Every rank slowed down together: median compute time {before:.3f} s -> {after:.3f} s",
            [contract.REC_RANK_COMPUTE_MEAN],
            slowed[0] if slowed else median[-quarter][0],
            ranks,
            [],
            2,
        ),
        Scope(ScopeLevel.JOB, "all ranks at once: data, storage, network or the code", ranks),
    )
    sockets = socket_nodes(ctx)
    ctx.candidate(
        Candidate(
            Cause.SHARED_DEPENDENCY,
            "Something every rank shares got slower (storage, network, the input data)",
            0.5,
            [f"job median compute time rose {after / before:.2f}x"]
            + ([f"NCCL uses TCP sockets on {', '.join(sockets)}"] if sockets else []),
            [
                "Compare with the previous release of the code and data; check the shared "
                "file system and network during the window."
            ],
            ["Alert on job throughput (job:trainguard_steps:rate5m) dropping."],
            {"before": before, "after": after},
        )
    )


def socket_nodes(ctx: Context) -> list[str]:
    """Nodes with a NCCL communicator on the TCP socket transport (``nccl_socket_transport``,
    the NcclSocketTransportFallback alert's anchored regex)."""
    pattern = ctx.thresholds.nccl_socket_transport
    return sorted(
        {
            s.label(contract.LABEL_NODE)
            for s in ctx.sig.nccl_info
            if re.fullmatch(pattern, s.label(contract.LABEL_TRANSPORT))
        }
    )


@prevents(Cause.SHARED_DEPENDENCY)
def _fabric_settings(ctx: Context, c: Candidate) -> list[Setting]:
    sockets = socket_nodes(ctx)
    if not sockets:
        return []
    return [
        Setting(
            "NCCL_IB_HCA, NCCL_SOCKET_IFNAME",
            "the nodes' InfiniBand HCAs (e.g. mlx5), the fabric's interface; no NCCL_IB_DISABLE=1",
            ENV,
            [
                f"{contract.NCCL_INFO.name} shows the TCP socket transport on "
                f"{', '.join(sockets)} while every rank slowed down"
            ],
        )
    ]
