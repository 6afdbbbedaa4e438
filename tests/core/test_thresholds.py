"""The typed thresholds: the packaged file loads, and its durations convert to seconds."""

from __future__ import annotations

import pytest

from trainguard.thresholds import duration_seconds, load_default


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [("30s", 30), ("15m", 900), ("1h30m", 5400), ("500ms", 0.5), ("1d", 86400)],
)
def test_prometheus_durations_convert_to_seconds(duration: str, seconds: float) -> None:
    assert duration_seconds(duration) == pytest.approx(seconds)


def test_every_window_of_the_packaged_file_converts() -> None:
    t = load_default()
    assert duration_seconds(t.fragmentation_retry_window) > 0
    assert duration_seconds(t.oom_risk_predict_window) > duration_seconds(t.rate_window)
