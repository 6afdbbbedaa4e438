"""``MetricSpec``: one metric of the contract, and the constructors every metric section uses."""

from __future__ import annotations

import enum
from dataclasses import dataclass

PREFIX = "trainguard_"


class MetricKind(str, enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    INFO = "info"


# The suffix Prometheus stores after a family's name (prometheus_client adds it).
_STORED_SUFFIX: dict[MetricKind, str] = {MetricKind.COUNTER: "_total", MetricKind.INFO: "_info"}


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the contract: its exposed name, type, help text and extra labels.

    Names, by what they are for:

    - ``name``: the name a query uses. For counters, gauges and info metrics it is the one
      sample name Prometheus stores (counters end in ``_total``, info metrics in ``_info``,
      which construction checks); for histograms it is the base the
      ``_bucket``/``_sum``/``_count`` series share.
    - ``client_name``: the metric family name prometheus_client takes (``Counter(...)``,
      ``Info(...)``, ...), which adds ``_total`` / ``_info`` itself. Metric families are
      built by ``trainguard.prometheus_families.family``, which picks it for you.
    - ``sample_names``: every sample name Prometheus stores for the family.
    - ``bucket_name`` / ``sum_name`` / ``count_name``: a histogram's three series.

    ``labels`` are the labels beyond the identity labels of the emitting process.
    """

    name: str
    kind: MetricKind
    documentation: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        suffix = _STORED_SUFFIX.get(self.kind)
        if suffix is not None and not self.name.endswith(suffix):
            raise ValueError(f"{self.kind.value} {self.name!r} must end in {suffix!r}")

    @property
    def client_name(self) -> str:
        """The family name for prometheus_client: ``name`` without ``_total`` / ``_info``."""
        return self.name.removesuffix(_STORED_SUFFIX.get(self.kind, ""))

    @property
    def sample_names(self) -> tuple[str, ...]:
        """Every sample name Prometheus stores for this metric.

        Counters: ``(<base>_total,)``; gauges: ``(<name>,)``; info: ``(<base>_info,)``;
        histograms: ``(<name>_bucket, <name>_sum, <name>_count)``. A ``_created`` series,
        which prometheus_client may add to counters and histograms, is not part of the
        contract and is not listed.
        """
        if self.kind is MetricKind.HISTOGRAM:
            return (self.bucket_name, self.sum_name, self.count_name)
        return (self.name,)

    def _histogram_series(self, suffix: str) -> str:
        if self.kind is not MetricKind.HISTOGRAM:
            raise ValueError(f"{self.name} is a {self.kind.value}, not a histogram")
        return self.name + suffix

    @property
    def bucket_name(self) -> str:
        """A histogram's ``<name>_bucket`` series (``ValueError`` for other kinds)."""
        return self._histogram_series("_bucket")

    @property
    def sum_name(self) -> str:
        """A histogram's ``<name>_sum`` series (``ValueError`` for other kinds)."""
        return self._histogram_series("_sum")

    @property
    def count_name(self) -> str:
        """A histogram's ``<name>_count`` series (``ValueError`` for other kinds)."""
        return self._histogram_series("_count")


def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    """A counter; ``name`` with or without its ``_total``."""
    full = PREFIX + name.removesuffix("_total") + "_total"
    return MetricSpec(full, MetricKind.COUNTER, doc, labels)


def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(PREFIX + name, MetricKind.GAUGE, doc, labels)


def histogram(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(PREFIX + name, MetricKind.HISTOGRAM, doc, labels)


def info(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    """An info metric; ``name`` with or without its ``_info``."""
    full = PREFIX + name.removesuffix("_info") + "_info"
    return MetricSpec(full, MetricKind.INFO, doc, labels)
