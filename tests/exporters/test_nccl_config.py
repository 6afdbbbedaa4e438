"""The NCCL configuration lint, its collector, /proc and /sys reading, and `trainguard doctor`."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.exporters.conftest import (
    StaticProcesses,
    make_context,
    one,
    rank_env,
    registry_of,
    scrape,
    values,
    well_configured,
)
from trainguard import contract
from trainguard.cli import main as cli_main
from trainguard.exporters import nccl_lint
from trainguard.exporters.collectors.nccl_config import NcclConfigCollector
from trainguard.exporters.doctor import render
from trainguard.exporters.nccl_lint import (
    RUNBOOK_URLS,
    Check,
    Latency,
    RankMetricsLatency,
    histogram_p99,
    lint_process,
)
from trainguard.exporters.procs import (
    HostFacts,
    ProcfsSource,
    SysfsHost,
    TrainingProcess,
    parent_pid,
    parse_environ,
)

IB_HOST = HostFacts(ib_devices=("mlx5_0", "mlx5_1"), interfaces=("eth0", "ib0"))


def _checks(
    env: dict[str, str],
    host: HostFacts = IB_HOST,
    p99: float | None = None,
    torch_version: str | None = "2.13.0",
) -> set[Check]:
    latency = Latency(p99) if p99 is not None else None
    process = TrainingProcess(4242, env)
    return {f.check for f in lint_process(process, host, latency, torch_version)}


def test_a_well_configured_rank_passes_every_check() -> None:
    assert _checks(well_configured(0, 0), p99=0.2) == set()


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, Check.ASYNC_ERROR_HANDLING_OFF),
        ({"NCCL_ASYNC_ERROR_HANDLING": "0"}, Check.ASYNC_ERROR_HANDLING_OFF),
        ({"NCCL_IB_DISABLE": "1"}, Check.IB_DISABLED_WITH_IB_DEVICES),
        ({"NCCL_SOCKET_IFNAME": ""}, Check.SOCKET_IFNAME_UNSET),
        ({"TORCH_FR_BUFFER_SIZE": "0"}, Check.FLIGHT_RECORDER_OFF),
        ({"NCCL_DEBUG": "WARN"}, Check.NCCL_DEBUG_FILE_UNSET),
        ({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "0.5"}, Check.TIMEOUT_VS_LATENCY),
        ({contract.ENV_STALL_FLOOR: "86400"}, Check.TIMEOUT_VS_LATENCY),
    ],
)
def test_each_check_fires_on_its_setting(change: dict[str, str], check: Check) -> None:
    assert _checks({**well_configured(0, 0), **change}, p99=0.2) == {check}


def test_checks_that_need_host_facts_or_latency_stay_quiet_without_them() -> None:
    env = {**well_configured(0, 0), "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": ""}
    assert _checks(env, HostFacts(interfaces=("eth0",))) == set()
    slow = {**well_configured(0, 0), "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "1"}
    assert _checks(slow, p99=None) == set()


def test_unset_variables_count_as_off() -> None:
    # The Flight Recorder's default depends on the torch release (tests/exporters/
    # test_flight_recorder.py): off before 2.11, and unknown without a version.
    for torch_version in ("2.10.0", None):
        assert _checks(rank_env(0, 0), IB_HOST, torch_version=torch_version) == {
            Check.SOCKET_IFNAME_UNSET,
            Check.FLIGHT_RECORDER_OFF,
            Check.NCCL_DEBUG_FILE_UNSET,
        }
    assert _checks(rank_env(0, 0), IB_HOST, torch_version="2.13.0") == {
        Check.SOCKET_IFNAME_UNSET,
        Check.NCCL_DEBUG_FILE_UNSET,
    }


def test_findings_carry_a_fix_and_a_runbook_link() -> None:
    env = {**rank_env(3, 3), "NCCL_IB_DISABLE": "1"}
    for finding in lint_process(TrainingProcess(7, env), IB_HOST, None):
        assert finding.fix and finding.problem
        assert finding.runbook_url.startswith("https://")
        assert finding.rank == "3"
    assert set(RUNBOOK_URLS) == set(Check)


def test_histogram_p99() -> None:
    buckets = [(0.1, 50.0), (0.5, 98.0), (1.0, 100.0), (float("inf"), 100.0)]
    assert histogram_p99(buckets) == 1.0
    assert histogram_p99([(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert histogram_p99([(1.0, 1.0), (float("inf"), 100.0)]) is None  # beyond the last bound


@pytest.fixture
def rank_endpoint() -> Iterator[int]:
    """A training rank's /metrics with a grad-sync histogram whose p99 bucket is 0.5 s."""
    name = contract.GRAD_SYNC_DURATION.name
    body = (
        f"# TYPE {name} histogram\n"
        f'{name}_bucket{{job_id="j",rank="0",le="0.1"}} 90\n'
        f'{name}_bucket{{job_id="j",rank="0",le="0.5"}} 100\n'
        f'{name}_bucket{{job_id="j",rank="0",le="+Inf"}} 100\n'
        f'{name}_count{{job_id="j",rank="0"}} 100\n'
        f'{name}_sum{{job_id="j",rank="0"}} 9.5\n'
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            """Quiet."""

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_latency_is_read_from_the_ranks_own_endpoint(rank_endpoint: int) -> None:
    process = TrainingProcess(1, {**rank_env(0, 0), contract.ENV_METRICS_PORT: str(rank_endpoint)})
    assert RankMetricsLatency().latency(process) == Latency(0.5)
    assert RankMetricsLatency().latency(TrainingProcess(1, rank_env(0, 0))) is None


def test_collector_exports_one_gauge_per_check() -> None:
    processes = StaticProcesses(
        [
            TrainingProcess(100, well_configured(0, 0)),
            TrainingProcess(101, {**well_configured(1, 1), "NCCL_IB_DISABLE": "1"}),
        ]
    )
    context = make_context(processes=processes, host=IB_HOST)
    registry, _ = registry_of({"nccl_config": NcclConfigCollector(context, latencies=None)})
    samples = scrape(registry)
    warnings = values(samples, contract.NCCL_CONFIG_WARNINGS.name)
    assert len(warnings) == len(Check)
    assert (
        one(samples, contract.NCCL_CONFIG_WARNINGS.name, check="ib_disabled_with_ib_devices") == 1
    )
    assert sum(warnings.values()) == 1
    assert one(samples, contract.NCCL_CONFIG_PROCESSES.name) == 2
    link = one(
        samples,
        "trainguard_nccl_config_check_info",
        check="socket_ifname_unset",
        runbook_url=RUNBOOK_URLS[Check.SOCKET_IFNAME_UNSET],
    )
    assert link == 1.0


def _fake_proc(root: Path, pid: int, env: dict[str, str] | None, ppid: int = 1) -> None:
    folder = root / str(pid)
    folder.mkdir(parents=True)
    if env is not None:
        data = b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0"
        (folder / "environ").write_bytes(data)
    (folder / "stat").write_text(f"{pid} (pt_main thread) S {ppid} {pid} {pid} 0 -1 4194560\n")


def test_procfs_finds_training_ranks_only(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 10, rank_env(0, 0))
    _fake_proc(tmp_path, 11, {"PATH": "/usr/bin", "HOME": "/root"})
    _fake_proc(tmp_path, 12, rank_env(1, 1, TRAINGUARD_JOB_ID="job-7"))
    (tmp_path / "self").mkdir()
    (tmp_path / "13").mkdir()  # exited: no environ any more
    scan = ProcfsSource(tmp_path).scan()
    assert [p.pid for p in scan.processes] == [10, 12]
    assert scan.processes[1].job_id == "job-7"
    assert scan.processes[0].job_id == "llama-7b-run-42"  # torchrun's run id otherwise


def test_a_ranks_own_children_are_not_other_ranks(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 10, rank_env(0, 0))
    _fake_proc(tmp_path, 11, rank_env(0, 0), ppid=10)  # its DataLoader worker
    _fake_proc(tmp_path, 12, rank_env(1, 1), ppid=10)  # a rank started by a rank: kept
    _fake_proc(tmp_path, 13, rank_env(0, 0), ppid=99)  # same rank of another launcher: kept
    assert [p.pid for p in ProcfsSource(tmp_path).scan().processes] == [10, 12, 13]
    assert parent_pid("7 (a) b) c) S 42 7 7 0") == 42
    assert parent_pid("garbage") == 0


def test_unreadable_processes_are_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_proc(tmp_path, 10, rank_env(0, 0))
    _fake_proc(tmp_path, 20, rank_env(1, 1))
    original = Path.read_bytes

    def guarded(self: Path) -> bytes:
        if self.parent.name == "20":
            raise PermissionError(13, "Permission denied", str(self))
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", guarded)
    scan = ProcfsSource(tmp_path).scan()
    assert [p.pid for p in scan.processes] == [10]
    assert scan.unreadable == 1


def test_parse_environ_skips_malformed_entries() -> None:
    assert parse_environ(b"A=1\0junk\0=x\0B=two=2\0\xff=\xfe\0") == {
        "A": "1",
        "B": "two=2",
        "\ufffd": "\ufffd",
    }


def test_sysfs_host_facts(tmp_path: Path) -> None:
    (tmp_path / "class/infiniband/mlx5_0").mkdir(parents=True)
    for iface, state in (("lo", "unknown"), ("eth0", "up"), ("ib0", "up"), ("eth1", "down")):
        (tmp_path / "class/net" / iface).mkdir(parents=True)
        (tmp_path / "class/net" / iface / "operstate").write_text(state + "\n")
    (tmp_path / "class/net/docker0").mkdir()
    assert SysfsHost(tmp_path).facts() == HostFacts(("mlx5_0",), ("eth0", "ib0"))
    assert SysfsHost(tmp_path / "missing").facts() == HostFacts()


def test_doctor_report_names_ranks_and_fixes() -> None:
    processes = [
        TrainingProcess(100, {**well_configured(0, 0), "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}),
        TrainingProcess(101, {**well_configured(1, 1), "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}),
    ]
    report = render(processes, 3, IB_HOST, None, torch_version="2.13.0+cpu")
    assert "[async_error_handling_off] rank 0 (pid 100), rank 1 (pid 101)" in report.text
    assert "fix:     unset TORCH_NCCL_ASYNC_ERROR_HANDLING" in report.text
    assert "3 process(es) could not be read" in report.text
    assert len(report.findings) == 2
    clean = render(
        [TrainingProcess(1, well_configured(0, 0))], 0, IB_HOST, None, torch_version="2.13.0"
    )
    assert clean.findings == []
    assert "All NCCL configuration checks passed." in clean.text


def test_doctor_command_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    sys_root.mkdir()
    args = ["doctor", "--proc-root", str(proc), "--sys-root", str(sys_root), "--no-latency"]
    monkeypatch.setattr(nccl_lint, "installed_torch_version", lambda: "2.10.0")
    assert cli_main(args) == 0
    assert "No training process" in capsys.readouterr().out
    _fake_proc(proc, 10, rank_env(0, 0))
    assert cli_main(args) == 1
    out = capsys.readouterr().out
    assert "torch: 2.10.0 (Flight Recorder by default: off" in out
    assert "[flight_recorder_off] rank 0 (pid 10)" in out
    assert "TORCH_FR_BUFFER_SIZE is unset: torch 2.10.0's default is 0" in out
    assert "TORCH_FR_BUFFER_SIZE=2000" in out
    # The same rank under torch 2.13, whose Flight Recorder keeps 2000 entries by default.
    monkeypatch.setattr(nccl_lint, "installed_torch_version", lambda: "2.13.0+cpu")
    assert cli_main(args) == 1  # NCCL_DEBUG_FILE is still unset
    out = capsys.readouterr().out
    assert "torch: 2.13.0+cpu (Flight Recorder by default: 2000 entries" in out
    assert "flight_recorder_off" not in out
