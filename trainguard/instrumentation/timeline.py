"""The per-rank collective timeline: what ran, on which process group, when it began and ended.

One mechanism for every way of training in parallel. ``fully_shard`` (FSDP2),
``FullyShardedDataParallel`` (FSDP1), tensor and pipeline parallel code and the training loop
itself all issue their collectives through the public ``torch.distributed`` functions
(``all_gather_single``, ``reduce_scatter_single``, ``all_reduce``, ``send``...), looked up on
the module at call time. :func:`attach` wraps those functions once per process; while a
timeline is current, each call costs the training thread two clock reads, its process group and
payload size (read there, so that no tensor is kept alive) and the append of a plain tuple
(:data:`RawCollective`): no object of ours is built there, the worker turns the tuples into
:class:`Collective` values (:func:`resolve`). A collective issued with ``async_op=True`` gets its
end time from its work's future, on the backend's thread.

The timeline only records; the worker thread classifies each collective (:class:`Role`: a
gradient sync, a parameter all-gather or anything else, from the model's own process groups),
names its process group (:class:`GroupNames`, bounded) and computes the metrics, the spans and
the time the rank was blocked on peers (:func:`blocked_ns`) from it. DDP's gradient all-reduce
runs inside its C++ reducer and never reaches these functions: DDP's reducer timers supply it.
"""

from __future__ import annotations

import enum
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainguard.instrumentation.errors import ErrorBudget

# A step that issues more collectives than this keeps the first ones and counts the rest
# (an evaluation loop full of all-reduces between two training steps, say).
MAX_COLLECTIVES_PER_STEP = 4096
# Process-group names are label and attribute values: past this many, groups are "other".
MAX_GROUP_NAMES = 16
OTHER_GROUP = "other"
WORLD_GROUP = "default_pg"


class Role(enum.Enum):
    """What a collective does for data-parallel training."""

    GRAD_SYNC = "grad_sync"  # reduce-scatter of gradients, all-reduce across replicas
    PARAM_GATHER = "param_gather"  # all-gather of sharded parameters
    OTHER = "other"  # tensor / pipeline parallel, the training loop's own collectives


@dataclass(frozen=True, slots=True)
class _Signature:
    """Where a wrapped function takes its group, async flag and payload."""

    op: str  # the operation, as spans and events name it
    group: int  # positional index of ``group``
    async_op: int  # positional index of ``async_op``; -1 when the function has none
    payload: int  # positional index of the tensor (or list of tensors) that is sent
    payload_name: str
    group_name: str = "group"


def _signature(name: str, op: str, payload: str | None) -> _Signature | None:
    function = getattr(dist, name, None)
    if not callable(function):
        return None
    parameters = list(inspect.signature(function).parameters)
    if "group" not in parameters:
        return None
    return _Signature(
        op=op,
        group=parameters.index("group"),
        async_op=parameters.index("async_op") if "async_op" in parameters else -1,
        payload=parameters.index(payload) if payload in parameters else -1,
        payload_name=payload or "",
    )


# The torch.distributed functions the timeline wraps: (function, operation, payload argument).
# Newer and older spellings of one collective (all_gather_single / all_gather_into_tensor)
# are both wrapped; one call reaches only one of them.
WRAPPED: tuple[tuple[str, str, str | None], ...] = (
    ("all_reduce", "all_reduce", "tensor"),
    ("all_reduce_coalesced", "all_reduce", "tensors"),
    ("all_gather_single", "all_gather", "output_tensor"),
    ("all_gather_into_tensor", "all_gather", "output_tensor"),
    ("all_gather", "all_gather", "tensor_list"),
    ("reduce_scatter_single", "reduce_scatter", "input"),
    ("reduce_scatter_tensor", "reduce_scatter", "input"),
    ("reduce_scatter", "reduce_scatter", "input_list"),
    ("broadcast", "broadcast", "tensor"),
    ("reduce", "reduce", "tensor"),
    ("all_to_all_single", "all_to_all", "input"),
    ("all_to_all", "all_to_all", "input_tensor_list"),
    ("barrier", "barrier", None),
    ("send", "send", "tensor"),
    ("recv", "recv", "tensor"),
    ("isend", "send", "tensor"),
    ("irecv", "recv", "tensor"),
)
_ASYNC_BY_NATURE = frozenset({"isend", "irecv"})


def _nbytes(payload: Any) -> int:
    if isinstance(payload, torch.Tensor):
        return int(payload.nbytes)
    if isinstance(payload, list | tuple):
        return sum(int(t.nbytes) for t in payload if isinstance(t, torch.Tensor))
    return 0


class Collective:
    """One collective as the training thread saw it (``perf_counter_ns`` timestamps)."""

    __slots__ = ("blocking", "end_ns", "group", "nbytes", "op", "start_ns")

    def __init__(
        self, op: str, group: Any, nbytes: int, start_ns: int, end_ns: int, blocking: bool
    ) -> None:
        self.op = op
        self.group = group  # the ProcessGroup, or None for the default group
        self.nbytes = nbytes
        self.start_ns = start_ns
        self.end_ns = end_ns  # 0 while an async collective is in flight
        self.blocking = blocking  # the training thread waited for it (async_op=False)

    def finished(self, _future: object = None) -> None:
        self.end_ns = time.perf_counter_ns()


# What the training thread records of a blocking collective: (op, group, nbytes, start_ns,
# end_ns). A tuple costs a fifth of a Collective to build; an async collective, whose end its
# work's future fills in later, is recorded as a Collective.
RawCollective = tuple[str, Any, int, int, int]
Entry = RawCollective | Collective


def resolve(entries: Iterable[Entry]) -> list[Collective]:
    """The timeline's entries as :class:`Collective` values (on the worker thread)."""
    return [
        entry if isinstance(entry, Collective) else Collective(*entry, True) for entry in entries
    ]


class Timeline:
    """One rank's collectives since the last :meth:`take` (one step's worth).

    The wrapped functions append to :attr:`entries` themselves (see :meth:`_Interceptor._wrapper`).
    """

    def __init__(self, errors: ErrorBudget) -> None:
        self.entries: list[Entry] = []
        self.overflow = 0
        self._errors = errors

    def take(self) -> tuple[list[Entry], int]:
        """The entries recorded so far and how many did not fit, and start afresh."""
        entries, self.entries = self.entries, []
        overflow, self.overflow = self.overflow, 0
        return entries, overflow

    def error(self, error: BaseException) -> None:
        self._errors.record("timeline", error)


def _in_flight(op: str, group: Any, nbytes: int, start: int, end: int, work: Any) -> Collective:
    """An async collective: its end comes from its work's future, on the backend's thread."""
    if work is None:
        return Collective(op, group, nbytes, start, end, False)
    entry = Collective(op, group, nbytes, start, 0, False)
    work.get_future().add_done_callback(entry.finished)
    return entry


class _Interceptor:
    """The process-wide wraps of torch.distributed's functions, shared by every timeline.

    The collectives of a step go to the timeline of the instrumented model whose step is in
    progress (:attr:`current`); with none, a wrapped call costs one attribute read.
    """

    def __init__(self) -> None:
        self.current: Timeline | None = None
        self._attached: list[Timeline] = []
        self._originals: dict[str, Callable[..., Any]] = {}
        self._wrappers: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()

    def attach(self, timeline: Timeline) -> bool:
        """Start recording for ``timeline``; False when this torch has nothing to wrap."""
        with self._lock:
            if not self._attached:
                self._wrap_all()
            if not self._wrappers:
                return False
            self._attached.append(timeline)
            return True

    def detach(self, timeline: Timeline) -> None:
        with self._lock:
            if timeline in self._attached:
                self._attached.remove(timeline)
            if self.current is timeline:
                self.current = None
            if not self._attached:
                self._unwrap_all()

    def _wrap_all(self) -> None:
        for name, op, payload in WRAPPED:
            signature = _signature(name, op, payload)
            original = getattr(dist, name, None)
            if signature is None or original is None:
                continue
            wrapper = self._wrapper(name, signature, original)
            self._originals[name] = original
            self._wrappers[name] = wrapper
            setattr(dist, name, wrapper)

    def _unwrap_all(self) -> None:
        for name, original in self._originals.items():
            # Someone who wrapped after us keeps their wrap (and ours stays inside, idle).
            if getattr(dist, name, None) is self._wrappers[name]:
                setattr(dist, name, original)
        self._originals.clear()
        self._wrappers.clear()

    def _wrapper(
        self, name: str, signature: _Signature, original: Callable[..., Any]
    ) -> Callable[..., Any]:
        """``original`` timed into the current timeline. The recording is inlined here, not a
        method of :class:`Timeline`: it runs on the training thread once per collective, and a
        call costs more than the rest of it (see docs/instrumentation.md)."""
        interceptor = self
        clock = time.perf_counter_ns
        op = signature.op
        group_at, group_name = signature.group, signature.group_name
        async_at = signature.async_op
        payload_at, payload_name = signature.payload, signature.payload_name
        async_by_nature = name in _ASYNC_BY_NATURE
        limit = MAX_COLLECTIVES_PER_STEP
        tensor = torch.Tensor

        def timed(*args: Any, **kwargs: Any) -> Any:
            timeline = interceptor.current
            if timeline is None:
                return original(*args, **kwargs)
            start = clock()
            result = original(*args, **kwargs)
            end = clock()
            try:
                entries = timeline.entries
                if len(entries) >= limit:
                    timeline.overflow += 1
                    return result
                count = len(args)
                group = args[group_at] if count > group_at else kwargs.get(group_name)
                if payload_at < 0:
                    nbytes = 0
                else:
                    payload = args[payload_at] if count > payload_at else kwargs.get(payload_name)
                    nbytes = payload.nbytes if isinstance(payload, tensor) else _nbytes(payload)
                if async_by_nature or (
                    async_at >= 0
                    and (args[async_at] if count > async_at else kwargs.get("async_op"))
                ):
                    entries.append(_in_flight(op, group, nbytes, start, end, result))
                else:
                    entries.append((op, group, nbytes, start, end))
            except Exception as error:
                timeline.error(error)
            return result

        timed.__wrapped__ = original  # type: ignore[attr-defined]
        timed.__name__ = getattr(original, "__name__", name)
        timed.__qualname__ = getattr(original, "__qualname__", name)
        timed.__doc__ = original.__doc__
        return timed


INTERCEPTOR = _Interceptor()


def blocked_ns(entries: Iterable[Collective], begin: int, end: int) -> int:
    """How long the training thread waited in blocking collectives within ``[begin, end]``.

    The union of their intervals, so that nested or overlapping calls count once.
    """
    spans = sorted(
        (max(begin, c.start_ns), min(end, c.end_ns))
        for c in entries
        if c.blocking and c.end_ns > begin and c.start_ns < end
    )
    total = 0
    cursor = begin
    for start, finish in spans:
        start = max(start, cursor)
        if finish > start:
            total += finish - start
            cursor = finish
    return total


def group_id(group: Any) -> str:
    """The process group's unique name (torch's ``group_name``); the default group's for None."""
    if group is None:
        group = dist.group.WORLD
    return str(getattr(group, "group_name", "") or "")


class GroupNames:
    """Bounded, readable process-group names: torch's ``group_desc`` (``default_pg``,
    ``mesh_dp_shard``, ``tp``...), else ``pg<group_name>``; past :data:`MAX_GROUP_NAMES`
    distinct groups, ``other``."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def __call__(self, group: Any) -> str:
        key = group_id(group)
        name = self._names.get(key)
        if name is not None:
            return name
        if len(self._names) >= MAX_GROUP_NAMES:
            return OTHER_GROUP
        resolved = dist.group.WORLD if group is None else group
        desc = str(getattr(resolved, "group_desc", "") or "")
        name = desc if desc and desc != "undefined" else f"pg{key}"
        if resolved is dist.group.WORLD:
            name = WORLD_GROUP
        self._names[key] = name
        return name


@dataclass(frozen=True)
class Roles:
    """Which of the model's process groups shard parameters and which replicate them."""

    shard_groups: frozenset[str] = frozenset()
    replicate_groups: frozenset[str] = frozenset()

    def of(self, collective: Collective) -> Role:
        op = collective.op
        if op == "reduce_scatter":
            return Role.GRAD_SYNC
        if op == "all_reduce" and group_id(collective.group) in self.replicate_groups:
            return Role.GRAD_SYNC
        if op == "all_gather" and group_id(collective.group) in self.shard_groups:
            return Role.PARAM_GATHER
        return Role.OTHER


def roles_of_fsdp2(modules: Sequence[Any]) -> Roles:
    """The shard and replicate groups of ``fully_shard`` modules, from their mesh info.

    FSDP2 keeps it on its parameter groups (private; read defensively: without it every
    reduce-scatter still counts as a gradient sync, and all-gathers as other collectives).
    """
    shard: set[str] = set()
    replicate: set[str] = set()
    for module in modules:
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            single = getattr(state, "_fsdp_param_group", None)
            groups = [single] if single is not None else []
        for param_group in groups:
            info = getattr(param_group, "mesh_info", None)
            for attr, into in (
                ("shard_process_group", shard),
                ("replicate_process_group", replicate),
            ):
                group = getattr(info, attr, None)
                if group is not None:
                    into.add(group_id(group))
    return Roles(frozenset(shard), frozenset(replicate))


def roles_of_fsdp1(model: Any) -> Roles:
    """FSDP1 shards over ``process_group``; hybrid sharding all-reduces across nodes over
    ``_inter_node_pg``, and ``NO_SHARD`` all-reduces over ``process_group`` itself."""
    shard = getattr(model, "process_group", None)
    inter_node = getattr(model, "_inter_node_pg", None)
    strategy = str(getattr(model, "sharding_strategy", ""))
    replicate = {group_id(inter_node)} if inter_node is not None else set()
    if strategy.endswith("NO_SHARD") and shard is not None:
        replicate.add(group_id(shard))
    return Roles(
        frozenset({group_id(shard)}) if shard is not None else frozenset(),
        frozenset(replicate),
    )
