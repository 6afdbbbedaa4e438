"""MetricSpec's names: the family name for prometheus_client and the series Prometheus stores."""

from __future__ import annotations

import pytest

from trainguard import contract
from trainguard.contract import MetricKind, MetricSpec

ALL = contract.RANK_METRICS + contract.NODE_METRICS + contract.REMEDIATION_METRICS


def test_sample_names_by_kind() -> None:
    assert contract.STEPS.sample_names == ("trainguard_steps_total",)
    assert contract.GPU_UP.sample_names == ("trainguard_gpu_up",)
    assert contract.RANK_INFO.sample_names == ("trainguard_rank_info",)
    assert contract.STEP_DURATION.sample_names == (
        "trainguard_step_duration_seconds_bucket",
        "trainguard_step_duration_seconds_sum",
        "trainguard_step_duration_seconds_count",
    )


def test_client_name_drops_the_suffix_prometheus_client_adds() -> None:
    assert contract.STEPS.client_name == "trainguard_steps"
    assert contract.RANK_INFO.client_name == "trainguard_rank"
    assert contract.GPU_UP.client_name == "trainguard_gpu_up"
    assert contract.STEP_DURATION.client_name == "trainguard_step_duration_seconds"


def test_histogram_series_names() -> None:
    spec = contract.GRAD_SYNC_DURATION
    assert spec.bucket_name == spec.name + "_bucket"
    assert spec.sum_name == spec.name + "_sum"
    assert spec.count_name == spec.name + "_count"


@pytest.mark.parametrize("spec", [contract.STEPS, contract.GPU_UP, contract.RANK_INFO])
def test_histogram_series_names_refuse_other_kinds(spec: MetricSpec) -> None:
    for attribute in ("bucket_name", "sum_name", "count_name"):
        with pytest.raises(ValueError, match="not a histogram"):
            getattr(spec, attribute)


def test_every_contract_metric_stores_its_name_or_histogram_series() -> None:
    for spec in ALL:
        if spec.kind is MetricKind.HISTOGRAM:
            assert spec.sample_names == tuple(
                spec.client_name + suffix for suffix in ("_bucket", "_sum", "_count")
            )
        else:
            assert spec.sample_names == (spec.name,)
        if spec.kind is MetricKind.COUNTER:
            assert spec.sample_names == (spec.client_name + "_total",)
        if spec.kind is MetricKind.INFO:
            assert spec.name.endswith("_info"), spec.name
            assert spec.sample_names == (spec.client_name + "_info",)


def test_the_stored_suffix_is_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="must end in '_total'"):
        MetricSpec("trainguard_things", MetricKind.COUNTER, "doc")
    with pytest.raises(ValueError, match="must end in '_info'"):
        MetricSpec("trainguard_thing", MetricKind.INFO, "doc")
    MetricSpec("trainguard_thing", MetricKind.GAUGE, "doc")


def test_helper_constructors_add_the_stored_suffix() -> None:
    assert contract.counter("things", "doc").name == "trainguard_things_total"
    assert contract.counter("things_total", "doc").name == "trainguard_things_total"
    assert contract.info("thing", "doc").name == "trainguard_thing_info"
    assert contract.info("thing_info", "doc").name == "trainguard_thing_info"
    # NCCL_INFO is declared as "nccl": its name is still what Prometheus stores.
    assert contract.NCCL_INFO.name == "trainguard_nccl_info"
    assert contract.NCCL_INFO.client_name == "trainguard_nccl"


def test_sample_names_are_unique_across_the_contract() -> None:
    names = [name for spec in ALL for name in spec.sample_names]
    assert len(names) == len(set(names))
