"""The noise of a healthy training job, for the demo trainer (and anything that simulates ranks).

A detector tuned on a job whose ranks all take exactly the same time raises nothing on it and
proves nothing. Real jobs are noisy in ways that look, for a moment, like a fault; each part of
:class:`Noise` models one of them, is a setting, and says in docs/demo.md ("A healthy job's
noise") where its figure comes from:

- ``sigma``: every step of every rank takes a lognormal factor of its compute (heavy-tailed
  step times), and about one step in ``outlier_every`` is an outlier of 2-3x;
- ``skewed_rank`` / ``skew``: one rank is slower for the whole run, within tolerance (a slower
  GPU, a hotter slot);
- ``batch_cv`` / ``attention_share``: a step's batch varies in size (variable sequence
  lengths), differently on every rank, and its cost follows the size, a little more than in
  proportion (attention's share of the compute grows with the length);
- ``gc_every`` / ``gc_seconds``, ``eval_every`` / ``eval_seconds``: whole-job pauses (a garbage
  collection, an evaluation) that slow every rank together at the same step;
- ``neighbour_node``: a noisy neighbour process on one node slows its ranks' compute by
  ``burst_factor`` in bursts of up to ``burst_seconds`` (a transient, not a straggler).

Every draw is a pure function of ``(seed, step, rank)`` (or of the seed and the wall time for
the bursts), so a rank restarted from a checkpoint replays the same noise, and two runs with one
seed see the same job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from dataclasses import dataclass


class NoiseError(ValueError):
    """A noise specification that cannot be read."""


@dataclass(frozen=True)
class Burst:
    """One noisy-neighbour burst: ``start`` seconds into the job, for ``seconds``."""

    start: float
    seconds: float

    def covers(self, elapsed: float) -> bool:
        return self.start <= elapsed < self.start + self.seconds


@dataclass(frozen=True)
class StepDraw:
    """One rank's step under the noise: its batch's size relative to the mean, and how many
    times its nominal compute it takes."""

    batch_size: float
    compute_factor: float


@dataclass(frozen=True)
class Noise:
    """A healthy job's noise. ``Noise()`` is the realistic model; ``Noise.none()`` is silence."""

    seed: int = 0
    sigma: float = 0.02
    outlier_every: int = 1000
    outlier_low: float = 2.0
    outlier_high: float = 3.0
    skewed_rank: int | None = 1
    skew: float = 1.04
    batch_cv: float = 0.08
    attention_share: float = 0.15
    gc_every: int = 50
    gc_seconds: float = 0.05
    eval_every: int = 0
    eval_seconds: float = 0.0
    neighbour_node: str | None = None
    burst_seconds: float = 20.0
    burst_gap_seconds: float = 120.0
    # Bursts are at least this far apart: two bursts a few seconds apart are one burst of twice
    # the length, longer than the transient the model stands for.
    burst_min_gap_seconds: float = 40.0
    burst_factor: float = 1.5

    def __post_init__(self) -> None:
        checks = {
            "sigma": self.sigma >= 0,
            "outlier_every": self.outlier_every >= 0,
            "outlier_low": 1 <= self.outlier_low <= self.outlier_high,
            "skew": self.skew > 0,
            "batch_cv": 0 <= self.batch_cv < 1,
            "attention_share": 0 <= self.attention_share <= 1,
            "gc_every": self.gc_every >= 0 and self.gc_seconds >= 0,
            "eval_every": self.eval_every >= 0 and self.eval_seconds >= 0,
            "burst_seconds": self.burst_seconds > 0
            and 0 <= self.burst_min_gap_seconds < self.burst_gap_seconds,
            "burst_factor": self.burst_factor >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise NoiseError(f"noise settings out of range: {', '.join(bad)} ({self})")

    @classmethod
    def none(cls) -> Noise:
        """No noise at all: every rank takes exactly its compute, every step."""
        return cls(
            sigma=0.0,
            outlier_every=0,
            skewed_rank=None,
            batch_cv=0.0,
            gc_every=0,
            gc_seconds=0.0,
        )

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> Noise:
        """``"none"``, ``"default"`` (or empty), or ``default`` overridden by ``key=value`` pairs
        separated by commas: ``"sigma=0.05,skew=1.03,neighbour_node=node-b"``. A key set to
        ``none`` clears it (``skewed_rank=none``)."""
        text = text.strip()
        if text == "none":
            return dataclasses.replace(cls.none(), seed=seed)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, object] = {"seed": seed}
        for item in filter(None, (part.strip() for part in text.split(","))):
            if item == "default":
                continue
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in fields or key == "seed":
                known = ", ".join(name for name in fields if name != "seed")
                raise NoiseError(f"bad noise setting {item!r}: expected key=value, keys: {known}")
            values[key] = _value(fields[key], raw.strip())
        try:
            return cls(**values)  # type: ignore[arg-type]
        except TypeError as error:
            raise NoiseError(f"bad noise settings {text!r}: {error}") from error

    def _uniforms(self, *key: int) -> list[float]:
        """Six uniform draws in (0, 1), a pure function of the seed and ``key``: a hash, not a
        generator, so each (step, rank) draw is independent of call order and costs one digest."""
        digest = hashlib.blake2b(repr((self.seed, *key)).encode(), digest_size=48).digest()
        return [
            (int.from_bytes(digest[i : i + 8], "little") + 0.5) / 2**64 for i in range(0, 48, 8)
        ]

    @staticmethod
    def _normal(first: float, second: float) -> float:
        """A standard normal from two uniforms (Box-Muller)."""
        return math.sqrt(-2 * math.log(first)) * math.cos(2 * math.pi * second)

    def draw(self, step: int, rank: int) -> StepDraw:
        """This rank's batch size at ``step`` and how much compute it takes (bursts aside)."""
        u = self._uniforms(step, rank)
        size = max(0.1, 1.0 + self.batch_cv * self._normal(u[2], u[3]))
        factor = math.exp(self.sigma * self._normal(u[0], u[1]))
        # The batch's cost: linear in its size, but for attention's part, quadratic in it.
        factor *= size * (1.0 - self.attention_share + self.attention_share * size)
        if self.outlier_every and u[4] < 1.0 / self.outlier_every:
            factor *= self.outlier_low + (self.outlier_high - self.outlier_low) * u[5]
        if rank == self.skewed_rank:
            factor *= self.skew
        return StepDraw(size, factor)

    def batch_size(self, step: int, rank: int) -> float:
        """The size of this rank's batch at ``step`` (its sequence length, padded per batch),
        relative to the mean, kept positive."""
        return self.draw(step, rank).batch_size

    def compute_factor(self, step: int, rank: int) -> float:
        """How many times its nominal compute this rank's ``step`` takes (bursts aside)."""
        return self.draw(step, rank).compute_factor

    def pause_seconds(self, step: int) -> float:
        """Seconds every rank pauses before ``step`` (a collection, an evaluation): the whole
        job together."""
        pause = 0.0
        if step > 0 and self.gc_every and step % self.gc_every == 0:
            pause += self.gc_seconds
        if step > 0 and self.eval_every and step % self.eval_every == 0:
            pause += self.eval_seconds
        return pause

    def bursts(self, until: float) -> list[Burst]:
        """The neighbour's bursts that start before ``until`` seconds into the job: gaps of
        ``burst_gap_seconds`` on average and at least ``burst_min_gap_seconds``, lengths up to
        ``burst_seconds``."""
        if self.neighbour_node is None:
            return []
        # Bursts are a property of the job, not of a rank: one generator, seeded once.
        draw = random.Random(f"{self.seed}:neighbour")
        rate = 1.0 / (self.burst_gap_seconds - self.burst_min_gap_seconds)
        found: list[Burst] = []
        at = draw.expovariate(rate)
        while at < until:
            seconds = draw.uniform(self.burst_seconds / 4, self.burst_seconds)
            found.append(Burst(at, seconds))
            at += seconds + self.burst_min_gap_seconds + draw.expovariate(rate)
        return found

    def neighbour_factor(self, node: str, elapsed: float) -> float:
        """How many times slower a rank on ``node`` computes ``elapsed`` seconds into the job."""
        if node != self.neighbour_node:
            return 1.0
        if any(burst.covers(elapsed) for burst in self.bursts(elapsed + 1.0)):
            return self.burst_factor
        return 1.0


def _value(field: dataclasses.Field[object], raw: str) -> object:
    if raw.lower() == "none":
        return None
    kind = str(field.type)
    try:
        if "float" in kind:
            return float(raw)
        if "int" in kind:
            return int(raw)
    except ValueError as error:
        raise NoiseError(f"bad noise setting {field.name}={raw!r}: {error}") from error
    return raw
