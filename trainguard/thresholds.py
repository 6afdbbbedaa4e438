"""The thresholds every judgement of trainguard uses, typed, from one file.

``trainguard/thresholds.yml``, beside this module, is the one place a threshold lives: the alert
rules are rendered from it, and ``trainguard diagnose`` and ``trainguard triage`` judge by the
same values. Where a consumer needs a different value on purpose, the file has its own key for
it, with the reason beside it. The file is read once, where a program starts (a command, the
service's settings, a benchmark), and the ``Thresholds`` are passed down from there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

# Where the packaged thresholds live: beside this module, in the core every component reads.
DEFAULT_PACKAGE = "trainguard"
DEFAULT_FILE = "thresholds.yml"

_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
_DURATION_UNIT = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
    "y": 365 * 86400,
}


# The keys no one failure owns: every rate's window, a rank's warm-up, where alerts' scheduler
# labels come from, the reliability rules' pace and the runbook's address. Every other key is
# named by the failure that judges by it (``contract.FailureSpec.thresholds``).
GENERAL_KEYS = (
    "rate_window",
    "warmup_steps",
    "scheduler_labels_window",
    "reliability_interval",
    "runbook_base_url",
)


class ThresholdsError(ValueError):
    """The thresholds file is missing a key, has an unknown one, or a value of the wrong type."""


@dataclass(frozen=True)
class Thresholds:
    """The contents of ``thresholds.yml`` (see the comments there for what each one means)."""

    rate_window: str
    warmup_steps: int
    straggler_factor: float
    straggler_min_ranks: int
    straggler_for: str
    straggler_recent_factor: float
    straggler_recent_for: str
    straggler_recent_resolve_factor: float
    straggler_recent_resolve_window: str
    collective_stall_floor_seconds: float
    collective_stall_step_multiplier: float
    collective_stall_for: str
    nccl_timeout_window: str
    stalled_seconds: float
    stalled_for: str
    rank_down_for: str
    rank_absent_window: str
    rank_restart_window: str
    oom_window: str
    oom_risk_headroom_ratio: float
    oom_risk_predict_headroom_ratio: float
    oom_risk_predict_window: str
    oom_risk_predict_horizon_seconds: float
    oom_risk_for: str
    dataloader_wait_ratio: float
    dataloader_for: str
    fragmentation_ratio: float
    fragmentation_retry_window: str
    fragmentation_for: str
    xid_window: str
    xid_critical: tuple[int, ...]
    thermal_throttle_reasons: str
    thermal_for: str
    nvml_down_for: str
    nccl_socket_transport: str
    nccl_socket_for: str
    scheduler_labels_window: str
    reliability_interval: str
    runbook_base_url: str

    @classmethod
    def from_mapping(cls, data: object) -> Thresholds:
        if not isinstance(data, dict):
            raise ThresholdsError("thresholds must be a mapping of key: value")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        missing = sorted(names - set(data))
        if unknown or missing:
            raise ThresholdsError(f"unknown keys {unknown}, missing keys {missing}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            values[f.name] = _coerce(f.name, str(f.type), data[f.name])
        return cls(**values)

    @classmethod
    def load(cls, path: Path) -> Thresholds:
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ThresholdsError(f"{path}: not valid YAML: {error}") from error
        return cls.from_mapping(data)


def _coerce(name: str, type_name: str, value: object) -> object:
    if type_name == "str":
        if not isinstance(value, str) or not value:
            raise ThresholdsError(f"{name}: expected a non-empty string, got {value!r}")
        if (name.endswith(("_for", "_window")) or name == "rate_window") and not _DURATION.match(
            value
        ):
            raise ThresholdsError(f"{name}: {value!r} is not a Prometheus duration")
        return value
    if type_name == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ThresholdsError(f"{name}: expected a non-negative integer, got {value!r}")
        return value
    if type_name == "float":
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ThresholdsError(f"{name}: expected a positive number, got {value!r}")
        return float(value)
    if not isinstance(value, list) or not value or not all(isinstance(v, int) for v in value):
        raise ThresholdsError(f"{name}: expected a non-empty list of integers, got {value!r}")
    return tuple(value)


def default_path() -> Path:
    """The packaged thresholds file."""
    return Path(str(resources.files(DEFAULT_PACKAGE) / DEFAULT_FILE))


def load_default() -> Thresholds:
    """The packaged thresholds (what the committed rules were rendered from)."""
    return Thresholds.load(default_path())


def duration_seconds(duration: str) -> float:
    """A Prometheus duration of the thresholds file (``15m``, ``1h30m``) in seconds."""
    return sum(int(n) * _DURATION_UNIT[unit] for n, unit in _DURATION_PART.findall(duration))
