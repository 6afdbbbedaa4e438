"""The remediation section of the contract keeps the contract's rules."""

from __future__ import annotations

import re

from trainguard import contract


def test_remediation_metrics_follow_the_conventions() -> None:
    others = {spec.name for spec in contract.RANK_METRICS + contract.NODE_METRICS}
    names = [spec.name for spec in contract.REMEDIATION_METRICS]
    assert len(set(names)) == len(names) and not set(names) & others
    for spec in contract.REMEDIATION_METRICS:
        assert re.fullmatch(r"trainguard_remediation_[a-z0-9_]+", spec.name), spec.name
        assert spec.name.endswith("_total") == (spec.kind is contract.MetricKind.COUNTER)
        if spec.kind is contract.MetricKind.HISTOGRAM:
            assert spec.name.endswith("_seconds"), spec.name
        assert not set(spec.labels) & {"job", "step", "instance"}, spec.name
