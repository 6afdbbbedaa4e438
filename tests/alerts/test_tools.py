"""The test helpers: PromQL metric-name extraction and the binary gate must not be lenient."""

from __future__ import annotations

import pytest

from tests.alerts.tools import binary, exposed_names, metric_names


def test_metric_names_finds_bare_and_selected_series() -> None:
    expr = (
        'sum by (job_id, rank) (rate(trainguard_steps_total{job_id=~"$job_id"}[5m]))\n'
        "/ on (job_id) group_left () level:some_metric:op > bool 0.5 and up offset 5m"
    )
    assert metric_names(expr) == {"trainguard_steps_total", "level:some_metric:op", "up"}


def test_metric_names_ignores_functions_labels_strings_and_numbers() -> None:
    expr = (
        'label_replace(clamp_min(a - on (x) sum without (y) (b{phase=~"data|forward"}), 8e9),'
        ' "phase", "backward", "", "") unless ignoring (le) histogram_quantile(0.9, c_bucket)'
    )
    assert metric_names(expr) == {"a", "b", "c_bucket"}


def test_exposed_names_expand_histograms_and_info() -> None:
    names = exposed_names()
    assert "trainguard_step_duration_seconds_bucket" in names
    assert "trainguard_step_duration_seconds" not in names
    assert "trainguard_nccl_info" in names
    assert "trainguard_gpu_process_info" in names


def test_missing_binary_skips_or_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINGUARD_REQUIRE_BINARIES", raising=False)
    with pytest.raises(pytest.skip.Exception):
        binary("trainguard-no-such-binary")
    monkeypatch.setenv("TRAINGUARD_REQUIRE_BINARIES", "1")
    with pytest.raises(pytest.fail.Exception):
        binary("trainguard-no-such-binary")
