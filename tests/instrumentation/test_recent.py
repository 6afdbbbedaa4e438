"""The time-windowed median behind a rank's recent compute share."""

from __future__ import annotations

import pytest

from trainguard.instrumentation.recent import RecentMean, RecentMedian


def test_it_holds_the_last_seconds_of_observations() -> None:
    recent = RecentMedian(10.0, min_count=2, max_count=100)
    assert recent.median() is None
    for at in range(20):  # one a second: 1.0 for ten seconds, then 3.0
        recent.add(float(at), 1.0 if at < 10 else 3.0)
    assert len(recent) == 11 and recent.median() == 3.0  # seconds 9..19: one 1.0 left
    recent.add(20.0, 2.0)
    assert len(recent) == 11 and recent.median() == 3.0


def test_an_even_count_takes_the_middle_two_and_values_leave_in_arrival_order() -> None:
    recent = RecentMedian(100.0, min_count=1, max_count=4)
    for at, value in enumerate([5.0, 1.0, 4.0, 2.0, 3.0]):  # the 5.0 leaves: four at most
        recent.add(float(at), value)
    assert len(recent) == 4 and recent.median() == pytest.approx(2.5)


def test_long_steps_keep_the_minimum_however_old() -> None:
    recent = RecentMedian(10.0, min_count=3, max_count=100)
    for at, value in enumerate([1.0, 2.0, 9.0, 9.0]):
        recent.add(60.0 * at, value)  # a step a minute
    assert len(recent) == 3 and recent.median() == 9.0


def test_it_is_ready_once_its_window_has_filled() -> None:
    """A rank's first seconds are all its window holds: a burst then would be most of them."""
    recent = RecentMedian(10.0, min_count=3, max_count=100)
    for at in range(10):  # one a second: nine seconds since the first
        recent.add(float(at), 1.0)
        assert not recent.ready
    recent.add(10.0, 1.0)
    assert recent.ready
    recent.add(11.0, 1.0)  # it stays ready as old ones leave
    assert recent.ready and len(recent) == 11

    long_steps = RecentMedian(10.0, min_count=3, max_count=100)
    for at in range(2):  # a step a minute: the second spans the window
        assert not long_steps.ready
        long_steps.add(60.0 * at, 1.0)
    assert long_steps.ready

    short_steps = RecentMedian(10.0, min_count=1, max_count=4)
    for at in range(4):  # four in a second fill it at its most
        assert not short_steps.ready
        short_steps.add(at / 4, 1.0)
    assert short_steps.ready


def test_a_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="bad window"):
        RecentMedian(10.0, min_count=5, max_count=4)
    with pytest.raises(ValueError, match="bad window"):
        RecentMedian(0.0, min_count=1, max_count=4)


def test_the_usual_batch_is_the_mean_of_the_latest_counts() -> None:
    usual = RecentMean(3)
    assert usual.mean() is None
    for value in (9.0, 1.0, 2.0, 3.0):  # the 9.0 leaves: three at most
        usual.add(value)
    assert len(usual) == 3 and usual.mean() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="bad window"):
        RecentMean(0)
