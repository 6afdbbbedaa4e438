"""The contract's own invariants: prefix, units, counter suffixes, uniqueness, label rules."""

from __future__ import annotations

import re

from trainguard import contract

ALL = contract.RANK_METRICS + contract.NODE_METRICS
BASE_UNITS = ("_seconds", "_bytes", "_ratio", "_celsius", "_watts", "_total", "_info", "_joules")


def test_names_are_unique_and_prefixed() -> None:
    names = [spec.name for spec in ALL]
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"trainguard_[a-z0-9_]+", name), name


def test_counters_end_in_total_and_client_name_drops_it() -> None:
    for spec in ALL:
        if spec.kind is contract.MetricKind.COUNTER:
            assert spec.name.endswith("_total"), spec.name
            assert spec.client_name + "_total" == spec.name
        else:
            assert not spec.name.endswith("_total"), spec.name


def test_histograms_use_base_units() -> None:
    for spec in ALL:
        if spec.kind is contract.MetricKind.HISTOGRAM:
            assert spec.name.endswith(BASE_UNITS), spec.name


def test_no_forbidden_labels() -> None:
    for spec in ALL:
        for label in spec.labels:
            assert label not in ("job", "step", "tensor", "instance"), (spec.name, label)


def test_alerts_are_camel_case() -> None:
    for alert in contract.Alert:
        assert re.fullmatch(r"[A-Z][A-Za-z]+", alert.value), alert
