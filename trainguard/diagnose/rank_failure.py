"""A rank that died and torchrun restarted the worker group: when, and which rank died first.

When: the job's restart count (``trainguard_elastic_restarts``, each rank's
``TORCHELASTIC_RESTART_COUNT``) rose in the window. Which rank: the torchrun agents' own lines
(``failed (exitcode: -9) local_rank: 0 (pid: 27632)``, read by triage's
``ElasticFailureDetector``) name a worker by its pid, and the ranks' ECS lines say which rank
each pid was (:attr:`~trainguard.diagnose.evidence.LogEvidence.pid_ranks`). When several
workers failed, the first observed failure is the cause and the rest its consequences: a
worker killed by a signal before one that exited with an error (its peers exit 1 once it is
gone), then the earliest by the agent's timestamp. A worker terminated from outside (SIGTERM:
a repair's restart, the scheduler) is no rank's fault. Older hooks export no restart count;
the agents' lines alone still say that a rank failed.

A rank that dies mid-collective leaves its peers waiting in it until torchrun tears the group
down: a hang the hang analysis sees first. The death is that hang's cause when the rank was not
itself waiting in the collective before it died (its oldest in-flight collective, before the
restart, far younger than its peers'), whatever its exit code (gloo aborts too); the hang is
then reported as the death's consequence. A rank stuck in the collective that died of it (NCCL's
watchdog abort, a timeout error) is the hang's consequence instead.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from typing import Any

from trainguard import contract
from trainguard.contract import Cause, Failure
from trainguard.diagnose.analysis import explains
from trainguard.diagnose.context import Context, ranks_text, utc
from trainguard.diagnose.model import Candidate, Scope, ScopeLevel, Symptom
from trainguard.diagnose.prevent import nothing, prevents
from trainguard.diagnose.prometheus import Series

# Signals another process sends to stop a worker: the agent tearing a group down, a repair's
# restart, the scheduler's preemption.
_FROM_OUTSIDE = {-signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP}
_NO_TIME = "~"  # sorts after every "MM-DD HH:MM:SS" time
# A death another symptom explains, or a restart from outside, ranks its candidate under the
# least likely explanation of that symptom (0.3): the candidates explain the first symptom
# first.
_SECONDARY = 0.25
# A restart at most this long after a repair of the remediation service is that repair's (its
# SIGTERM, torchrun's teardown, the rendezvous and the new workers reporting).
REPAIR_LEAD_SECONDS = 60.0


@dataclass(frozen=True)
class Death:
    """One failed worker, as an agent line or torchrun's summary reported it."""

    ranks: tuple[int, ...]  # the ranks its pid logged as (one when the join is unambiguous)
    exitcode: int | None
    signal: str | None
    pid: int | None
    local_rank: int | None
    time: str | None  # "MM-DD HH:MM:SS.ffffff" of the agent's line
    where: str  # file:line of the agent's line
    joined: bool  # its pid is one of this job's ranks' processes

    @property
    def rank(self) -> int | None:
        return self.ranks[0] if len(self.ranks) == 1 else None

    @property
    def order(self) -> tuple[int, str]:
        """Killed by a signal, then exited with an error, then stopped from outside; then
        the agent's time."""
        code = self.exitcode
        if code is None:
            kind = 3
        elif code in _FROM_OUTSIDE:
            kind = 2
        else:
            kind = 0 if code < 0 else 1
        return kind, self.time or _NO_TIME

    @property
    def how(self) -> str:
        if self.signal:
            return f"{self.signal} (exit code {self.exitcode})"
        return f"exit code {self.exitcode}" if self.exitcode is not None else "an unknown exit"

    def line(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else f"local rank {self.local_rank}"
        return (
            f"{self.where}: {who} (pid {self.pid}) failed with {self.how}"
            + (f" at {self.time}" if self.time else "")
            + (
                ""
                if self.rank is not None or not self.ranks
                else f"; its pid was {ranks_text(list(self.ranks))}"
            )
        )


@explains(Failure.RANK_FAILURE, after=(Failure.GPU_FAULT, Failure.OOM, Failure.HANG))
def analyse(ctx: Context) -> None:
    """A restart of the worker group (the restart count rose), or failed workers in the
    agents' logs, and the rank whose failure came first."""
    sig = ctx.sig
    rises = {r: up for r, s in sig.elastic_restarts.items() if (up := _rises(s))}
    deaths = _deaths(ctx)
    joined = [d for d in deaths if d.joined]
    if joined:
        pool = joined
    elif rises or not sig.elastic_restarts:
        # Without this job's pids in the logs (or a hook that exports no restart count), the
        # agents' lines still say a worker failed, but not which rank it was.
        pool = deaths
    else:
        pool = []
        if deaths:
            ctx.report.notes.append(
                f"{len(deaths)} failed worker(s) in the agents' logs are none of this job's "
                "processes and its restart count did not rise: left out"
            )
    if not (rises or pool):
        return
    root = min(pool, key=lambda d: d.order) if pool else None
    when = min((up[0][0] for up in rises.values()), default=None)
    restarts = max((sum(n for _, n in up) for up in rises.values()), default=0.0)
    if when is not None:
        repair = next((a for t, a in ctx.repairs if when - REPAIR_LEAD_SECONDS <= t <= when), None)
        if repair is not None:
            why = f"the remediation service's {repair}"
            _report_planned(ctx, when, restarts, why, Cause.REPAIR)
            return
        if _shrank(sig.world_size, when):
            sizes = [v for s in sig.world_size for _, v in s.points if v == v]
            _report_planned(
                ctx,
                when,
                restarts,
                f"the job re-formed at world size {min(sizes):.0f} (from {max(sizes):.0f}): a "
                "node left it (an exclusion)",
                Cause.NODE_LEFT,
            )
            return
    _report(ctx, root, pool, when, restarts, deaths)


def _shrank(world_size: list[Series], when: float) -> bool:
    """Whether the job re-formed smaller at its restart (within a minute after it): a node
    excluded on purpose, whose survivors' workers fail once it is gone."""
    points = [(t, v) for s in world_size for t, v in s.points if v == v]
    before = [v for t, v in points if t < when]
    after = [v for t, v in points if when <= t <= when + 60]
    return bool(before and after) and min(after) < max(before)


def _report_planned(ctx: Context, when: float, restarts: float, why: str, cause: Cause) -> None:
    """A restart something else explains (a repair, a node leaving the job): reported, below
    every failure, and no rank is blamed."""
    summary = (
        f"torchrun restarted the worker group {restarts:.0f} time(s), first at {utc(when)}, "
        f"after {why}; no rank failed on its own"
    )
    ctx.symptom(
        Symptom(Failure.RANK_FAILURE, summary, [contract.ELASTIC_RESTARTS.name], when, [], [], 1),
        Scope(ScopeLevel.JOB, "the job restarted on purpose"),
    )
    ctx.candidate(
        Candidate(
            cause,
            f"The worker group restarted after {why}, not because a rank failed",
            _SECONDARY,
            [summary + f" ({contract.ELASTIC_RESTARTS.name}, {contract.WORLD_SIZE.name})"],
            ["Check the remediation service's incidents for the repair and its reason."],
            [
                "Nothing to prevent in the restart itself; prevent what the repair answered "
                "(its incident's cause), and keep checkpoints frequent enough that a planned "
                "restart loses little work."
            ],
            {"restarted_at": when},
        )
    )


def _rises(series: Series) -> list[tuple[float, float]]:
    """(time, by how much) of each rise of a restart count."""
    out = []
    previous: float | None = None
    for t, v in series.points:
        if v != v:
            continue
        if previous is not None and v > previous:
            out.append((t, v - previous))
        previous = v
    return out


def _deaths(ctx: Context) -> list[Death]:
    """Every failed worker in triage's rank_failure findings, joined by pid to a rank."""
    pids = ctx.logs.pid_ranks
    local_of = {r.rank: r.local_rank for r in ctx.sig.ranks}
    found: dict[tuple[Any, ...], Death] = {}
    for finding in ctx.findings(Failure.RANK_FAILURE):
        where = f"{finding.location.file}:{finding.location.line}"
        workers: list[dict[str, Any]] = list(finding.fields.get("agent_failures") or [])
        root = finding.fields.get("root_cause") or {}
        if root and not any(w.get("pid") == root.get("pid") for w in workers):
            workers.append(root)
        for worker in workers:
            pid, local = worker.get("pid"), worker.get("local_rank")
            ranks = set(pids.get(pid, ())) if isinstance(pid, int) else set()
            if len(ranks) > 1 and local is not None:
                # Two nodes reused one pid: the worker's local rank tells them apart.
                ranks = {r for r in ranks if local_of.get(r) == str(local)} or ranks
            if not ranks and isinstance(worker.get("rank"), int):
                ranks = {worker["rank"]}  # torchrun's summary names the global rank
            line = worker.get("line")
            death = Death(
                tuple(sorted(ranks)),
                worker.get("exitcode"),
                worker.get("signal"),
                pid,
                local,
                # An agent's line (it has a line number) holds its own time; the summary's
                # entries torchrun's "time" field.
                worker.get("time") if "line" in worker else _summary_time(worker.get("time")),
                f"{finding.location.file}:{line}" if line else where,
                isinstance(pid, int) and pid in pids,
            )
            found.setdefault((pid, death.exitcode, death.where), death)
    return list(found.values())


def _summary_time(value: Any) -> str | None:
    """torchrun's summary writes "2024-11-07_10:45:02"; the agents' lines "MM-DD HH:MM:SS"."""
    if not isinstance(value, str) or len(value) < 19:
        return None
    return f"{value[5:10]} {value[11:19]}.000000"


def _consequence(ctx: Context, root: Death, restarted: float | None) -> bool:
    """Whether another symptom explains the death: an OOM or a GPU fault of that rank, or a
    hang the rank was itself stuck in (NCCL's watchdog aborting a waiting rank, a peer's
    timeout error). A rank that died without waiting (it never joined: killed, its process
    group failed, whatever its exit code) caused the hang its peers were left in."""
    rank = root.rank
    for symptom in ctx.report.symptoms:
        if symptom.severity < 3:
            continue
        if symptom.failure in (Failure.OOM, Failure.GPU_FAULT):
            node = ctx.sig.node_of(rank) if rank is not None else ""
            if rank in symptom.ranks or (node and node in symptom.nodes):
                return True
        hang = symptom.failure in (Failure.HANG, Failure.NCCL_TIMEOUT)
        if hang and _was_stuck(ctx, rank, restarted):
            return True
    return False


def _was_stuck(ctx: Context, rank: int | None, restarted: float | None) -> bool:
    """Whether the rank was itself waiting in the stalled collective before it died (its
    oldest in-flight collective as old as its peers'): then its error is the hang's timeout or
    teardown. A rank whose peers waited far longer than it never joined: its death caused the
    hang (they wait until its process is gone). Only the job as it was before the restart
    counts (``restarted``): a restarted rank waiting for its peers to start is another story."""
    if rank is None:
        return bool(ctx.stall_ranks)
    until = math.inf if restarted is None else restarted
    peaks = {
        r: max((v for t, v in s.points if v == v and t < until), default=0.0)
        for r, s in ctx.sig.oldest_inflight.items()
    }
    others = max((v for r, v in peaks.items() if r != rank), default=0.0)
    if others <= 0.0:
        return bool(ctx.stall_ranks) and rank not in ctx.stall_ranks
    return peaks.get(rank, 0.0) >= others / 2


def _report(
    ctx: Context,
    root: Death | None,
    pool: list[Death],
    when: float | None,
    restarts: float,
    deaths: list[Death],
) -> None:
    sig = ctx.sig
    restarted = (
        f"torchrun restarted the worker group {restarts:.0f} time(s), first at {utc(when)}"
        if when is not None
        else "torchrun reported failed workers"
    )
    signals = ([contract.ELASTIC_RESTARTS.name] if when is not None else []) + (
        ["torchrun agent logs"] if pool else []
    )
    rank = root.rank if root is not None else None
    ranks = [rank] if rank is not None else []
    if root is None:
        severity, first = 2, False
        summary = f"{restarted}; the logs given do not say which rank failed"
    elif root.exitcode in _FROM_OUTSIDE:
        # A repair's restart or the scheduler: the symptom is the restart, not a failed rank.
        severity, first, ranks = 1, False, []
        summary = f"{restarted}: the workers were terminated from outside ({root.how})"
    else:
        explained = _consequence(ctx, root, when)
        severity, first = (2, False) if explained else (3, True)
        who = f"rank {rank}" if rank is not None else f"local rank {root.local_rank}"
        summary = f"{restarted}: {who} died first ({root.how})"
        if not explained:
            _its_hang(ctx, root, when)
    nodes = sorted({sig.node_of(r) for r in ranks if sig.node_of(r)})
    scope = (
        ctx.rank_scope(
            ranks,
            "its process died; torchrun restarted every rank, which lost the work since the "
            "last checkpoint",
        )
        if ranks
        else Scope(ScopeLevel.JOB, "the whole job restarted; which rank failed is not known")
    )
    ctx.symptom(
        Symptom(Failure.RANK_FAILURE, summary, signals, when, ranks, nodes, severity),
        scope,
        first=first,
    )
    counted = [f"{restarted} ({contract.ELASTIC_RESTARTS.name})"] if when is not None else []
    candidate = _candidate(root, pool, counted, deaths)
    if severity < 3:
        candidate.confidence = min(candidate.confidence, _SECONDARY)
    ctx.candidate(candidate)


def _its_hang(ctx: Context, root: Death, restarted: float | None) -> None:
    """The hang the dead rank's peers were left in, once the death is known to be the cause:
    they waited in their collective for it (it is the rank they waited for, or the hang names
    none) until torchrun tore the group down. Reported as the death's consequence, and the
    hang's own explanation (a rank that never joined) ranked below the death's."""
    who = f"rank {root.rank}" if root.rank is not None else f"local rank {root.local_rank}"
    for symptom in list(ctx.report.symptoms):
        hang = symptom.failure in (Failure.HANG, Failure.NCCL_TIMEOUT)
        if not hang or symptom.severity < 3:
            continue
        if symptom.ranks and root.rank not in symptom.ranks:
            continue
        if restarted is not None and symptom.since is not None and symptom.since > restarted:
            continue  # a stall after the restart is the restarted job's
        ctx.consequence(symptom, f"the consequence of {who}'s death: its peers waited for it")
        for candidate in ctx.report.candidates:
            if candidate.cause is Cause.RANK_NEVER_JOINED:
                candidate.confidence = min(candidate.confidence, _SECONDARY)
                candidate.evidence.append(f"{who} died ({root.how}); its peers waited for it")


def _candidate(
    root: Death | None, pool: list[Death], counted: list[str], deaths: list[Death]
) -> Candidate:
    evidence = list(counted)
    if root is not None:
        evidence.append("first failure: " + root.line())
        if root.rank is None and len(root.ranks) > 1:
            evidence.append(f"pid {root.pid} logged as several ranks: no rank is named")
        elif root.rank is None:
            evidence.append(f"pid {root.pid} is in none of this job's ranks' logs")
        later = sorted((d for d in pool if d is not root), key=lambda d: d.order)
        evidence += ["then: " + d.line() for d in later[:4]]
    foreign = len(deaths) - len(pool)
    if foreign:
        evidence.append(
            f"{foreign} other failed worker(s) in the logs were not this job's processes "
            "(earlier runs): left out"
        )
    facts: dict[str, object] = {
        "rank": root.rank if root else None,
        "exitcode": root.exitcode if root else None,
        "signal": root.signal if root else None,
        "pid": root.pid if root else None,
        "failed_at": root.time if root else None,
    }
    if root is None:
        return Candidate(
            Cause.RANK_FAILURE_UNNAMED,
            "A worker failed and torchrun restarted the group; the agents' logs given do not "
            "name it",
            _SECONDARY,
            evidence,
            [
                "Pass the torchrun agents' output and the ranks' ECS logs with --logs: the "
                "agent's 'failed (exitcode: ...) (pid: ...)' line and the pid name the rank."
            ],
            [
                "Ship the torchrun agents' output alongside the ranks' ECS logs (run the agent "
                "with --tee or collect its stderr), so the next failure names its rank."
            ],
            facts,
        )
    who = f"Rank {root.rank}" if root.rank is not None else f"Local rank {root.local_rank}"
    if root.exitcode in _FROM_OUTSIDE:
        return Candidate(
            Cause.WORKERS_TERMINATED,
            f"The workers were stopped from outside ({root.how}): a restart by the "
            "remediation service or the scheduler, not a failed rank",
            _SECONDARY,
            evidence,
            ["Check the remediation service's incidents and the scheduler's records."],
            [
                "If the scheduler preempts the job, checkpoint at least as often as it "
                "preempts, so each restart resumes close to where it stopped."
            ],
            facts,
        )
    if root.exitcode is not None and root.exitcode < 0:
        return Candidate(
            Cause.RANK_KILLED,
            f"{who} was killed by {root.signal or 'a signal'}; the other ranks failed after it",
            0.8 if root.rank is not None else 0.5,
            evidence,
            [
                "SIGKILL is usually the host's OOM killer (`dmesg | grep -i 'killed process'` "
                "on the rank's node) or the scheduler enforcing a limit; SIGSEGV/SIGBUS a "
                "crash in native code (driver, NCCL, an extension).",
                "One restart needs nothing more; if the same node's rank dies again, drain it.",
            ],
            ["Host memory limits that leave room for the data loader's workers."],
            facts,
        )
    output = f"'[rank{root.rank}]:' lines" if root.rank is not None else "its lines"
    return Candidate(
        Cause.RANK_ERROR,
        f"{who} exited with an error ({root.how}); the other ranks failed after it",
        0.8 if root.rank is not None else 0.5,
        evidence,
        [
            f"Read the exception in {who.lower()}'s output (its traceback, {output} under "
            "torchrun --tee): the other ranks' errors (connection closed by peer) are its "
            "consequences."
        ],
        [
            "Run the failing code path (the rank's exception) in a short pre-flight job at "
            "the same world size before a long run; bound torchrun's --max-restarts so a "
            "deterministic error stops the job instead of restarting it forever."
        ],
        facts,
    )


# A restart the service's repair or a node leaving the job explains: nothing failed, so nothing
# is to be prevented (the incident of what the repair answered has its own prevention).
prevents(Cause.REPAIR, Cause.NODE_LEFT, answers=lambda ctx: None)(nothing)
