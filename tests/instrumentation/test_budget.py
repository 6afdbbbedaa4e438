"""The per-rank cardinality budget (``contract.RANK_SERIES_BUDGET``), held by real ranks.

Each test instruments a real model, trains a few steps, reads the rank's own ``/metrics`` over
HTTP as Prometheus would (text format) and counts the series Prometheus would store: one per
sample line. The default exposition must fit the budget; with the opt-in detail on
(``TRAINGUARD_METRICS_DETAIL=1``) the count is reported and held to
``contract.RANK_DETAIL_SERIES_BUDGET``.
"""

from __future__ import annotations

import collections
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from torch import nn

import trainguard
from tests.instrumentation import scenarios
from tests.instrumentation.harness import run_ranks
from trainguard import contract

STEPS = 6


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text: str = response.read().decode()
    return text


def series_by_family(exposition: str) -> dict[str, int]:
    """Series per metric family of a text exposition (one per sample: what Prometheus stores)."""
    counts: collections.Counter[str] = collections.Counter()
    for family in text_string_to_metric_families(exposition):
        counts[family.name] += len(family.samples)
    return dict(counts)


def _sample_names(exposition: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(exposition) for s in f.samples}


def _plain_rank(detail: bool) -> str:
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id="budget",
        node="node-a",
        metrics_port=0,
        metrics_addr="127.0.0.1",
        registry=CollectorRegistry(),
        metrics_detail=detail,
    )
    try:
        for step in range(STEPS):
            optimizer.zero_grad()
            model(torch.full((4, 16), float(step))).mean().backward()
            optimizer.step()
        handle.flush()
        assert handle.metrics_port is not None
        return _scrape(handle.metrics_port)
    finally:
        handle.uninstrument()


def _ddp_rank(rank: int, world: int, out: Path, detail: bool) -> dict[str, Any]:
    model = scenarios.make_ddp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    handle = trainguard.instrument(
        model,
        optimizer,
        job_id="budget-ddp",
        node="node-a",
        metrics_port=0,
        metrics_addr="127.0.0.1",
        registry=CollectorRegistry(),
        metrics_detail=detail,
    )
    try:
        scenarios.train(model, optimizer, STEPS, rank)
        scenarios.publish_last_timers(model, rank)
        handle.flush()
        assert handle.metrics_port is not None
        return {"exposition": _scrape(handle.metrics_port)}
    finally:
        handle.uninstrument()


def _assert_default_shape(exposition: str) -> None:
    counts = series_by_family(exposition)
    total = sum(counts.values())
    assert total <= contract.RANK_SERIES_BUDGET, (total, counts)
    names = _sample_names(exposition)
    # Nothing outside the contract, no _created series, and the detail families without
    # buckets but with the _sum and _count the rules' means read.
    contract_names = {n for spec in contract.RANK_METRICS for n in spec.sample_names}
    assert names <= contract_names, names - contract_names
    for spec in contract.DETAIL_HISTOGRAMS:
        assert spec.bucket_name not in names, spec.name
        assert {spec.sum_name, spec.count_name} <= names, spec.name
    for spec in contract.BUCKETED_HISTOGRAMS:
        assert spec.bucket_name in names, spec.name


def _assert_detail_shape(exposition: str, default_total: int) -> int:
    counts = series_by_family(exposition)
    total = sum(counts.values())
    assert default_total < total <= contract.RANK_DETAIL_SERIES_BUDGET, (total, counts)
    names = _sample_names(exposition)
    for spec in contract.DETAIL_HISTOGRAMS:
        assert spec.bucket_name in names, spec.name
    phase_buckets = [
        s
        for f in text_string_to_metric_families(exposition)
        for s in f.samples
        if s.name == contract.STEP_PHASE_DURATION.bucket_name
    ]
    assert {s.labels[contract.LABEL_PHASE] for s in phase_buckets} == {
        p.value for p in contract.Phase
    }
    return total


def test_a_plain_rank_fits_the_budget_and_the_detail_is_bounded(
    record_property: Any,
) -> None:
    default = _plain_rank(detail=False)
    _assert_default_shape(default)
    default_total = sum(series_by_family(default).values())
    detailed_total = _assert_detail_shape(_plain_rank(detail=True), default_total)
    record_property("plain_series_default", default_total)
    record_property("plain_series_detail", detailed_total)
    print(f"plain rank: {default_total} series by default, {detailed_total} with detail")


def test_the_detail_switch_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.ENV_METRICS_DETAIL, "1")
    model = nn.Linear(4, 1)
    handle = trainguard.instrument(
        model, job_id="env", metrics_port=-1, registry=CollectorRegistry()
    )
    try:
        assert handle.metrics.detail
    finally:
        handle.uninstrument()
    monkeypatch.setenv(contract.ENV_METRICS_DETAIL, "0")
    handle = trainguard.instrument(
        model, job_id="env", metrics_port=-1, registry=CollectorRegistry()
    )
    try:
        assert not handle.metrics.detail
    finally:
        handle.uninstrument()


def test_ddp_ranks_fit_the_budget_and_the_detail_is_bounded(
    tmp_path: Path, record_property: Any
) -> None:
    default = run_ranks(_ddp_rank, 2, tmp_path / "default", detail=False)
    detailed = run_ranks(_ddp_rank, 2, tmp_path / "detail", detail=True)
    for rank, (plain, rich) in enumerate(zip(default, detailed, strict=True)):
        _assert_default_shape(plain["exposition"])
        names = _sample_names(plain["exposition"])
        # A DDP rank reports its collective progress and its gradient syncs within the budget.
        assert contract.COLLECTIVES_LAUNCHED.name in names
        default_total = sum(series_by_family(plain["exposition"]).values())
        detailed_total = _assert_detail_shape(rich["exposition"], default_total)
        record_property(f"ddp_rank{rank}_series_default", default_total)
        record_property(f"ddp_rank{rank}_series_detail", detailed_total)
        print(f"ddp rank {rank}: {default_total} series by default, {detailed_total} with detail")
