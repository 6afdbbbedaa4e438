"""trainguard.prometheus_families: one family per spec, exposing exactly spec.sample_names."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from trainguard import contract
from trainguard.contract import MetricKind, MetricSpec
from trainguard.prometheus_families import (
    counter_family,
    family,
    gauge_family,
    histogram_family,
    info_family,
)

ALL = contract.RANK_METRICS + contract.NODE_METRICS + contract.REMEDIATION_METRICS
CLASSES = {
    MetricKind.COUNTER: CounterMetricFamily,
    MetricKind.GAUGE: GaugeMetricFamily,
    MetricKind.INFO: InfoMetricFamily,
    MetricKind.HISTOGRAM: HistogramMetricFamily,
}


class _Static(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def _exposition(*families: Metric) -> str:
    registry = CollectorRegistry()
    registry.register(_Static(families))
    return generate_latest(registry).decode()


def _filled(spec: MetricSpec, metric: Metric) -> Metric:
    values = [f"v{i}" for i in range(len(spec.labels))]
    if isinstance(metric, HistogramMetricFamily):
        metric.add_metric(values, buckets=[("1.0", 1.0), ("+Inf", 2.0)], sum_value=3.0)
    elif isinstance(metric, InfoMetricFamily):
        metric.add_metric(values, {})
    elif isinstance(metric, CounterMetricFamily | GaugeMetricFamily):
        metric.add_metric(values, 1.0)
    return metric


def _hand_built(spec: MetricSpec) -> Metric:
    """How call sites built families before the helper (the behaviour it must keep)."""
    if spec.kind is MetricKind.COUNTER:
        return CounterMetricFamily(spec.client_name, spec.documentation, labels=spec.labels)
    if spec.kind is MetricKind.INFO:
        return InfoMetricFamily(spec.client_name, spec.documentation, labels=spec.labels)
    if spec.kind is MetricKind.HISTOGRAM:
        return HistogramMetricFamily(spec.name, spec.documentation, labels=spec.labels)
    return GaugeMetricFamily(spec.name, spec.documentation, labels=spec.labels)


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.name)
def test_family_class_follows_the_kind(spec: MetricSpec) -> None:
    metric = family(spec)
    assert type(metric) is CLASSES[spec.kind]
    assert metric.name == spec.client_name
    assert metric.documentation == spec.documentation
    assert metric.samples == []


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.name)
def test_family_exposes_exactly_the_sample_names(spec: MetricSpec) -> None:
    text = _exposition(_filled(spec, family(spec)))
    (parsed,) = text_string_to_metric_families(text)
    assert {s.name for s in parsed.samples} == set(spec.sample_names)
    for sample in parsed.samples:
        assert sorted(k for k in sample.labels if k != "le") == sorted(spec.labels)


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.name)
def test_family_exposition_equals_the_hand_built_one(spec: MetricSpec) -> None:
    helped = _exposition(_filled(spec, family(spec)))
    assert helped == _exposition(_filled(spec, _hand_built(spec)))


def test_labels_override_the_specs() -> None:
    labels = [*contract.RANK_IDENTITY_LABELS, *contract.COLLECTIVES_LAUNCHED.labels]
    metric = counter_family(contract.COLLECTIVES_LAUNCHED, labels=labels)
    metric.add_metric(["j", "0", "0", "n"], 5.0)
    assert _exposition(metric).splitlines()[-1] == (
        'trainguard_collectives_launched_total{job_id="j",local_rank="0",node="n",rank="0"} 5.0'
    )


def test_value_makes_one_unlabelled_sample() -> None:
    gauge = gauge_family(contract.REMEDIATION_DRY_RUN, value=1)
    assert [(s.name, s.labels, s.value) for s in gauge.samples] == [
        (contract.REMEDIATION_DRY_RUN.name, {}, 1)
    ]
    counter = counter_family(contract.NCCL_LOG_BYTES, value=7)
    assert [(s.name, s.value) for s in counter.samples] == [(contract.NCCL_LOG_BYTES.name, 7)]
    info = MetricSpec("trainguard_test_info", MetricKind.INFO, "test")
    assert "trainguard_test_info 1.0" in _exposition(info_family(info, value={}))


def test_value_with_label_names_is_refused() -> None:
    with pytest.raises(ValueError, match="unlabelled"):
        gauge_family(contract.REMEDIATION_ACTIONS, value=1)
    with pytest.raises(ValueError, match="histogram"):
        family(contract.STEP_DURATION, labels=(), value=1.0)
    with pytest.raises(TypeError):
        family(contract.REMEDIATION_DRY_RUN, value={"a": "b"})
    with pytest.raises(TypeError):
        family(contract.RANK_INFO, labels=(), value=1.0)


@pytest.mark.parametrize(
    ("typed", "spec"),
    [
        (counter_family, contract.GPU_UP),
        (gauge_family, contract.STEPS),
        (info_family, contract.STEPS),
        (histogram_family, contract.RANK_INFO),
    ],
)
def test_typed_helpers_check_the_kind(typed: object, spec: MetricSpec) -> None:
    assert callable(typed)
    with pytest.raises(ValueError, match=f"is a {spec.kind.value}"):
        typed(spec)


def test_typed_helpers_return_their_class() -> None:
    assert isinstance(counter_family(contract.STEPS), CounterMetricFamily)
    assert isinstance(gauge_family(contract.GPU_UP), GaugeMetricFamily)
    assert isinstance(info_family(contract.RANK_INFO), InfoMetricFamily)
    assert isinstance(histogram_family(contract.STEP_DURATION), HistogramMetricFamily)
