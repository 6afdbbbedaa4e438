"""GPU -> Slurm job: the cgroup and environment parsers on fixtures, and the slurm_job collector
on the fake GPU provider with a made-up /proc.

The cgroup fixtures follow the layouts of Slurm's cgroup/v1 plugin
(``/slurm[_<node>]/uid_<uid>/job_<job>/step_<step>/task_<task>``, one line per hierarchy) and
cgroup/v2 plugin (``0::/system.slice/[<node>_]slurmstepd.scope/job_<job>/step_<step>/user/
task_<task>``, ``task_special`` for adopted processes), as in Slurm's source and its cgroup v2
guide. No real slurmd ran here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.exporters.conftest import (
    StaticHost,
    StaticProcesses,
    make_context,
    one,
    rank_env,
    registry_of,
    scrape,
    values,
)
from trainguard import contract
from trainguard.exporters.collectors.slurm_job import ScannedEnvironments, SlurmJobCollector
from trainguard.exporters.fake import FakeProvider
from trainguard.exporters.procs import ProcfsSource, TrainingProcess
from trainguard.exporters.registry import ExporterContext, ExporterSettings, registered
from trainguard.exporters.slurm import SlurmStep, from_environ, parse_cgroup, slurm_step_of

INFO = contract.GPU_SLURM_JOB_INFO.name
UNMAPPED = contract.GPU_SLURM_UNMAPPED_PROCESSES.name

V1_TASK = """\
12:hugetlb:/
11:pids:/system.slice/slurmd.service
10:memory:/slurm/uid_1000/job_4242/step_0/task_1
9:devices:/slurm/uid_1000/job_4242/step_0
8:freezer:/slurm/uid_1000/job_4242/step_0
7:cpuset:/slurm/uid_1000/job_4242
4:cpu,cpuacct:/system.slice/slurmd.service
1:name=systemd:/system.slice/slurmd.service
"""
V1_JOB_LEVEL_ONLY = (
    "7:cpuset:/slurm/uid_1000/job_4242\n1:name=systemd:/system.slice/slurmd.service\n"
)
V1_MULTIPLE_SLURMD_BATCH = "8:freezer:/slurm_gpu-node-07/uid_1001/job_77/step_batch\n"
V2_TASK = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_1\n"
V2_ADOPTED = "0::/system.slice/slurmstepd.scope/job_4242/step_extern/user/task_special\n"
V2_MULTIPLE_SLURMD = (
    "0::/system.slice/gpu-node-07_slurmstepd.scope/job_9/step_interactive/user/task_0\n"
)
V2_FROM_A_CONTAINER = "0::/../../system.slice/slurmstepd.scope/job_4242/step_3/user/task_0\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V1_TASK, SlurmStep("4242", "0")),
        (V1_JOB_LEVEL_ONLY, SlurmStep("4242", "")),
        (V1_MULTIPLE_SLURMD_BATCH, SlurmStep("77", "batch")),
        (V2_TASK, SlurmStep("4242", "0")),
        (V2_ADOPTED, SlurmStep("4242", "extern")),
        (V2_MULTIPLE_SLURMD, SlurmStep("9", "interactive")),
        (V2_FROM_A_CONTAINER, SlurmStep("4242", "3")),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/system.slice/docker-4f2a9c.scope\n", None),
        ("0::/kubepods.slice/batch/job_12/step_1\n", None),  # not under a Slurm root
        ("0::/system.slice/slurmd.service\n", None),  # slurmd itself
        ("", None),
        ("garbage without colons\n\x00\xff", None),
    ],
)
def test_the_job_and_step_come_from_slurms_cgroup_layouts(
    text: str, expected: SlurmStep | None
) -> None:
    assert parse_cgroup(text) == expected


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}, SlurmStep("4242", "0")),
        ({"SLURM_JOB_ID": "4242"}, SlurmStep("4242", "")),  # the batch script
        ({"SLURM_JOB_ID": " 4242\n", "SLURM_STEP_ID": "2"}, SlurmStep("4242", "2")),
        ({"SLURM_JOB_ID": "not-a-job"}, None),
        ({"SLURM_STEP_ID": "0"}, None),
        ({}, None),
    ],
)
def test_the_environment_names_the_job_when_no_cgroup_does(
    environ: dict[str, str], expected: SlurmStep | None
) -> None:
    assert from_environ(environ) == expected


def fake_proc(root: Path, pid: int, cgroup: str | None, environ: dict[str, str] | None) -> None:
    """A /proc/<pid> with the files the kernel would show (environ NUL-separated)."""
    entry = root / str(pid)
    entry.mkdir(parents=True)
    if cgroup is not None:
        (entry / "cgroup").write_text(cgroup)
    if environ is not None:
        (entry / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))


@pytest.fixture
def proc(tmp_path: Path) -> ProcfsSource:
    """GPU processes of two jobs, a process outside Slurm and one whose files are gone."""
    srun = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    fake_proc(tmp_path, 4100, V2_TASK, rank_env(0, 0, **srun))
    fake_proc(tmp_path, 4101, V2_TASK, {**srun, "SLURM_PROCID": "1"})  # srun, no torchrun
    # The cgroup is slurmd's word; an environment inherited from elsewhere does not override it.
    fake_proc(tmp_path, 4102, V1_MULTIPLE_SLURMD_BATCH, {"SLURM_JOB_ID": "1"})
    fake_proc(tmp_path, 4103, V1_MULTIPLE_SLURMD_BATCH, None)
    # proctrack/linuxproc: no Slurm cgroup, the environment tells.
    fake_proc(tmp_path, 4104, "0::/system.slice/slurmd.service\n", {"SLURM_JOB_ID": "80"})
    fake_proc(tmp_path, 4105, "0::/user.slice/user-0.slice/session-1.scope\n", {"HOME": "/"})
    return ProcfsSource(tmp_path)


def test_a_process_is_placed_by_cgroup_then_environment(proc: ProcfsSource) -> None:
    assert slurm_step_of(4100, proc) == SlurmStep("4242", "0")
    assert slurm_step_of(4102, proc) == SlurmStep("77", "batch")
    assert slurm_step_of(4104, proc) == SlurmStep("80", "")
    assert slurm_step_of(4105, proc) is None
    assert slurm_step_of(4999, proc) is None  # exited between NVML's list and the read


def test_each_gpu_gets_its_job_and_step_once(proc: ProcfsSource) -> None:
    provider = FakeProvider(gpus=5)
    provider.processes = {0: (4100,), 1: (4101,), 2: (4102, 4103), 3: (4104, 4105, 4999)}
    registry, _ = registry_of({"slurm_job": SlurmJobCollector(make_context(provider), proc)})
    samples = scrape(registry)
    keys = ("gpu", "uuid", "slurm_job_id", "slurm_step_id")
    series = {tuple(dict(k)[key] for key in keys) for k in values(samples, INFO)}
    uuid = [provider.identity(i).uuid for i in range(4)]
    assert series == {
        ("0", uuid[0], "4242", "0"),
        ("1", uuid[1], "4242", "0"),
        ("2", uuid[2], "77", "batch"),  # two processes of one step: one series
        ("3", uuid[3], "80", ""),
    }
    assert one(samples, UNMAPPED) == 2.0  # 4105 outside Slurm, 4999 gone
    assert one(samples, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector="slurm_job") == 1.0


def test_no_driver_fails_the_collector_and_nothing_else(proc: ProcfsSource) -> None:
    provider = FakeProvider(gpus=2, unavailable="NVML Shared Library Not Found")
    registry, _ = registry_of({"slurm_job": SlurmJobCollector(make_context(provider), proc)})
    samples = scrape(registry)
    assert one(samples, contract.EXPORTER_COLLECTOR_SUCCESS.name, collector="slurm_job") == 0.0
    assert not values(samples, INFO)


def test_the_exporters_proc_source_is_read_directly(proc: ProcfsSource) -> None:
    provider = FakeProvider(gpus=2)
    provider.processes = {0: (4101,)}
    context = ExporterContext(
        provider, proc, StaticHost(), ExporterSettings(gpu_sample_ttl_seconds=0)
    )
    collector = registered()["slurm_job"].factory(context)
    registry, _ = registry_of({"slurm_job": collector})
    # 4101 has no RANK (srun without torchrun): not a training rank, still found by its cgroup.
    assert one(scrape(registry), INFO, gpu="0", slurm_job_id="4242") == 1.0


def test_another_process_source_lends_the_environments_it_lists() -> None:
    provider = FakeProvider(gpus=2)
    provider.processes = {0: (500,), 1: (501,)}
    processes = StaticProcesses(
        [
            TrainingProcess(500, rank_env(0, 0, SLURM_JOB_ID="31", SLURM_STEP_ID="1")),
            TrainingProcess(501, rank_env(1, 1)),
        ]
    )
    context = make_context(provider, processes)
    collector = registered()["slurm_job"].factory(context)
    assert isinstance(collector, SlurmJobCollector)
    registry, _ = registry_of({"slurm_job": collector})
    samples = scrape(registry)
    assert one(samples, INFO, gpu="0", slurm_job_id="31", slurm_step_id="1") == 1.0
    assert one(samples, UNMAPPED) == 1.0
    assert ScannedEnvironments(context).cgroup(500) is None


def test_off_unless_asked_for() -> None:
    assert registered()["slurm_job"].enabled_by_default is False


def test_a_rank_under_slurm_keeps_the_job_id_the_hook_uses() -> None:
    """procs' job id for the gpu_process join: torchrun's id, else Slurm's, as the hook."""
    under_srun = {"RANK": "0", "LOCAL_RANK": "0", "SLURM_JOB_ID": "4242"}
    assert TrainingProcess(1, under_srun).job_id == "4242"
    torchrun = {**under_srun, "TORCHELASTIC_RUN_ID": "llama"}
    assert TrainingProcess(1, torchrun).job_id == "llama"
    placeholder = {**under_srun, "TORCHELASTIC_RUN_ID": "none"}
    assert TrainingProcess(1, placeholder).job_id == "4242"
    assert TrainingProcess(1, {**placeholder, contract.ENV_JOB_ID: "ours"}).job_id == "ours"
    assert TrainingProcess(1, {"TORCHELASTIC_RUN_ID": "none"}).job_id == "none"
