"""The Flight Recorder's effective state: torch's default per release, overridden by the env.

Pure: each case is an environment and a torch version string (the table in nccl_lint.py cites
the torch source each default comes from).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from tests.exporters.conftest import rank_env
from trainguard.exporters import nccl_lint
from trainguard.exporters.doctor import render
from trainguard.exporters.nccl_lint import (
    Check,
    flight_recorder_defaults,
    flight_recorder_state,
    installed_torch_version,
    lint_process,
)
from trainguard.exporters.procs import HostFacts, TrainingProcess

FR = "TORCH_FR_BUFFER_SIZE"
LEGACY = "TORCH_NCCL_TRACE_BUFFER_SIZE"


@pytest.mark.parametrize(
    ("torch_version", "entries"),
    [
        ("2.13.0+cpu", 2000),
        ("2.13.0", 2000),
        ("2.11.0", 2000),
        ("2.11.0a0+git70d99e9", 2000),
        ("3.0.0", 2000),
        ("2.10.0", 0),
        ("2.10.1+cu128", 0),
        ("2.8.0", 0),
        ("2.7.1", 0),
        ("2.4.0", 0),
    ],
)
def test_unset_means_the_default_of_that_torch_release(torch_version: str, entries: int) -> None:
    state = flight_recorder_state({}, torch_version)
    assert state.entries == entries
    assert state.enabled is (entries > 0)
    assert f"torch {torch_version}'s default is {entries}" in state.reason


@pytest.mark.parametrize("torch_version", [None, "", "nightly", "unknown"])
def test_unset_with_an_unknown_torch_is_unknown_not_off(torch_version: str | None) -> None:
    state = flight_recorder_state({}, torch_version)
    assert state.enabled is None
    assert state.entries is None
    assert "unknown" in state.reason
    assert "torch 2.11" in state.reason


@pytest.mark.parametrize("torch_version", ["2.13.0", "2.10.0", None])
def test_the_env_overrides_the_default(torch_version: str | None) -> None:
    off = flight_recorder_state({FR: "0"}, torch_version)
    assert (off.enabled, off.entries) == (False, 0)
    on = flight_recorder_state({FR: "500"}, torch_version)
    assert (on.enabled, on.entries) == (True, 500)
    assert on.reason == f"{FR}=500"


def test_the_new_name_wins_over_the_old_one_where_torch_reads_both() -> None:
    env = {FR: "0", LEGACY: "2000"}
    state = flight_recorder_state(env, "2.13.0")
    assert (state.enabled, state.entries) == (False, 0)
    assert state.reason == f"{FR}=0, which overrides {LEGACY}"
    assert flight_recorder_state({LEGACY: "2000"}, "2.9.0").enabled is True
    assert flight_recorder_state({LEGACY: "0"}, "2.13.0").enabled is False


def test_torch_before_2_8_reads_only_the_old_name() -> None:
    ignored = flight_recorder_state({FR: "2000"}, "2.7.1")
    assert (ignored.enabled, ignored.entries) == (False, 0)
    assert f"ignores {FR}" in ignored.reason
    assert ignored.variable == LEGACY
    assert flight_recorder_state({FR: "2000", LEGACY: "100"}, "2.7.1").entries == 100
    # ...and on 2.13 the old name alone still works, the new one is what to set.
    assert flight_recorder_state({LEGACY: "100"}, "2.13.0").variable == FR


@pytest.mark.parametrize("value", ["", "off", "-1", "99999999999", " x2000"])
def test_values_torch_refuses_are_not_taken_for_on(value: str) -> None:
    state = flight_recorder_state({FR: value}, "2.13.0")
    assert state.enabled is None
    assert "not a buffer size torch accepts" in state.reason


def test_values_are_read_as_std_stoi_reads_them() -> None:
    assert flight_recorder_state({FR: " 2000 "}, "2.13.0").entries == 2000
    assert flight_recorder_state({FR: "+16"}, "2.13.0").entries == 16
    assert flight_recorder_state({FR: "12abc"}, "2.13.0").entries == 12


def test_the_default_table_is_ordered_newest_first_and_ends_with_a_catch_all() -> None:
    table = nccl_lint.FLIGHT_RECORDER_DEFAULTS
    assert [row.since for row in table] == sorted((row.since for row in table), reverse=True)
    assert table[-1].since == (0, 0)
    defaults = flight_recorder_defaults("2.13.0")
    assert defaults is not None
    assert (defaults.names, defaults.default_entries) == ((FR, LEGACY), 2000)
    assert flight_recorder_defaults(None) is None


def _fr_findings(env: dict[str, str], torch_version: str | None) -> list[nccl_lint.Finding]:
    process = TrainingProcess(7, rank_env(0, 0, **env))
    found = lint_process(process, HostFacts(), None, torch_version)
    return [f for f in found if f.check is Check.FLIGHT_RECORDER_OFF]


def test_the_check_fires_when_off_or_unknown_and_stays_quiet_when_on() -> None:
    assert _fr_findings({}, "2.13.0") == []
    assert _fr_findings({FR: "2000"}, "2.10.0") == []
    [off] = _fr_findings({}, "2.10.0")
    assert off.problem.startswith("the Flight Recorder is off (TORCH_FR_BUFFER_SIZE is unset")
    assert off.fix.startswith("set TORCH_FR_BUFFER_SIZE=2000 and TORCH_NCCL_DUMP_ON_TIMEOUT=1")
    [explicit_off] = _fr_findings({FR: "0"}, "2.13.0")
    assert "off (TORCH_FR_BUFFER_SIZE=0)" in explicit_off.problem
    [old] = _fr_findings({FR: "2000"}, "2.7.1")
    assert old.fix.startswith("set TORCH_NCCL_TRACE_BUFFER_SIZE=2000")
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in old.fix
    [unknown] = _fr_findings({}, None)
    assert unknown.problem.startswith("the Flight Recorder may be off")
    assert "explicitly" in unknown.fix
    assert len(_fr_findings({FR: "junk"}, "2.13.0")) == 1


def test_doctor_states_the_torch_default_it_judged_against() -> None:
    processes = [TrainingProcess(1, rank_env(0, 0))]
    on = render(processes, 0, HostFacts(), None, torch_version="2.13.0+cpu")
    assert "torch: 2.13.0+cpu (Flight Recorder by default: 2000 entries" in on.text
    assert "flight_recorder_off" not in on.text
    off = render(processes, 0, HostFacts(), None, torch_version="2.10.0")
    assert "torch: 2.10.0 (Flight Recorder by default: off" in off.text
    assert "[flight_recorder_off] rank 0 (pid 1)" in off.text
    unknown = render(processes, 0, HostFacts(), None, torch_version=None)
    assert "torch: not installed here" in unknown.text
    assert "the Flight Recorder may be off" in unknown.text


def test_installed_torch_version_reads_metadata_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert installed_torch_version() is None
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+cpu")
    assert installed_torch_version() == "2.13.0+cpu"


def test_doctor_never_imports_torch(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys").mkdir()
    script = (
        "import sys\n"
        "from trainguard.cli import main\n"
        f"main(['doctor', '--proc-root', {str(tmp_path / 'proc')!r},"
        f" '--sys-root', {str(tmp_path / 'sys')!r}, '--no-latency'])\n"
        "assert 'torch' not in sys.modules, 'doctor imported torch'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "torch: " in done.stdout
