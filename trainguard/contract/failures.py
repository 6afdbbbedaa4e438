"""The failure vocabulary and its catalogue, ``FAILURES``: read this first.

It is the path of every failure from signal to repair. Alerts, triage findings, diagnose causes,
events and remediation records name failures, causes and actions with these values and no
others. ``FAILURES`` says, per failure, what sees it (its signals and their producers, its
alerts and their thresholds, its dashboards), where its runbook section is and what the default
policy does; and it is the registry the code dispatches through: each component declares a
:class:`Role` (alert rules, a triage detector, a diagnose analysis, demo faults) and registers,
in the module named after the failure, what it implements for it. Rendering the rules, building
triage's detectors, running diagnose's analyses and drawing the demo's faults all iterate
``FAILURES``, so a failure added here and registered there is everywhere at once
(docs/contributing.md). tests/core/test_catalogue.py fails when the catalogue and the rules,
runbook, default policy, action catalogue, executors or registrations disagree.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from trainguard.contract.metric import MetricSpec
from trainguard.contract.nodes import (
    GPU_CLOCK_THROTTLED,
    GPU_ECC_ERRORS,
    GPU_REMAPPED_ROWS,
    GPU_ROW_REMAP_FAILURE,
    GPU_TEMPERATURE,
    GPU_XID_ERRORS,
    NCCL_INFO,
    NCCL_LOG_ERRORS,
    NODE_METRICS,
    NVML_UP,
)
from trainguard.contract.ranks import (
    COLLECTIVE_OLDEST_INFLIGHT,
    COLLECTIVE_TIMEOUTS,
    COLLECTIVES_COMPLETED,
    COLLECTIVES_LAUNCHED,
    ELASTIC_RESTARTS,
    LAST_STEP_TIMESTAMP,
    MEMORY_ALLOC_RETRIES,
    MEMORY_ALLOCATED,
    MEMORY_CAPACITY,
    MEMORY_FRAGMENTATION,
    MEMORY_RESERVED,
    OOM_EVENTS,
    OOM_RECOVERIES,
    RANK_INFO,
    RANK_METRICS,
    STEP_COMPUTE_DURATION,
    STEP_COMPUTE_SHARE,
    STEP_DURATION,
    STEP_PHASE_DURATION,
    STEPS,
    SYNC_WAIT_DURATION,
)


# --- alert names ---------------------------------------------------------------------------------
class Alert(str, enum.Enum):
    """Alert names (CamelCase); each has ``severity`` and summary/description/runbook_url."""

    TRAINING_OOM = "TrainingOOM"
    TRAINING_OOM_RISK = "TrainingOOMRisk"
    TRAINING_STRAGGLER = "TrainingStraggler"
    TRAINING_COLLECTIVE_STALLED = "TrainingCollectiveStalled"
    TRAINING_NCCL_TIMEOUT = "TrainingNCCLTimeout"
    TRAINING_STALLED = "TrainingStalled"
    TRAINING_RANK_DOWN = "TrainingRankDown"
    TRAINING_RANK_RESTARTED = "TrainingRankRestarted"
    TRAINING_DATALOADER_BOUND = "TrainingDataLoaderBound"
    TRAINING_MEMORY_FRAGMENTATION = "TrainingMemoryFragmentation"
    GPU_XID_ERROR = "GpuXidError"
    GPU_THERMAL_THROTTLING = "GpuThermalThrottling"
    GPU_NVML_DOWN = "GpuNvmlDown"
    NCCL_SOCKET_TRANSPORT_FALLBACK = "NcclSocketTransportFallback"


class Recovery(str, enum.Enum):
    """How the remediation service's verifier judges that the repair of an alert worked."""

    # A state (a straggler, a stall, a rank down): recovered once the alert's condition no
    # longer holds and the job steps past where it was.
    CONDITION_CLEARED = "condition_cleared"
    # An event counted over a window (an OOM, a timeout, a restart, an Xid): the alert keeps
    # firing for its window after the event whatever the job does since, so recovered is the
    # job stepping on with no new event since the repair.
    NO_NEW_EVENT = "no_new_event"


@dataclass(frozen=True)
class EventAlert:
    """An alert that counts events over a window, and the count it reads: a counter of the
    events, or a gauge that rises by one per event (the elastic agents' restart count)."""

    alert: Alert
    count: MetricSpec


class Failure(str, enum.Enum):
    """Which failure: the one name every component gives it (``failure`` in records)."""

    OOM = "oom"
    STRAGGLER = "straggler"
    JOB_SLOWDOWN = "job_slowdown"
    DATALOADER_BOUND = "dataloader_bound"
    HANG = "hang"
    NCCL_TIMEOUT = "nccl_timeout"
    NCCL_ERROR = "nccl_error"
    RANK_FAILURE = "rank_failure"
    GPU_FAULT = "gpu_fault"
    GPU_THROTTLING = "gpu_throttling"


class Cause(str, enum.Enum):
    """A root cause ``trainguard diagnose`` can name (a candidate's ``cause``), with the
    failure it explains. The prevention rules are registered per cause."""

    failure: Failure

    def __new__(cls, value: str, failure: Failure) -> Cause:
        cause = str.__new__(cls, value)
        cause._value_ = value
        cause.failure = failure
        return cause

    def __str__(self) -> str:
        # Reports print a cause as its value, as they print a failure's.
        return str.__str__(self)

    # oom
    MEMORY_FRAGMENTATION = "memory_fragmentation", Failure.OOM
    MEMORY_GROWTH = "memory_growth", Failure.OOM
    DOES_NOT_FIT = "does_not_fit", Failure.OOM
    OOM_UNEXPLAINED = "oom_unexplained", Failure.OOM
    MEMORY_CREEP = "memory_creep", Failure.OOM
    LOW_MEMORY_HEADROOM = "low_memory_headroom", Failure.OOM
    # straggler
    NODE_DEGRADED = "node_degraded", Failure.STRAGGLER
    SLOW_GPU_OR_PROCESS = "slow_gpu_or_process", Failure.STRAGGLER
    # dataloader_bound (a straggler's slow phase, or a rank's data wait)
    DATA_LOADING = "data_loading", Failure.DATALOADER_BOUND
    # job_slowdown
    SHARED_DEPENDENCY = "shared_dependency", Failure.JOB_SLOWDOWN
    # hang (a timeout when NCCL's watchdog fired: see FailureSpec.same_fault_as)
    RANK_NEVER_JOINED = "rank_never_joined", Failure.HANG
    # rank_failure
    RANK_KILLED = "rank_killed", Failure.RANK_FAILURE
    RANK_ERROR = "rank_error", Failure.RANK_FAILURE
    WORKERS_TERMINATED = "workers_terminated", Failure.RANK_FAILURE
    RANK_FAILURE_UNNAMED = "rank_failure_unnamed", Failure.RANK_FAILURE
    REPAIR = "repair", Failure.RANK_FAILURE  # a restart the service's own repair explains
    NODE_LEFT = "node_left", Failure.RANK_FAILURE  # a restart a node leaving the job explains
    # gpu_fault (facts: the Xid, or the driver event reported without one)
    GPU_XID = "gpu_xid", Failure.GPU_FAULT
    GPU_DRIVER_EVENT = "gpu_driver_event", Failure.GPU_FAULT
    GPU_ECC_UNCORRECTABLE = "gpu_ecc_uncorrectable", Failure.GPU_FAULT
    # gpu_throttling
    GPU_THROTTLING = "gpu_throttling", Failure.GPU_THROTTLING


class Action(str, enum.Enum):
    """What remediation can do: the protocol between policy, service, executors and ranks."""

    RESTART_FROM_CHECKPOINT = "restart_from_checkpoint"
    EXCLUDE_NODE = "exclude_node"
    DRAIN_NODE = "drain_node"
    ANNOTATE = "annotate"
    CHECKPOINT_NOW = "checkpoint_now"
    DUMP_DIAGNOSTICS = "dump_diagnostics"
    SET_GRAD_COMPRESSION = "set_grad_compression"
    SPLIT_MICRO_BATCHES = "split_micro_batches"
    SET_COLLECTIVE_TIMEOUT = "set_collective_timeout"
    RECOMMEND = "recommend"
    PAGE = "page"  # the last rung of a ladder: an alert posted to Alertmanager for a human


class NcclErrorKind(str, enum.Enum):
    """One taxonomy of NCCL errors: the exporter's ``kind`` label and triage's ``kind`` field."""

    REMOTE = "remote"  # a peer died or the network dropped: this rank is usually a victim
    CUDA = "cuda"  # a CUDA call failed inside NCCL (illegal address, out of memory, ...)
    SYSTEM = "system"  # a system or library call failed (sockets, /dev/shm, IB verbs)
    INTERNAL = "internal"  # NCCL's own internal error (often mismatched versions)
    INVALID_USAGE = "invalid_usage"  # ranks issued mismatched collectives, wrong device
    IB = "ib"  # InfiniBand / RoCE verbs errors (failed work completions, ibv_* calls)
    SOCKET = "socket"  # TCP between ranks: refused, closed or reset by the peer
    TIMEOUT = "timeout"  # NCCL gave up waiting for a peer
    PROXY = "proxy"  # the proxy thread failed a network operation
    OTHER = "other"


T = TypeVar("T")


class Role(Generic[T]):
    """One kind of code a failure may have (its alert rules, its triage detector, its diagnose
    analysis, its demo faults), declared by the component that runs it.

    Each failure's implementation lives in ``<package>.<failure>`` (``trainguard.alerts.oom``)
    and registers itself with :meth:`register`; :meth:`Catalogue.implementations` imports those
    modules on first use, so no list of them is kept anywhere. A module may register for more
    than one failure (the hang analysis explains NCCL timeouts too).
    """

    def __init__(self, name: str, package: str) -> None:
        self.name = name
        self.package = package
        self._registered: dict[Failure, T] = {}

    def register(self, *failures: Failure) -> Callable[[T], T]:
        """Decorator (or plain call): ``implementation`` is this role's for ``failures``."""

        def add(implementation: T) -> T:
            for failure in failures:
                held = self._registered.get(failure)
                if held is not None and held is not implementation:
                    raise ValueError(f"{self.name} of {failure.value} is registered already")
                self._registered[failure] = implementation
            return implementation

        return add

    def unregister(self, failure: Failure) -> None:
        """Forget the implementation of ``failure`` (a test's or a plug-in's own failure)."""
        self._registered.pop(failure, None)

    def get(self, failure: Failure) -> T | None:
        return self._registered.get(failure)

    def __repr__(self) -> str:
        return f"Role({self.name!r}, {self.package!r})"


@dataclass(frozen=True)
class FailureSpec:
    """One row of the failure catalogue: how a failure is seen, named, explained and repaired.

    ``alerts`` report it (each alert belongs to one failure); ``signals`` are the metrics those
    alerts and its analysis read; ``thresholds`` the keys of ``thresholds.yml`` its alerts,
    detector and analysis judge by; ``dashboards`` the uids of the Grafana dashboards that show
    it; ``actions`` the default policy's actions for its alerts, in the order they are tried.
    ``same_fault_as``: failures that are this one seen at another stage (a hang becomes an NCCL
    timeout once NCCL's watchdog fires), so an incident of one is a diagnosis of the other.
    ``events``: its alerts that count events over a window (:attr:`Recovery.NO_NEW_EVENT`);
    every other alert of it is a state (:attr:`Recovery.CONDITION_CLEARED`).
    Its runbook section is ``## <failure>`` of ``trainguard/alerts/runbook.md``; its promtool
    tests are ``tests/alerts/<failure>.test.yml``.
    """

    failure: Failure
    summary: str
    alerts: tuple[Alert, ...]
    signals: tuple[MetricSpec, ...]
    actions: tuple[Action, ...]
    thresholds: tuple[str, ...] = ()
    dashboards: tuple[str, ...] = ()
    same_fault_as: tuple[Failure, ...] = ()
    events: tuple[EventAlert, ...] = ()

    def recovery(self, alert: Alert) -> Recovery:
        """How a repair of ``alert`` (one of this failure's) is verified."""
        if any(event.alert is alert for event in self.events):
            return Recovery.NO_NEW_EVENT
        return Recovery.CONDITION_CLEARED

    @property
    def runbook_anchor(self) -> str:
        """The runbook's section heading is the failure's name, so this is its anchor."""
        return self.failure.value

    @property
    def producers(self) -> tuple[str, ...]:
        """Who emits its signals: ``hook`` (the training ranks), ``exporter`` (the nodes)."""
        found = []
        if any(signal in RANK_METRICS for signal in self.signals):
            found.append("hook")
        if any(signal in NODE_METRICS for signal in self.signals):
            found.append("exporter")
        return tuple(found)


@dataclass(frozen=True)
class Catalogue(Mapping[Failure, FailureSpec]):
    """The failures in the order every component reports them: causes before what they cause
    (a GPU fault before the OOM, hang or dead rank it brings; a straggler after the failures
    that slow a rank), and what each component registered for each."""

    specs: tuple[FailureSpec, ...]
    _absent: set[str] = field(default_factory=set, compare=False, repr=False)

    def __post_init__(self) -> None:
        failures = [spec.failure for spec in self.specs]
        if len(set(failures)) != len(failures):
            raise ValueError("a failure is catalogued twice")
        alerts = [alert for spec in self.specs for alert in spec.alerts]
        if len(set(alerts)) != len(alerts):
            raise ValueError("an alert belongs to two failures")
        for spec in self.specs:
            for event in spec.events:
                if event.alert not in spec.alerts or event.count not in spec.signals:
                    raise ValueError(
                        f"{spec.failure.value}: an event alert must be one of its alerts, "
                        "counting one of its signals"
                    )

    def __getitem__(self, failure: Failure) -> FailureSpec:
        for spec in self.specs:
            if spec.failure == failure:
                return spec
        raise KeyError(failure)

    def __iter__(self) -> Iterator[Failure]:
        return (spec.failure for spec in self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def with_failure(self, spec: FailureSpec) -> Catalogue:
        """This catalogue and one failure more, last (a test's toy failure, a plug-in's)."""
        return Catalogue((*self.specs, spec))

    def failure_of(self, alert: Alert) -> Failure:
        """The failure an alert reports (every alert belongs to exactly one)."""
        for spec in self.specs:
            if alert in spec.alerts:
                return spec.failure
        raise KeyError(alert)

    def event_alert(self, alert: Alert) -> EventAlert | None:
        """What ``alert`` counts, when it counts events over a window (else None: a state)."""
        spec = self[self.failure_of(alert)]
        return next((event for event in spec.events if event.alert is alert), None)

    def alerts(self) -> list[Alert]:
        """Every alert, failure by failure, each failure's in its own order."""
        return [alert for spec in self.specs for alert in spec.alerts]

    def implementations(self, role: Role[T]) -> list[tuple[FailureSpec, T]]:
        """(failure, what ``role`` registered for it), in catalogue order, for every failure
        that has one; the modules named after the failures are imported first."""
        for spec in self.specs:
            self._discover(f"{role.package}.{spec.failure.value}")
        found = []
        for spec in self.specs:
            implementation = role.get(spec.failure)
            if implementation is not None:
                found.append((spec, implementation))
        return found

    def _discover(self, module: str) -> None:
        if module in self._absent:
            return
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:
                raise
            self._absent.add(module)


FAILURES = Catalogue(
    (
        FailureSpec(
            Failure.GPU_FAULT,
            "The GPU or its driver failed: an Xid, ECC errors, or NVML stopped answering.",
            alerts=(Alert.GPU_XID_ERROR, Alert.GPU_NVML_DOWN),
            signals=(
                GPU_XID_ERRORS,
                GPU_ECC_ERRORS,
                GPU_REMAPPED_ROWS,
                GPU_ROW_REMAP_FAILURE,
                NVML_UP,
            ),
            actions=(Action.DRAIN_NODE, Action.RECOMMEND),
            thresholds=("xid_window", "xid_critical", "nvml_down_for"),
            dashboards=("trainguard-gpus",),
            events=(EventAlert(Alert.GPU_XID_ERROR, GPU_XID_ERRORS),),
        ),
        FailureSpec(
            Failure.OOM,
            "CUDA out of memory, memory close to capacity, or a fragmented caching allocator.",
            alerts=(
                Alert.TRAINING_OOM,
                Alert.TRAINING_OOM_RISK,
                Alert.TRAINING_MEMORY_FRAGMENTATION,
            ),
            signals=(
                OOM_EVENTS,
                OOM_RECOVERIES,
                MEMORY_ALLOCATED,
                MEMORY_RESERVED,
                MEMORY_CAPACITY,
                MEMORY_FRAGMENTATION,
                MEMORY_ALLOC_RETRIES,
            ),
            actions=(Action.SPLIT_MICRO_BATCHES, Action.RECOMMEND, Action.CHECKPOINT_NOW),
            thresholds=(
                "oom_window",
                "oom_risk_headroom_ratio",
                "oom_risk_predict_headroom_ratio",
                "oom_risk_predict_window",
                "oom_risk_predict_horizon_seconds",
                "oom_risk_for",
                "fragmentation_ratio",
                "fragmentation_retry_window",
                "fragmentation_for",
            ),
            dashboards=("trainguard-memory", "trainguard-overview"),
            events=(EventAlert(Alert.TRAINING_OOM, OOM_EVENTS),),
        ),
        FailureSpec(
            Failure.HANG,
            "A collective never completes, or no rank completes a step: the job is stuck.",
            alerts=(Alert.TRAINING_COLLECTIVE_STALLED, Alert.TRAINING_STALLED),
            signals=(
                COLLECTIVE_OLDEST_INFLIGHT,
                COLLECTIVES_LAUNCHED,
                COLLECTIVES_COMPLETED,
                LAST_STEP_TIMESTAMP,
            ),
            actions=(Action.DUMP_DIAGNOSTICS, Action.RESTART_FROM_CHECKPOINT),
            thresholds=(
                "collective_stall_floor_seconds",
                "collective_stall_step_multiplier",
                "collective_stall_for",
                "stalled_seconds",
                "stalled_for",
            ),
            dashboards=("trainguard-collectives", "trainguard-overview"),
            same_fault_as=(Failure.NCCL_TIMEOUT,),
        ),
        FailureSpec(
            Failure.NCCL_TIMEOUT,
            "A collective ran past the process group's timeout and the watchdog aborted it.",
            alerts=(Alert.TRAINING_NCCL_TIMEOUT,),
            signals=(COLLECTIVE_TIMEOUTS,),
            actions=(Action.DUMP_DIAGNOSTICS, Action.RESTART_FROM_CHECKPOINT, Action.RECOMMEND),
            thresholds=("nccl_timeout_window",),
            dashboards=("trainguard-collectives",),
            same_fault_as=(Failure.HANG,),
            events=(EventAlert(Alert.TRAINING_NCCL_TIMEOUT, COLLECTIVE_TIMEOUTS),),
        ),
        FailureSpec(
            Failure.NCCL_ERROR,
            "NCCL reported an error (NcclErrorKind), or fell back to TCP sockets.",
            alerts=(Alert.NCCL_SOCKET_TRANSPORT_FALLBACK,),
            signals=(NCCL_LOG_ERRORS, NCCL_INFO),
            actions=(Action.RECOMMEND,),
            thresholds=("nccl_socket_transport", "nccl_socket_for"),
            dashboards=("trainguard-collectives",),
        ),
        FailureSpec(
            Failure.RANK_FAILURE,
            "A rank's process died or stopped answering (torchrun reports it as failed).",
            alerts=(Alert.TRAINING_RANK_DOWN, Alert.TRAINING_RANK_RESTARTED),
            signals=(RANK_INFO, ELASTIC_RESTARTS),
            actions=(Action.RESTART_FROM_CHECKPOINT, Action.RECOMMEND),
            thresholds=("rank_down_for", "rank_absent_window", "rank_restart_window"),
            dashboards=("trainguard-overview",),
            events=(EventAlert(Alert.TRAINING_RANK_RESTARTED, ELASTIC_RESTARTS),),
        ),
        FailureSpec(
            Failure.STRAGGLER,
            "One rank's local work is slower than the job's median and holds every rank back.",
            alerts=(Alert.TRAINING_STRAGGLER,),
            signals=(
                STEP_COMPUTE_DURATION,
                STEP_COMPUTE_SHARE,
                SYNC_WAIT_DURATION,
                STEP_PHASE_DURATION,
            ),
            actions=(Action.RECOMMEND, Action.EXCLUDE_NODE),
            thresholds=(
                "straggler_factor",
                "straggler_min_ranks",
                "straggler_for",
                "straggler_recent_factor",
                "straggler_recent_for",
                "straggler_recent_resolve_factor",
                "straggler_recent_resolve_window",
            ),
            dashboards=("trainguard-stragglers", "trainguard-overview"),
        ),
        FailureSpec(
            Failure.DATALOADER_BOUND,
            "A rank spends a large share of its step waiting for its data loader.",
            alerts=(Alert.TRAINING_DATALOADER_BOUND,),
            signals=(STEP_PHASE_DURATION,),
            actions=(Action.RECOMMEND,),
            thresholds=("dataloader_wait_ratio", "dataloader_for"),
            dashboards=("trainguard-stragglers",),
        ),
        FailureSpec(
            Failure.JOB_SLOWDOWN,
            "Every rank slowed down together (no single straggler): input, network or model.",
            alerts=(),
            signals=(STEP_DURATION, STEPS),
            actions=(),
            dashboards=("trainguard-overview",),
        ),
        FailureSpec(
            Failure.GPU_THROTTLING,
            "A GPU's clocks are held down (thermal, power brake, hardware slowdown).",
            alerts=(Alert.GPU_THERMAL_THROTTLING,),
            signals=(GPU_CLOCK_THROTTLED, GPU_TEMPERATURE),
            actions=(Action.RECOMMEND,),
            thresholds=("thermal_throttle_reasons", "thermal_for"),
            dashboards=("trainguard-gpus",),
        ),
    )
)


def failure_of(alert: Alert) -> Failure:
    """The failure an alert reports (every alert belongs to exactly one)."""
    return FAILURES.failure_of(alert)
