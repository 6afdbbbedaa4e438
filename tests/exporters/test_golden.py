"""The whole exposition, compared with a golden file and checked by ``promtool check metrics``.

Regenerate the golden file after an intended change with
``TRAINGUARD_UPDATE_GOLDEN=1 .venv/bin/pytest tests/exporters/test_golden.py`` and review the diff.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from tests.exporters.conftest import (
    StaticProcesses,
    make_context,
    rank_env,
    registry_of,
    require_binary,
    well_configured,
)
from trainguard.exporters.fake import FakeProvider
from trainguard.exporters.procs import HostFacts, TrainingProcess
from trainguard.exporters.provider import ThrottleReason
from trainguard.exporters.registry import registered

HERE = Path(__file__).parent
GOLDEN = HERE / "golden" / "exposition.prom"
GOLDEN_DCGM = HERE / "golden" / "exposition-dcgm.prom"
# dcgm-exporter's own names break Prometheus conventions on purpose (dashboards rely on them);
# these are the only complaints promtool may have about them.
DCGM_LINT = (
    "label names should be written in 'snake_case' not 'camelCase'",
    "metric name should not include type 'counter'",
)


def _exposition(tmp_path: Path, dcgm_compat: bool) -> str:
    for name in ("nccl-2.18.5-ib.log", "nccl-2.7.8-socket.log", "nccl-warnings.log"):
        shutil.copy(HERE / "fixtures" / name, tmp_path / name)
    provider = FakeProvider(gpus=2)
    provider.processes = {0: (4100,), 1: (4101,)}
    provider.throttled = {1: frozenset({ThrottleReason.SW_POWER_CAP})}
    provider.xids = {(1, 79): 1}
    processes = StaticProcesses(
        [
            TrainingProcess(4100, well_configured(0, 0)),
            TrainingProcess(4101, {**rank_env(1, 1), "NCCL_IB_DISABLE": "1"}),
        ]
    )
    context = make_context(
        provider,
        processes,
        HostFacts(ib_devices=("mlx5_0",), interfaces=("eth0", "ib0")),
        dcgm_compat=dcgm_compat,
        nccl_log_globs=(str(tmp_path / "*.log"),),
        nccl_poll_seconds=None,
    )
    collectors = {name: spec.factory(context) for name, spec in registered().items()}
    registry, supervisor = registry_of(collectors)
    try:
        return generate_latest(registry).decode()
    finally:
        supervisor.close()


@pytest.mark.parametrize(("golden", "dcgm_compat"), [(GOLDEN, False), (GOLDEN_DCGM, True)])
def test_exposition_matches_the_golden_file(
    tmp_path: Path, golden: Path, dcgm_compat: bool
) -> None:
    text = _exposition(tmp_path, dcgm_compat)
    if os.environ.get("TRAINGUARD_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()


def _promtool(exposition: bytes) -> tuple[int, list[str]]:
    promtool = require_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition,
        capture_output=True,
        timeout=60,
        check=False,
    )
    output = (result.stdout + result.stderr).decode()
    return result.returncode, [line for line in output.splitlines() if line.strip()]


def test_golden_file_passes_promtool() -> None:
    assert _promtool(GOLDEN.read_bytes()) == (0, [])


def test_dcgm_golden_file_parses_and_only_breaks_dcgm_conventions() -> None:
    _, problems = _promtool(GOLDEN_DCGM.read_bytes())
    assert problems  # promtool did look at the DCGM names
    for problem in problems:
        assert problem.startswith("DCGM_FI_") and problem.endswith(DCGM_LINT), problem


def test_promtool_catches_broken_expositions() -> None:
    code, problems = _promtool(b"# TYPE trainguard_bad counter\ntrainguard_bad 1\n")
    assert code != 0 and 'counter metrics should have "_total" suffix' in problems[0]
    code, problems = _promtool(b"trainguard_bad{gpu=0} 1\n")
    assert code != 0 and "error while linting" in problems[0]


@pytest.mark.parametrize(
    ("golden", "needle"),
    [
        (GOLDEN, 'provider="fake"'),
        (GOLDEN, 'trainguard_nccl_info{channels="4"'),
        (GOLDEN, 'trainguard_gpu_process_info{gpu="1"'),
        (GOLDEN, 'trainguard_nccl_config_warnings{check="ib_disabled_with_ib_devices"} 1.0'),
        (GOLDEN_DCGM, "DCGM_FI_DEV_FB_USED{"),
    ],
)
def test_golden_files_cover_every_collector(golden: Path, needle: str) -> None:
    assert needle in golden.read_text()
