"""The job as it was: a rank judged only while it was a member, and a symptom dated by its
first evidence, so the report's timeline says when and how much the injected faults did."""

from __future__ import annotations

import pytest

from tests.diagnose import synthetic
from tests.diagnose.conftest import History
from trainguard.contract import Failure
from trainguard.diagnose import diagnose
from trainguard.diagnose.membership import interval_means
from trainguard.diagnose.prometheus import Series

# Compute = data + forward + backward (synthetic.BASE): 0.31 s; the slow rank's forward x f.
HEALTHY = 0.31


def onset(history: History, point: int) -> float:
    """When a fault injected "from point ``point``" began: its steps are those scraped at that
    point, which ran after the scrape before it."""
    return history.now - 3600 + (point - 1) * synthetic.INTERVAL


def straggler(history: History, job_id: str) -> tuple[float, float, list[int]]:
    report = diagnose(history.url, job_id, until=history.now, thresholds=synthetic.SHIPPED)
    (symptom,) = [s for s in report.symptoms if s.failure is Failure.STRAGGLER]
    (top,) = [c for c in report.candidates if c.facts.get("ratio")][:1]
    assert symptom.since is not None
    return symptom.since, float(top.facts["ratio"]), symptom.ranks


def test_a_straggler_is_dated_by_its_first_slow_interval_and_measured_at_its_factor(
    history: History,
) -> None:
    # The 5-minute mean crosses 1.2x minutes after the onset; the raw counters show it at once.
    since, ratio, ranks = straggler(history, synthetic.STRAGGLER_RANK)
    assert ranks == [5]
    assert abs(since - onset(history, 80)) <= synthetic.INTERVAL
    assert ratio == pytest.approx((0.01 + 0.22 + 0.2) / HEALTHY, rel=0.1)


def test_an_excluded_straggler_is_judged_while_it_was_a_member(history: History) -> None:
    # Rank 2 (forward 2x from point 80) is excluded with its node at RESTART_AT; the survivors
    # restart and re-form the job at world size 2. Its last windows, read against the median
    # of the ranks left, are no part of the job it was in.
    since, ratio, ranks = straggler(history, synthetic.EXCLUDED)
    assert ranks == [2]
    assert abs(since - onset(history, 80)) <= synthetic.INTERVAL
    assert ratio == pytest.approx((0.01 + 0.2 + 0.2) / HEALTHY, rel=0.1)


def test_interval_means_skip_resets_and_intervals_without_observations() -> None:
    total = Series({}, [(0, 1.0), (15, 2.0), (30, 2.0), (45, 0.5), (60, 1.5)])
    count = Series({}, [(0, 10.0), (15, 20.0), (30, 20.0), (45, 2.0), (60, 6.0)])
    assert interval_means(total, count) == {15: 0.1, 60: 0.25}
