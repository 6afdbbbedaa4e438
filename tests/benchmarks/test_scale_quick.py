"""The scale benchmark's simulated fleet, and a quick run of ``benchmarks/scale.py`` at 8 ranks
against the real Prometheus with the shipped rules.

The fleet test builds the fleet from a real rank's exposition (the hook in a child process) and
drives its clock by hand: no server, no sleeping. The quick run uses 2 s scrape and evaluation
intervals and caps every alert's ``for`` at 10 s; the rules' expressions and windows are the
shipped ones. No timing is asserted (see docs/benchmarks.md: timing claims come from the
benchmark's own runs). Without the ``prometheus`` binary the quick run skips (fails under
``TRAINGUARD_REQUIRE_BINARIES=1``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from benchmarks import fleet_template
from benchmarks.fleet import Fleet, Workload
from benchmarks.fleet_template import Template, capture, rank_identity
from tests.alerts.tools import REPO, binary
from trainguard import contract
from trainguard.demo.noise import Noise

LINE = re.compile(
    r"ranks=(\d+) head_series=(\d+) series_per_rank=(\d+\.\d) max_rule_eval_s=(\d+\.\d{3}) "
    r"straggler_alert_s=(\S+) stall_alert_s=(\S+) false_alerts=(\d+)"
)
RANKS = 8
JOB = "quick"
STEP = 0.5


def _samples(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an OpenMetrics body, by name and labels."""
    families = text_string_to_metric_families(body.decode())  # type: ignore[no-untyped-call]
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in families
        for sample in family.samples
    }


def _value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, rank: int
) -> float:
    return samples[(name, frozenset(rank_identity(JOB, rank).items()))]


@pytest.fixture(scope="module")
def template() -> Template:
    captured = capture(RANKS, JOB)
    return Template(captured.exposition, captured.content_type)


def test_each_rank_serves_the_captured_series_under_its_own_identity(template: Template) -> None:
    fleet = Fleet(template, RANKS, JOB, slow_rank=2, hung_rank=5, start=0.0)
    captured = _samples(fleet.render(0, 0.0))
    assert len(captured) == len(template.initial)
    for rank in range(RANKS):
        identity = rank_identity(JOB, rank)
        served = _samples(fleet.render(rank, 0.0))
        # The same series as rank 0, with this rank's identity in place of rank 0's.
        assert {(n, _without(labels, identity)) for n, labels in served} == {
            (n, _without(labels, rank_identity(JOB, 0))) for n, labels in captured
        }
        assert _value(served, contract.RANK_INDEX.name, rank) == rank
        assert _value(served, contract.WORLD_SIZE.name, rank) == RANKS


def _without(
    labels: frozenset[tuple[str, str]], identity: dict[str, str]
) -> frozenset[tuple[str, str]]:
    assert set(identity.items()) <= labels, (labels, identity)
    return labels - set(identity.items())


def test_ranks_advance_and_the_faults_slow_one_rank_and_hang_another(template: Template) -> None:
    fleet = Fleet(
        template, RANKS, JOB, slow_rank=2, hung_rank=5, workload=Workload(step_seconds=STEP),
        stall_floor_seconds=30.0, start=0.0,
    )  # fmt: skip
    before = _samples(fleet.render(1, 60.0))
    steps = _value(before, contract.STEPS.name, 1)
    # A step takes step_seconds and the wait for the slowest of the 8 ranks (a few percent).
    assert 60 / STEP * 0.8 < steps <= 60 / STEP
    assert _value(before, contract.STEP_DURATION.count_name, 1) == steps
    assert _value(before, contract.LAST_STEP_TIMESTAMP.name, 1) > 55.0
    assert _value(before, contract.COLLECTIVES_LAUNCHED.name, 1) > 0

    fleet.start_faults(60.0)
    at_fault = {rank: _samples(fleet.render(rank, 60.0)) for rank in range(RANKS)}
    later = {rank: _samples(fleet.render(rank, 120.0)) for rank in range(RANKS)}

    def compute_mean(rank: int) -> float:
        spec = contract.STEP_COMPUTE_DURATION
        total = _value(later[rank], spec.sum_name, rank) - _value(
            at_fault[rank], spec.sum_name, rank
        )
        count = _value(later[rank], spec.count_name, rank) - _value(
            at_fault[rank], spec.count_name, rank
        )
        return total / count

    healthy = [rank for rank in range(RANKS) if rank not in (2, 5)]
    # The slowed rank computes longer than every healthy rank, by about the slow factor.
    assert compute_mean(2) > 1.5 * max(compute_mean(rank) for rank in healthy)
    # ... and spends the largest share of its step on its own work (the hook's gauge): the
    # others wait for it.
    share = {r: _value(later[r], contract.STEP_COMPUTE_SHARE.name, r) for r in range(RANKS)}
    assert share[2] > 1.5 * max(share[rank] for rank in healthy)
    assert min(share[rank] for rank in healthy) > 0
    for rank in healthy:
        assert _value(later[rank], contract.STEPS.name, rank) > _value(
            at_fault[rank], contract.STEPS.name, rank
        )
    # The hung rank stopped: no step, no collective launched, one collective ageing in flight.
    for name in (
        contract.STEPS.name,
        contract.LAST_STEP_TIMESTAMP.name,
        contract.COLLECTIVES_LAUNCHED.name,
    ):
        assert _value(later[5], name, 5) == _value(at_fault[5], name, 5)
    assert _value(later[5], contract.COLLECTIVE_INFLIGHT.name, 5) == 1.0
    assert _value(later[5], contract.COLLECTIVE_OLDEST_INFLIGHT.name, 5) == pytest.approx(60.0)
    assert _value(later[5], contract.COLLECTIVE_STALLS.name, 5) == 1.0
    # It launched fewer collectives than any other rank (the rules' suspect).
    assert _value(later[5], contract.COLLECTIVES_LAUNCHED.name, 5) < min(
        _value(later[rank], contract.COLLECTIVES_LAUNCHED.name, rank) for rank in healthy
    )


def test_the_noise_model_drives_the_fleet_s_compute(template: Template) -> None:
    # Rank 3 is the model's persistently slower rank; node-0001 (ranks 8-15) has a noisy
    # neighbour that slows its ranks 2x in bursts.
    noise = Noise(skewed_rank=3, skew=1.3, neighbour_node="node-0001", burst_factor=2.0)
    ranks, horizon = 16, 600.0
    fleet = Fleet(
        template, ranks, JOB, slow_rank=2, hung_rank=5, workload=Workload(step_seconds=STEP),
        start=0.0, noise=noise,
    )  # fmt: skip
    spec = contract.STEP_COMPUTE_DURATION

    def compute_means(start: float, end: float) -> list[float]:
        first = [_samples(fleet.render(rank, start)) for rank in range(ranks)]
        last = [_samples(fleet.render(rank, end)) for rank in range(ranks)]
        return [
            (_value(last[r], spec.sum_name, r) - _value(first[r], spec.sum_name, r))
            / (_value(last[r], spec.count_name, r) - _value(first[r], spec.count_name, r))
            for r in range(ranks)
        ]

    burst = noise.bursts(horizon)[1]
    quiet_before = burst.start - 30.0
    means = compute_means(quiet_before - 25.0, quiet_before)
    others = sorted(m for r, m in enumerate(means) if r != 3)
    assert means[3] / others[len(others) // 2] == pytest.approx(1.3, abs=0.1)
    inside = compute_means(burst.start + 1.0, burst.start + burst.seconds - 1.0)
    neighbours = [inside[r] for r in range(8, 16)]
    quiet = [inside[r] for r in range(8) if r != 3]
    assert min(neighbours) > 1.6 * max(quiet)


def test_an_unreadable_exposition_is_a_clear_error() -> None:
    with pytest.raises(fleet_template.FleetError, match="not a sample line"):
        Template("{oops} 1\n", "text/plain")


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_at_8_ranks_only_the_slowed_and_the_hung_rank_alert(tmp_path: Path) -> None:
    binary("prometheus")
    report = tmp_path / "scale.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", "--sizes", str(RANKS), "--no-reference",
         "--scrape-interval", "2s", "--eval-interval", "2s", "--for-cap", "10s",
         "--warmup", "15", "--step-seconds", "0.2", "--settle", "10",
         "--alert-margin", "400", "--workdir", str(tmp_path), "--json", str(report)],
        capture_output=True, text=True, timeout=850, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-6000:]
    (line,) = done.stdout.splitlines()
    match = LINE.fullmatch(line)
    assert match, line
    assert int(match.group(1)) == RANKS and int(match.group(2)) > 0
    result = json.loads(report.read_text())["results"][0]
    fired = {(alert["alertname"], alert["rank"]) for alert in result["alerts"]}
    assert fired == {
        (contract.Alert.TRAINING_STRAGGLER.value, str(result["slow_rank"])),
        (contract.Alert.TRAINING_COLLECTIVE_STALLED.value, str(result["hung_rank"])),
    }, result["alerts"]
    assert result["false_alerts"] == 0 and match.group(7) == "0"
    # Both alerts fired after the faults started, and the figures were read.
    assert all(alert["seconds"] > 0 for alert in result["alerts"])
    assert float(match.group(5)) > 0 and float(match.group(6)) > 0
    assert result["rule_group_max_s"] and result["prometheus_rss_bytes"] > 0
    # The run's folders were removed: nothing left but the report.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["scale.json"]
