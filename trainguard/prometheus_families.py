"""prometheus_client metric families built from the contract's :class:`MetricSpec`.

This module imports ``prometheus_client``, which the core package does not depend on (the
core is the standard library and PyYAML). Import it only from the components whose extras
include prometheus-client: the exporter, the instrumentation and the remediation service.

:func:`family` is the one place a custom collector's metric family is made from a spec: it
picks the family class by ``spec.kind`` (counter, gauge, info, histogram) and passes the name
prometheus_client wants (``spec.client_name``), so the exposed series are ``spec.sample_names``
and no caller appends ``_total`` or ``_info`` or chooses between ``name`` and ``client_name``.

:func:`family` returns a plain :class:`Metric`, since the kind is only known at run time.
Callers that add samples use :func:`counter_family`, :func:`gauge_family`,
:func:`info_family` or :func:`histogram_family`: the same family, typed for its
``add_metric``, after checking that the spec is of that kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric

from trainguard.contract import MetricKind, MetricSpec

F = TypeVar("F", bound=Metric)

__all__ = [
    "counter_family",
    "family",
    "gauge_family",
    "histogram_family",
    "info_family",
]


def family(
    spec: MetricSpec,
    *,
    labels: Sequence[str] | None = None,
    value: float | Mapping[str, str] | None = None,
) -> Metric:
    """A fresh metric family for ``spec``, empty unless ``value`` is given.

    ``labels`` are the family's label names, ``spec.labels`` by default; pass them when the
    series also carry the emitting process's identity labels. ``value`` makes the family a
    single unlabelled sample: a number for counters and gauges, a ``{label: value}`` mapping
    for info metrics; it cannot be given with label names, nor for a histogram.
    """
    names = tuple(spec.labels if labels is None else labels)
    if value is not None and names:
        raise ValueError(f"{spec.name}: a value is one unlabelled sample, but labels {names}")
    label_names = None if value is not None else names
    if spec.kind is MetricKind.HISTOGRAM:
        if value is not None:
            raise ValueError(f"{spec.name}: a histogram family takes no single value")
        return HistogramMetricFamily(spec.client_name, spec.documentation, labels=label_names)
    if spec.kind is MetricKind.INFO:
        if value is not None and not isinstance(value, Mapping):
            raise TypeError(f"{spec.name}: an info value is a mapping of labels to values")
        info_value = None if value is None else dict(value)
        return InfoMetricFamily(
            spec.client_name, spec.documentation, value=info_value, labels=label_names
        )
    if isinstance(value, Mapping):
        raise TypeError(f"{spec.name}: a {spec.kind.value} value is a number")
    if spec.kind is MetricKind.COUNTER:
        return CounterMetricFamily(
            spec.client_name, spec.documentation, value=value, labels=label_names
        )
    return GaugeMetricFamily(spec.client_name, spec.documentation, value=value, labels=label_names)


def _of_kind(
    spec: MetricSpec,
    kind: MetricKind,
    cls: type[F],
    labels: Sequence[str] | None,
    value: float | Mapping[str, str] | None,
) -> F:
    if spec.kind is not kind:
        raise ValueError(f"{spec.name} is a {spec.kind.value}, not a {kind.value}")
    metric = family(spec, labels=labels, value=value)
    if not isinstance(metric, cls):  # family() picks the class by kind: never taken
        raise TypeError(f"{spec.name}: expected {cls.__name__}, got {type(metric).__name__}")
    return metric


def counter_family(
    spec: MetricSpec, *, labels: Sequence[str] | None = None, value: float | None = None
) -> CounterMetricFamily:
    """:func:`family` for a counter spec (``ValueError`` for any other kind)."""
    return _of_kind(spec, MetricKind.COUNTER, CounterMetricFamily, labels, value)


def gauge_family(
    spec: MetricSpec, *, labels: Sequence[str] | None = None, value: float | None = None
) -> GaugeMetricFamily:
    """:func:`family` for a gauge spec (``ValueError`` for any other kind)."""
    return _of_kind(spec, MetricKind.GAUGE, GaugeMetricFamily, labels, value)


def info_family(
    spec: MetricSpec,
    *,
    labels: Sequence[str] | None = None,
    value: Mapping[str, str] | None = None,
) -> InfoMetricFamily:
    """:func:`family` for an info spec (``ValueError`` for any other kind)."""
    return _of_kind(spec, MetricKind.INFO, InfoMetricFamily, labels, value)


def histogram_family(
    spec: MetricSpec, *, labels: Sequence[str] | None = None
) -> HistogramMetricFamily:
    """:func:`family` for a histogram spec (``ValueError`` for any other kind)."""
    return _of_kind(spec, MetricKind.HISTOGRAM, HistogramMetricFamily, labels, None)
