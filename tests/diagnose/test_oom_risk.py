"""Memory creeping toward capacity before any OOM: a warning sign naming the rank, from the
TrainingOOMRisk alert's recorded series (or their expressions over the raw series)."""

from __future__ import annotations

from dataclasses import replace

from tests.diagnose import synthetic
from tests.diagnose.conftest import History
from trainguard import contract
from trainguard.contract import Failure
from trainguard.diagnose import Report, ScopeLevel, diagnose
from trainguard.diagnose.analysis import run
from trainguard.diagnose.model import Symptom
from trainguard.diagnose.prometheus import Series
from trainguard.diagnose.signals import RankId, Signals
from trainguard.thresholds import load_default

GIB = float(1 << 30)
MIB = float(1 << 20)


def oom_symptoms(report: Report) -> list[Symptom]:
    return [s for s in report.symptoms if s.failure is Failure.OOM]


def test_memory_creeping_toward_capacity_names_the_rank(history: History) -> None:
    report = diagnose(
        history.url, synthetic.MEMORY_CREEP, until=history.now, thresholds=synthetic.SHIPPED
    )
    assert report.failure is Failure.OOM
    (symptom,) = report.symptoms
    assert symptom.severity == 1 and symptom.ranks == [2]
    assert contract.REC_RANK_MEMORY_AT_CAPACITY in symptom.signals
    assert report.scope.level is ScopeLevel.RANK and report.scope.ranks == [2]
    (top,) = report.candidates
    assert top.cause == "memory_creep" and top.facts["rank"] == 2
    assert top.facts["capacity_bytes"] == 80 * GIB
    allocated = top.facts["allocated_bytes"]
    assert isinstance(allocated, float) and 70 * GIB <= allocated <= 74 * GIB
    # 44 GiB over 115 points of 15 s.
    growth = top.facts["growth_bytes_per_second"]
    assert isinstance(growth, float)
    assert abs(growth / (44 * GIB / (115 * synthetic.INTERVAL)) - 1) < 0.1
    assert any("MiB/s while at risk" in e for e in top.evidence)


def test_a_brief_slowdown_of_the_creeping_rank_does_not_outrank_its_creep(
    history: History,
) -> None:
    # 30 s at 1.25x reads over the fast rule's factor for longer than its hold, but far less
    # than diagnose's 300 s: a straggler of lesser weight than the memory about to run out.
    report = diagnose(
        history.url, synthetic.MEMORY_CREEP_SLOW, until=history.now, thresholds=synthetic.SHIPPED
    )
    assert report.failure is Failure.OOM and report.scope.ranks == [2]
    straggler = next(x for x in report.symptoms if x.failure is Failure.STRAGGLER)
    assert straggler.ranks == [2] and straggler.severity == 1


def test_an_oom_outranks_the_risk_of_another_rank(history: History) -> None:
    report = diagnose(
        history.url, synthetic.OOM_AND_RISK, until=history.now, thresholds=synthetic.SHIPPED
    )
    assert report.failure is Failure.OOM
    actual, risk = oom_symptoms(report)
    assert (actual.severity, actual.ranks) == (3, [1])
    # Rank 1 was at risk too before its OOM: that is the OOM's, not a second symptom.
    assert (risk.severity, risk.ranks) == (1, [3])
    assert report.scope.ranks == [1]
    creep = next(c for c in report.candidates if c.cause == "memory_creep")
    assert report.candidates[0].cause == "memory_growth"
    assert creep.confidence < min(c.confidence for c in report.candidates if c is not creep)


def test_a_healthy_job_has_no_oom_risk(history: History) -> None:
    report = diagnose(
        history.url, synthetic.HEALTHY, until=history.now, thresholds=synthetic.SHIPPED
    )
    assert oom_symptoms(report) == [] and report.failure is None


def _series(rank: RankId, points: list[tuple[float, float]]) -> Series:
    labels = {contract.LABEL_RANK: str(rank.rank), contract.LABEL_NODE: rank.node}
    return Series(labels, points)


def test_the_fault_matrix_scale_reads_the_recorded_series() -> None:
    """The matrix's CPU ranks: 1 GiB capacity, 350 MiB held, 2 s steps; rank 2 leaks 40 MB/s
    from t=40; the recorded prediction exists where the 20 s trend reaches capacity in 120 s."""
    ranks = [RankId(r, f"node-{'ab'[r // 2]}", str(r % 2)) for r in range(4)]
    sig = Signals("fm", 0.0, 120.0, 2.0, sustain_seconds=10.0, ranks=ranks)
    grid = [2.0 * i for i in range(61)]
    for rank in ranks:
        held = [350 * MIB + (40e6 * max(0.0, t - 40) if rank.rank == 2 else 0) for t in grid]
        sig.allocated[rank.rank] = _series(rank, list(zip(grid, held, strict=True)))
        sig.reserved[rank.rank] = sig.allocated[rank.rank]
        sig.capacity[rank.rank] = _series(rank, [(t, GIB) for t in grid])
        memory = list(zip(grid, held, strict=True))
        sig.headroom[rank.rank] = _series(rank, [(t, 1 - v / GIB) for t, v in memory])
        sig.at_capacity[rank.rank] = _series(
            rank, [(t, v + 40e6 * 120) for t, v in memory if v + 40e6 * 120 >= GIB]
        )
    report = Report("fm", 0.0, 120.0, 120.0, "http://prometheus:9090")
    # The matrix's alert holds the risk for 0 s (oom_risk_for): a leak is restarted soon after.
    run(sig, None, [], report, replace(load_default(), oom_risk_for="0s"))
    assert report.failure is Failure.OOM
    assert report.symptoms[0].ranks == [2] and report.scope.ranks == [2]
    assert report.candidates[0].cause == "memory_creep"
    growth = report.candidates[0].facts["growth_bytes_per_second"]
    assert isinstance(growth, float) and abs(growth / 40e6 - 1) < 0.01
