"""Settings of the training hook, from keyword arguments or ``TRAINGUARD_*`` variables.

One frozen dataclass holds every knob of :func:`trainguard.instrument`; the rank's identity
(job id, rank, local rank, node) is resolved from torchrun's environment when not given, so the
same code runs under torchrun, under another launcher or in a plain single process.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from trainguard import contract
from trainguard.discovery import DEFAULT_TTL_SECONDS

DEFAULT_METRICS_PORT = 9400
DEFAULT_STALL_FLOOR_SECONDS = 30.0
DEFAULT_STALL_FACTOR = 10.0
DEFAULT_WATCHDOG_INTERVAL_SECONDS = 1.0
# Every pod gets its namespace here unless service-account tokens are switched off.
KUBERNETES_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class EventIdentity(TypedDict):
    job_id: str
    rank: int
    node: str


@dataclass(frozen=True)
class Identity:
    """Who this process is in the job; the values of the rank identity labels."""

    job_id: str
    rank: int
    local_rank: int
    world_size: int
    node: str

    def event_fields(self) -> EventIdentity:
        """The identity fields every event of this rank carries (see trainguard.events)."""
        return {"job_id": self.job_id, "rank": self.rank, "node": self.node}

    def labels(self) -> dict[str, str]:
        return {
            contract.LABEL_JOB_ID: self.job_id,
            contract.LABEL_RANK: str(self.rank),
            contract.LABEL_LOCAL_RANK: str(self.local_rank),
            contract.LABEL_NODE: self.node,
        }


@dataclass(frozen=True)
class Placement:
    """Where the job runs: the scheduler that launched it and that scheduler's handle on it.

    Exported in ``rank_info``; the alert rules copy it onto the job's alerts, and the
    remediation service acts through the executor it names.
    """

    scheduler: str
    namespace: str = ""
    slurm_job_id: str = ""

    def labels(self) -> dict[str, str]:
        return {
            contract.LABEL_SCHEDULER: self.scheduler,
            contract.LABEL_NAMESPACE: self.namespace,
            contract.LABEL_SLURM_JOB_ID: self.slurm_job_id,
        }


def detect_placement(
    env: Mapping[str, str],
    scheduler: str | None = None,
    namespace_file: Path = KUBERNETES_NAMESPACE_FILE,
) -> Placement:
    """Where this process runs, from what each scheduler puts in its environment.

    ``scheduler`` (else ``TRAINGUARD_SCHEDULER``) overrides detection: Slurm sets
    ``SLURM_JOB_ID`` in every step; Kubernetes sets ``KUBERNETES_SERVICE_HOST`` in every pod
    and names the namespace in ``POD_NAMESPACE`` (the downward API, by convention) or the
    service-account mount; anything else is taken for torchrun on hosts trainguard reaches.
    """
    chosen = scheduler or env.get(contract.ENV_SCHEDULER)
    if not chosen:
        if env.get("SLURM_JOB_ID"):
            chosen = contract.SCHEDULER_SLURM
        elif env.get("KUBERNETES_SERVICE_HOST"):
            chosen = contract.SCHEDULER_KUBERNETES
        else:
            chosen = contract.SCHEDULER_LOCAL
    if chosen not in contract.SCHEDULERS:
        raise ValueError(
            f"scheduler {chosen!r} (argument or {contract.ENV_SCHEDULER}) is not one of "
            f"{', '.join(contract.SCHEDULERS)}"
        )
    if chosen == contract.SCHEDULER_SLURM:
        return Placement(chosen, slurm_job_id=env.get("SLURM_JOB_ID", ""))
    if chosen == contract.SCHEDULER_KUBERNETES:
        namespace = env.get("POD_NAMESPACE", "")
        if not namespace:
            try:
                namespace = namespace_file.read_text().strip()
            except OSError:
                namespace = ""  # the remediation service falls back to its default namespace
        return Placement(chosen, namespace=namespace)
    return Placement(chosen)


@dataclass(frozen=True)
class LaunchedAs:
    """What the launcher told this process about its place in the job; ``None``: nothing."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None


# Each launcher's names for (rank, local rank, world size).
_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
_SRUN_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")


def launched_as(env: Mapping[str, str]) -> LaunchedAs:
    """The rank, local rank and world size from the launcher's environment.

    torchrun's ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``, each where set, else those of an
    srun task: ``SLURM_PROCID``, ``SLURM_LOCALID`` and ``SLURM_NTASKS`` (``srun`` without
    torchrun, one task per GPU). Under srun + torchrun a worker has both sets and torchrun's
    are the right ones: Slurm's describe the one torchrun task of each node. Slurm's count only
    in a step srun launched (``SLURM_STEP_ID`` set): a batch script's ``SLURM_NTASKS``
    describes the job, not the script. A value that is not an integer is a ``ValueError``.
    """
    in_srun_step = "SLURM_STEP_ID" in env
    values: list[int | None] = []
    for torchrun, srun in zip(_TORCHRUN_VARS, _SRUN_VARS, strict=True):
        name = torchrun if torchrun in env or not in_srun_step else srun
        raw = env.get(name)
        try:
            values.append(int(raw) if raw is not None else None)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer") from None
    rank, local_rank, world_size = values
    return LaunchedAs(rank, local_rank, world_size)


@dataclass(frozen=True)
class InstrumentationConfig:
    """Everything :func:`trainguard.instrument` can be told; ``None`` means "from the environment".

    Attributes:
        job_id: names the job in every series, span and event. Default: ``TRAINGUARD_JOB_ID``,
            else torchrun's ``TORCHELASTIC_RUN_ID``, else Slurm's ``SLURM_JOB_ID`` (which also
            beats torchrun's ``none``, its value without ``--rdzv-id``), else a random id
            (logged); see :func:`trainguard.contract.job_id_from_environment`.
        metrics_port: base port of this rank's ``/metrics``; the rank serves on base + local
            rank and moves to the next free port if that one is taken. ``0`` picks any free
            port, ``-1`` serves nothing (metrics stay in the registry). Default
            ``TRAINGUARD_METRICS_PORT`` or 9400.
        metrics_addr: address to bind; default ``TRAINGUARD_METRICS_ADDR`` or ``0.0.0.0``.
        file_sd_dir: where to write this rank's Prometheus ``file_sd`` target file; default
            ``TRAINGUARD_FILE_SD_DIR``; unset writes none.
        dump_dir: where the watchdog writes Flight Recorder traces and stacks; default
            ``TRAINGUARD_DUMP_DIR`` or ``./trainguard-dumps``.
        per_bucket: also time every gradient bucket through a comm hook (costs a Python call
            per bucket; the default reads DDP's own reducer timers instead). Default
            ``TRAINGUARD_PER_BUCKET`` (``1``) or off.
        metrics_detail: keep the buckets of the phase, compute and sync-wait histograms
            (``contract.DETAIL_HISTOGRAMS``; 48 more series per rank). Off, they expose their
            ``_sum`` and ``_count`` only, within ``contract.RANK_SERIES_BUDGET``. Default
            ``TRAINGUARD_METRICS_DETAIL`` (``1``) or off.
        runtime_stats_every: DDP times every Nth iteration (its runtime-stats sample rate;
            it also times its first 10) and the hook reads those timers only: the straggler
            split (compute / sync wait) and DDP's gradient-sync histogram and span come from
            those sampled steps (1 = every step, at some 20-40 us of the training thread's
            time per step; the default 8 costs an eighth of that).
        work_from_inputs: scale each step's compute to the rank's usual batch before taking the
            recent share's median (``trainguard_step_compute_share_ratio``), by the elements of
            the tensors ``forward`` was given (:func:`.steps.input_elements`): where batches vary
            in size (sequences padded per batch), a rank's share then follows its speed, not its
            batches, and a straggler stands out sooner. Costs nothing where inputs keep one
            size. Turn off where the inputs' size does not follow the cost (a variable-size
            side input). Default on.
        recent_compute_seconds: the window of that share's median; the rank reports no share
            (0) until its timed steps have filled it once. Default
            ``contract.RECENT_COMPUTE_SECONDS`` (50 s), what ``TrainingStraggler``'s fast rule
            was measured with: shorter, a noisy neighbour's burst moves the share (docs/alerts.md).
        tracing: build OpenTelemetry spans; default on when an OTLP endpoint is configured
            (``OTEL_EXPORTER_OTLP_ENDPOINT``) or a span exporter is passed in.
        watchdog: run the collective watchdog thread.
        oom_recovery: retry a step that ran out of memory split into micro-batches
            (through :meth:`Instrumentation.guarded_step`).
        stall_floor_seconds: the watchdog never calls a collective stalled before this age.
        stall_factor: ... nor before this many times the slowest recent step.
        watchdog_interval_seconds: how often the watchdog thread looks.
        oom_split_max: with OOM recovery on, the most micro-batches a step may be split into.
        start_step: the number of the first step (after resuming from a checkpoint), so trace
            ids stay the same on every rank.
        remediation_url: the remediation service to take directives from; default
            ``TRAINGUARD_REMEDIATION_URL``; unset takes none. Its bearer token comes from
            ``TRAINGUARD_REMEDIATION_TOKEN``.
        scheduler: what launched the job (``local``, ``kubernetes`` or ``slurm``); default
            ``TRAINGUARD_SCHEDULER``, else detected (see :func:`detect_placement`).
        discovery_url: the remediation service to register this rank's ``/metrics`` with, for
            Prometheus' HTTP service discovery (no shared file system needed); default
            ``TRAINGUARD_DISCOVERY_URL``; unset registers nowhere. Its bearer token comes from
            ``TRAINGUARD_REMEDIATION_TOKEN``.
        discovery_ttl_seconds: how long the registration outlives this rank's last renewal
            (renewed every third of it); default ``TRAINGUARD_DISCOVERY_TTL_SECONDS`` or 60.
        memory_capacity_bytes: the memory a CPU rank may use, where no cgroup limit says it
            (ranks sharing a host each get a share of it); default
            ``TRAINGUARD_MEMORY_CAPACITY_BYTES``, else the cgroup limit, else the host's memory.
            A GPU's capacity is always the device's.
    """

    job_id: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    node: str | None = None
    metrics_port: int | None = None
    metrics_addr: str | None = None
    file_sd_dir: Path | None = None
    dump_dir: Path | None = None
    per_bucket: bool | None = None
    metrics_detail: bool | None = None
    runtime_stats_every: int = 8
    work_from_inputs: bool = True
    recent_compute_seconds: float = contract.RECENT_COMPUTE_SECONDS
    tracing: bool | None = None
    stall_floor_seconds: float | None = None
    stall_factor: float = DEFAULT_STALL_FACTOR
    watchdog: bool = True
    watchdog_interval_seconds: float = DEFAULT_WATCHDOG_INTERVAL_SECONDS
    oom_recovery: bool = False
    oom_split_max: int = 8
    start_step: int = 0
    remediation_url: str | None = None
    scheduler: str | None = None
    discovery_url: str | None = None
    discovery_ttl_seconds: float | None = None
    memory_capacity_bytes: int | None = None

    def resolve_identity(
        self,
        world_size: int,
        rank: int | None,
        *,
        agree_job_id: Callable[[str], str] | None = None,
        device_index: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Identity:
        """Who this rank is, each field from the first that says: the arguments of
        :func:`trainguard.instrument`; the process group (``rank`` and ``world_size``; ``rank``
        is ``None`` without one); the launcher's environment (:func:`launched_as`: torchrun's,
        else an srun task's). Without a job id from the arguments or the environment, a random
        one is proposed and ``agree_job_id`` (the ranks' shared store) makes every rank use
        rank 0's. Without a local rank from either launcher, it is the CUDA device index, else
        the global rank, so ranks on one host still differ. The node is ``TRAINGUARD_NODE``,
        else Slurm's ``SLURMD_NODENAME`` (the name scontrol drains), else the host name."""
        env = os.environ if env is None else env
        launched = launched_as(env)
        resolved_rank = next(
            (r for r in (self.rank, rank, launched.rank) if r is not None),
            0,
        )
        job_id = self.job_id or contract.job_id_from_environment(env)
        if not job_id:
            proposal = f"job-{uuid.uuid4().hex[:8]}"
            job_id = agree_job_id(proposal) if agree_job_id is not None else proposal
        local_rank = next(
            (r for r in (self.local_rank, launched.local_rank, device_index) if r is not None),
            resolved_rank,
        )
        if rank is None:  # no process group: the launcher says how many ranks there are
            world_size = launched.world_size or world_size
        node = (
            self.node
            or env.get(contract.ENV_NODE)
            or env.get("SLURMD_NODENAME")
            or socket.gethostname()
        )
        return Identity(
            job_id=job_id,
            rank=resolved_rank,
            local_rank=local_rank,
            world_size=self.world_size or world_size,
            node=node,
        )

    def node_is_set(self) -> bool:
        """Whether the node was named (argument or ``TRAINGUARD_NODE``) rather than guessed."""
        return bool(self.node or os.environ.get(contract.ENV_NODE))

    def resolve_placement(self) -> Placement:
        return detect_placement(os.environ, self.scheduler)

    def resolved_metrics_port(self) -> int:
        if self.metrics_port is not None:
            return self.metrics_port
        return int(os.environ.get(contract.ENV_METRICS_PORT, DEFAULT_METRICS_PORT))

    def resolved_metrics_addr(self) -> str:
        return self.metrics_addr or os.environ.get(contract.ENV_METRICS_ADDR, "0.0.0.0")

    def resolved_file_sd_dir(self) -> Path | None:
        if self.file_sd_dir is not None:
            return self.file_sd_dir
        value = os.environ.get(contract.ENV_FILE_SD_DIR)
        return Path(value) if value else None

    def resolved_dump_dir(self) -> Path:
        if self.dump_dir is not None:
            return self.dump_dir
        return Path(os.environ.get(contract.ENV_DUMP_DIR, "trainguard-dumps"))

    def resolved_per_bucket(self) -> bool:
        if self.per_bucket is not None:
            return self.per_bucket
        return _switch(os.environ.get(contract.ENV_PER_BUCKET))

    def resolved_metrics_detail(self) -> bool:
        if self.metrics_detail is not None:
            return self.metrics_detail
        return _switch(os.environ.get(contract.ENV_METRICS_DETAIL))

    def resolved_stall_floor(self) -> float:
        if self.stall_floor_seconds is not None:
            return self.stall_floor_seconds
        return float(os.environ.get(contract.ENV_STALL_FLOOR, DEFAULT_STALL_FLOOR_SECONDS))

    def resolved_memory_capacity(self) -> int | None:
        """The CPU memory capacity set here or in the environment; None to read the host's."""
        if self.memory_capacity_bytes is not None:
            return self.memory_capacity_bytes
        text = os.environ.get(contract.ENV_MEMORY_CAPACITY)
        return int(text) if text else None

    def resolved_remediation_url(self) -> str | None:
        return self.remediation_url or os.environ.get(contract.ENV_REMEDIATION_URL) or None

    def resolved_discovery_url(self) -> str | None:
        return self.discovery_url or os.environ.get(contract.ENV_DISCOVERY_URL) or None

    def resolved_discovery_ttl(self) -> float:
        """Raises ValueError for a value that is not a number."""
        if self.discovery_ttl_seconds is not None:
            return self.discovery_ttl_seconds
        return float(os.environ.get(contract.ENV_DISCOVERY_TTL) or DEFAULT_TTL_SECONDS)

    def resolved_tracing(self) -> bool:
        """Tracing is on when asked for, or when an OTLP endpoint is configured."""
        if self.tracing is not None:
            return self.tracing
        return any(
            os.environ.get(name)
            for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )


def _switch(value: str | None) -> bool:
    """An on/off environment variable: ``1``, ``true``, ``yes`` or ``on`` (any case) is on;
    unset or anything else is off."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


logger = logging.getLogger("trainguard.instrumentation")


def default_store() -> Any | None:
    """The job's c10d store, used to tell peers to dump when one rank sees a stall."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None


JOB_ID_STORE_KEY = "trainguard/job_id"
# How long a rank waits for rank 0's job id in the store before going on with its own.
JOB_ID_WAIT_SECONDS = 30.0


def job_id_from_rank0(store: Any, rank: int) -> Callable[[str], str]:
    """Every rank takes rank 0's proposed job id, so their traces and series are one job."""

    def agree(proposal: str) -> str:
        if rank == 0:
            store.set(JOB_ID_STORE_KEY, proposal)
            return proposal
        try:
            store.wait([JOB_ID_STORE_KEY], datetime.timedelta(seconds=JOB_ID_WAIT_SECONDS))
            return str(store.get(JOB_ID_STORE_KEY).decode())
        except Exception as error:  # rank 0 never instrumented: stay on, under our own id
            logger.warning(
                "trainguard: no job id from rank 0 (%s); set %s to name the job",
                error,
                contract.ENV_JOB_ID,
            )
            return proposal

    return agree
