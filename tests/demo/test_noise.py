"""The healthy noise model: its draws, its parts' sizes and its settings."""

from __future__ import annotations

import itertools
import statistics

import pytest

from trainguard.demo.noise import Noise, NoiseError
from trainguard.demo.train import parse_args

STEPS = range(20_000)


def factors(noise: Noise, rank: int) -> list[float]:
    return [noise.compute_factor(step, rank) for step in STEPS]


def test_draws_replay_for_a_seed_and_differ_across_seeds_and_ranks() -> None:
    noise = Noise(seed=7)
    assert factors(noise, 0)[:50] == factors(Noise(seed=7), 0)[:50]
    assert factors(noise, 0)[:50] != factors(Noise(seed=8), 0)[:50]
    assert factors(noise, 0)[:50] != factors(noise, 2)[:50]


def test_a_healthy_rank_is_heavy_tailed_around_one() -> None:
    noise = Noise(skewed_rank=None)
    drawn = factors(noise, 0)
    assert statistics.median(drawn) == pytest.approx(1.0, abs=0.01)
    spread = statistics.pstdev(drawn)
    # lognormal 0.02 and batch 0.08 together (0.082), a little more with the outliers
    assert 0.075 < spread < 0.12
    outliers = [f for f in drawn if f >= 1.8]
    # about one step in a thousand is an outlier of 2-3x (20 expected in 20,000)
    assert 8 <= len(outliers) <= 35
    assert max(outliers) < 3.5


def test_the_skewed_rank_is_slower_by_its_skew_for_the_whole_run() -> None:
    noise = Noise(skewed_rank=1, skew=1.04)
    skewed, healthy = factors(noise, 1), factors(noise, 3)
    ratio = statistics.median(skewed) / statistics.median(healthy)
    assert ratio == pytest.approx(1.04, abs=0.005)
    # in every stretch of the run, not on average only
    for first in range(0, len(STEPS), 5000):
        part = slice(first, first + 5000)
        assert statistics.mean(skewed[part]) > statistics.mean(healthy[part])


def test_none_is_silence() -> None:
    noise = Noise.none()
    assert {noise.compute_factor(step, rank) for step in range(500) for rank in range(4)} == {1.0}
    assert {noise.pause_seconds(step) for step in range(500)} == {0.0}
    assert noise.bursts(10_000) == []


def test_pauses_stop_every_rank_at_the_same_steps() -> None:
    noise = Noise(gc_every=50, gc_seconds=0.05, eval_every=200, eval_seconds=2.0)
    pauses = {step: noise.pause_seconds(step) for step in range(1, 401)}
    assert {step for step, pause in pauses.items() if pause} == {*range(50, 401, 50)}
    assert pauses[200] == pytest.approx(2.05)
    assert pauses[50] == pytest.approx(0.05)
    assert noise.pause_seconds(0) == 0.0


def test_a_noisy_neighbour_slows_one_node_in_short_bursts() -> None:
    noise = Noise(neighbour_node="node-b", burst_seconds=20, burst_gap_seconds=120)
    bursts = noise.bursts(3600)
    assert 15 <= len(bursts) <= 45  # about one per 120 s gap plus its length
    assert all(5 <= burst.seconds <= 20 for burst in bursts)
    inside = bursts[3].start + bursts[3].seconds / 2
    outside = bursts[3].start - 1
    assert noise.neighbour_factor("node-b", inside) == 1.5
    assert noise.neighbour_factor("node-a", inside) == 1.0
    assert noise.neighbour_factor("node-b", outside) == 1.0
    busy = sum(burst.seconds for burst in bursts) / 3600
    assert 0.05 < busy < 0.2  # a transient: most of the hour the node is quiet


@pytest.mark.parametrize("seed", range(20))
def test_bursts_never_run_into_one_another(seed: int) -> None:
    # Exponential gaps alone put two bursts a second apart now and then: 40 s of contention, no
    # longer the transient of at most 20 s the model stands for.
    noise = Noise(seed=seed, neighbour_node="node-b")
    bursts = noise.bursts(6 * 3600)
    gaps = [b.start - (a.start + a.seconds) for a, b in itertools.pairwise(bursts)]
    assert min(gaps) >= noise.burst_min_gap_seconds == 40
    mean_gap = sum(gaps) / len(gaps)
    assert 90 < mean_gap < 150  # still about burst_gap_seconds on average
    with pytest.raises(NoiseError, match="burst_seconds"):
        Noise(burst_gap_seconds=30, burst_min_gap_seconds=40)


def test_parse_overrides_the_default_and_says_what_is_wrong() -> None:
    noise = Noise.parse("sigma=0.05, skewed_rank=none, neighbour_node=node-b", seed=3)
    assert (noise.sigma, noise.skewed_rank, noise.neighbour_node, noise.seed) == (
        0.05,
        None,
        "node-b",
        3,
    )
    assert noise.skew == Noise().skew
    assert Noise.parse("default") == Noise()
    assert Noise.parse("") == Noise()
    assert Noise.parse("none") == Noise.none()
    with pytest.raises(NoiseError, match=r"bad noise setting 'sigmaa=1'.*keys: sigma"):
        Noise.parse("sigmaa=1")
    with pytest.raises(NoiseError, match="sigma='x'"):
        Noise.parse("sigma=x")
    with pytest.raises(NoiseError, match="out of range: skew"):
        Noise.parse("skew=-1")
    with pytest.raises(NoiseError, match="bad noise setting 'seed=1'"):
        Noise.parse("seed=1")


def test_the_trainer_reads_its_noise_and_refuses_a_bad_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse_args(["--checkpoint-dir", "x", "--noise", "sigma=0.1", "--seed", "4"])
    assert args.noise == Noise(sigma=0.1, seed=4)
    assert parse_args(["--checkpoint-dir", "x"]).noise == Noise()
    with pytest.raises(SystemExit):
        parse_args(["--checkpoint-dir", "x", "--noise", "loud=1"])
    assert "bad noise setting 'loud=1'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--checkpoint-dir", "x", "--compute-share", "1.5"])
