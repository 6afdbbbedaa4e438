"""torch's Flight Recorder on a rank: what is in flight, and the dumps a stall writes.

The Flight Recorder (``TORCH_FR_BUFFER_SIZE``) keeps a ring of this rank's recent collectives
in C++. :func:`read_state` asks it, as JSON, which collectives are still pending and how far
each process group's sequence numbers got; the parsing is pure (:func:`pending_collectives`,
:func:`collective_progress`) and tested on fixtures. :func:`write_dump` writes the pickle that
torch's analyzer (``python -m torch.distributed.flight_recorder.fr_trace``) reads;
``trainguard.diagnose.flight_recorder`` runs that analyzer over every rank's dumps.
"""

from __future__ import annotations

import json
import pickle
import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard import contract


@dataclass(frozen=True, slots=True)
class PendingCollectives:
    """The collectives of this rank launched and not yet completed."""

    count: int
    oldest_age_seconds: float
    oldest_seq: int | None = None
    oldest_name: str | None = None
    oldest_timeout_seconds: float | None = None
    oldest_group: str | None = None  # its process group, named as the timeline names it


NOTHING_PENDING = PendingCollectives(count=0, oldest_age_seconds=0.0)


def _c10d() -> Any:
    import torch

    return torch._C._distributed_c10d


def flight_recorder_available() -> bool:
    module = _c10d()
    return hasattr(module, "_dump_fr_trace_json") and hasattr(module, "_dump_fr_trace")


def read_state(only_active: bool = True, include_collectives: bool = True) -> dict[str, Any]:
    """This rank's Flight Recorder state as a dict (JSON dump)."""
    raw = _c10d()._dump_fr_trace_json(include_collectives, only_active)
    state: dict[str, Any] = json.loads(raw)
    return state


def _is_pending(entry: Mapping[str, Any]) -> bool:
    return not entry.get("retired", False) and entry.get("state") != "completed"


def group_label(process_group: Any) -> str | None:
    """An entry's ``process_group`` (``[name, desc]``) as the timeline names groups: the
    description (``default_pg``, ``mesh_dp_shard``, ``tp``...), else ``pg<name>``."""
    if not isinstance(process_group, list | tuple) or len(process_group) != 2:
        return None
    name, desc = (str(part) for part in process_group)
    return desc if desc and desc != "undefined" else f"pg{name}"


def pending_collectives(state: Mapping[str, Any], now_ns: int) -> PendingCollectives:
    """Count the pending collectives of a Flight Recorder state and find the oldest."""
    pending = [e for e in state.get("entries", []) if _is_pending(e) and not e.get("is_p2p", False)]
    if not pending:
        return NOTHING_PENDING
    oldest = min(pending, key=lambda e: int(e.get("time_created_ns", now_ns)))
    timeout_ms = oldest.get("timeout_ms")
    return PendingCollectives(
        count=len(pending),
        oldest_age_seconds=max(0.0, (now_ns - int(oldest.get("time_created_ns", now_ns))) / 1e9),
        oldest_seq=int(oldest["collective_seq_id"]) if "collective_seq_id" in oldest else None,
        oldest_name=str(oldest.get("profiling_name", "")) or None,
        oldest_timeout_seconds=float(timeout_ms) / 1000 if timeout_ms else None,
        oldest_group=group_label(oldest.get("process_group")),
    )


def collective_progress(state: Mapping[str, Any]) -> tuple[int, int] | None:
    """(launched, completed) collectives summed over process groups, from ``pg_status``."""
    status = state.get("pg_status")
    if not isinstance(status, Mapping) or not status:
        return None
    launched = completed = 0
    for group in status.values():
        launched += max(0, int(group.get("last_enqueued_collective", 0)))
        completed += max(0, int(group.get("last_completed_collective", 0)))
    return launched, completed


def repair_pg_config(dump: dict[str, Any]) -> dict[str, Any]:
    """Name the unnamed process group of a gloo dump after the group its entries use.

    On gloo (torch 2.13) ``pg_config`` lists the default group under an empty name and
    description while every entry says ``("0", "default_pg")``, and torch's analyzer then
    cannot find the group. Repaired only when unambiguous: one unnamed group, one group used.
    """
    config = dump.get("pg_config")
    used = {tuple(e["process_group"]) for e in dump.get("entries", []) if "process_group" in e}
    if not isinstance(config, dict) or set(config) != {""} or len(used) != 1:
        return dump
    ((name, desc),) = used
    return {**dump, "pg_config": {name: {**config[""], "name": name, "desc": desc}}}


def write_dump(directory: Path, rank: int) -> Path:
    """Write this rank's whole Flight Recorder trace (pickle, with stacks) for the analyzer."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{contract.FLIGHT_RECORDER_DUMP_PREFIX}{rank}"
    tmp = path.with_name(path.name + ".tmp")
    # Our own process's Flight Recorder output, so unpickling it is safe.
    dump = repair_pg_config(pickle.loads(_c10d()._dump_fr_trace(True, True, False)))
    tmp.write_bytes(pickle.dumps(dump))
    tmp.replace(path)
    return path


def format_thread_stacks() -> str:
    """Every Python thread's stack, named, innermost call last."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f'Thread {ident} "{names.get(ident, "?")}":\n{stack}')
    return "\n".join(parts)


def write_stacks(directory: Path, rank: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{contract.STACKS_DUMP_PREFIX}{rank}.txt"
    path.write_text(format_thread_stacks())
    return path
