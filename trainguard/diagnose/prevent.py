"""Prevent: for each root cause the report found, the configuration that avoids it next time.

Each candidate's cause has a rule here that turns the report's facts into concrete settings
(an environment variable, an argument of the training script, a launcher or scheduler
option), each with the evidence it rests on: a value is computed from what was observed
(the allocator's free share before the OOM, the step's peak against the GPU's capacity, the
gradient-sync tail, the data wait against the step, the time a restart cost) wherever the
report has it. The candidate's own ``prevention`` advice follows as practices: the analyses
keep there only what no setting expresses, so nothing is said twice. A setting two causes
share is listed once, under the first, with the evidence of both.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from trainguard import contract
from trainguard.contract import Action, EventKind, Failure
from trainguard.diagnose.context import Context, job_median, ranks_text
from trainguard.diagnose.hang import adaptive_timeout
from trainguard.diagnose.model import Candidate, IncidentRecord, Prevention, Setting
from trainguard.diagnose.oom import GIB, NEAR_CAPACITY
from trainguard.diagnose.slowdown import socket_nodes
from trainguard.diagnose.straggler import median_breakdown

Rule = Callable[[Context, Candidate], list[Setting]]

ENV = "every rank's environment"
SCRIPT = "the training script"
SCHEDULER = (
    "the scheduler's node health check: Slurm HealthCheckProgram, Kubernetes node-problem-detector"
)
# A checkpoint interval is never advised below this: saving has a cost of its own.
MIN_CHECKPOINT_SECONDS = 60.0


def plan(ctx: Context) -> None:
    """``ctx.report.prevention``: one entry per candidate, in the candidates' order."""
    seen: dict[tuple[str, str], Setting] = {}
    for candidate in ctx.report.candidates:
        failure, rule = _rule(ctx, candidate.cause)
        settings = []
        for setting in rule(ctx, candidate) + _checkpointing(ctx, failure):
            first = seen.get((setting.name, setting.value))
            if first is None:
                seen[(setting.name, setting.value)] = setting
                settings.append(setting)
            else:
                first.evidence += [e for e in setting.evidence if e not in first.evidence]
        ctx.report.prevention.append(
            Prevention(candidate.cause, failure, candidate.summary, settings, candidate.prevention)
        )


def _rule(ctx: Context, cause: str) -> tuple[Failure | None, Rule]:
    if cause.startswith(("xid_", "gpu_ecc")):
        return Failure.GPU_FAULT, _gpu_fault
    if cause == "rank_never_joined":
        timed_out = ctx.has_symptom(Failure.NCCL_TIMEOUT)
        return (Failure.NCCL_TIMEOUT if timed_out else Failure.HANG), _hang
    return _RULES.get(cause, (None, _none))


# --- OOM --------------------------------------------------------------------------------------
def _fragmentation(ctx: Context, c: Candidate) -> list[Setting]:
    frag, retries = c.facts.get("fragmentation_ratio"), c.facts.get("alloc_retries_before_oom")
    evidence = [f"{frag:.0%} of the reserved memory held no tensor before the OOM"] if frag else []
    if retries:
        evidence.append(f"{retries:.0f} allocator retries (cudaMalloc after emptying the cache)")
    evidence += [f"log: {f.summary}" for f in ctx.findings(Failure.OOM)]
    return [
        Setting(
            "PYTORCH_CUDA_ALLOC_CONF",
            "expandable_segments:True",
            ENV,
            [*evidence, "segments that grow in place leave no unusable gaps between blocks"],
        )
    ]


def _micro_batches(ctx: Context, c: Candidate) -> list[Setting]:
    """Split the step so its peak fits with headroom; the OOM guard's own split when it found
    one that worked."""
    allocated, capacity = c.facts.get("allocated_bytes"), c.facts.get("capacity_bytes")
    recovered = [e for e in ctx.events(EventKind.OOM_RECOVERED.value) if e.details]
    splits = [int(s) for e in recovered if str(s := e.details.get("micro_batches", "")).isdigit()]
    if splits:
        split = max(splits)
        evidence = [
            f"trainguard's OOM guard recovered the step in {split} micro-batches "
            f"({len(recovered)} oom_recovered event(s))"
        ]
    elif allocated and capacity:
        tried = max(
            (int(f.fields.get("tried_bytes", 0)) for f in ctx.findings(Failure.OOM)), default=0
        )
        needed = allocated + tried
        # Activations scale with the micro-batch, parameters and optimizer state do not: the
        # split is the least that could fit, a power of two so the batch divides evenly.
        split = 2 ** max(1, math.ceil(math.log2(needed / (NEAR_CAPACITY * capacity))))
        evidence = [
            f"the step held {allocated / GIB:.1f} GiB"
            + (f" and asked for {tried / GIB:.1f} GiB more" if tried else "")
            + f" on a {capacity / GIB:.1f} GiB GPU; {split} micro-batches bring its "
            f"activations under {NEAR_CAPACITY:.0%} of capacity if activations dominate"
        ]
    else:
        return []
    held = (
        f"{allocated / GIB:.1f} GiB of {capacity / GIB:.1f} GiB allocated at the failing step"
        if allocated and capacity
        else f"the step fit only in {split} micro-batches"
    )
    return [
        Setting(
            "micro-batch size / gradient accumulation steps",
            f"micro-batch / {split}, gradient_accumulation_steps x {split} (global batch kept)",
            SCRIPT,
            evidence,
        ),
        Setting(
            "activation checkpointing",
            "on for every transformer block (torch.utils.checkpoint, or FSDP's "
            "apply_activation_checkpointing)",
            SCRIPT,
            [
                f"{held}; recomputing activations in backward trades about a third more "
                "compute for most of their memory"
            ],
        ),
    ]


def _memory_history(ctx: Context, c: Candidate) -> list[Setting]:
    evidence = [e for e in c.evidence if "grew" in e] or c.evidence[:1]
    return [
        Setting(
            "torch.cuda.memory._record_memory_history",
            "max_entries=100000, dumped with torch.cuda.memory._dump_snapshot on OOM",
            SCRIPT,
            [*evidence, "the memory series do not say which tensors held it; a snapshot does"],
        )
    ]


# --- hangs and NCCL timeouts ------------------------------------------------------------------
def _hang(ctx: Context, c: Candidate) -> list[Setting]:
    settings = []
    timeout = adaptive_timeout(ctx)
    if timeout is not None:
        settings.append(
            Setting(
                "init_process_group(timeout=...)",
                f"timedelta(seconds={timeout[0]:.0f})",
                SCRIPT,
                [timeout[1] + ", instead of NCCL's default 10 min"],
            )
        )
    peak = max((v for s in ctx.sig.oldest_inflight.values() for v in s.values()), default=0.0)
    settings.append(
        Setting(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "3",
            ENV,
            [
                f"a collective stayed in flight {peak:.0f} s (oldest in-flight collective)"
                if peak
                else "collectives stopped completing",
                "on a timeout the process must exit (3, torch >= 2.2's default; never 0) so "
                "torchrun restarts the group instead of waiting in NCCL's teardown",
            ],
        )
    )
    dumps = [d for d in ctx.dumps if d.mismatches]
    dumped = (
        f"this hang's Flight Recorder dumps ({len(dumps)} folder(s)) named "
        f"{ranks_text(ctx.stall_ranks)} as the rank that never joined"
        if dumps
        else "no Flight Recorder dump was read for this hang, so the rank the others wait for "
        + (
            f"was named from weaker signals ({ranks_text(ctx.stall_ranks)})"
            if ctx.stall_ranks
            else "is unknown"
        )
    )
    settings += [
        Setting("TORCH_NCCL_DUMP_ON_TIMEOUT", "1", ENV, [dumped]),
        Setting(
            "TORCH_FR_BUFFER_SIZE",
            "2000",
            ENV,
            ["the Flight Recorder keeps this many collectives per rank for the dump"],
        ),
    ]
    sockets = socket_nodes(ctx)
    if sockets:
        settings.append(
            Setting(
                "NCCL_IB_HCA",
                "the nodes' InfiniBand HCAs (e.g. mlx5), with NCCL_IB_DISABLE unset",
                ENV,
                [
                    f"{contract.NCCL_INFO.name} shows the TCP socket transport on "
                    f"{', '.join(sockets)}: collectives over sockets are slower and time out "
                    "first"
                ],
            )
        )
    return settings


# --- stragglers, throttling and faulty GPUs ---------------------------------------------------
def _elastic(ctx: Context, nodes: list[str], why: str) -> Setting:
    count = len(ctx.sig.nodes)
    return Setting(
        "torchrun --nnodes",
        f"{max(1, count - 1)}:{count}" if count > 1 else "MIN:MAX with MIN below the job's size",
        "the launcher",
        [
            f"{why} on {', '.join(nodes) or 'one node'}; the job ran on {count} node(s): an "
            "elastic minimum below that lets exclude_node continue without it"
        ],
    )


def _straggler(ctx: Context, c: Candidate) -> list[Setting]:
    nodes = [str(c.facts["node"])] if "node" in c.facts else ctx.report.scope.nodes
    ratio, phase = c.facts.get("ratio"), c.facts.get("slow_phase")
    why = f"{ratio:.2f}x the job's median compute time" if ratio else "a straggler"
    if phase:
        why += f", slowest in {phase}"
    settings = [_elastic(ctx, nodes, why)]
    reasons = c.facts.get("reasons")
    checks = (
        f"fail on clocks-event reasons {', '.join(map(str, reasons))}"
        if isinstance(reasons, list) and reasons
        else "fail on any clocks-event reason but idle"
    )
    settings.append(
        Setting(
            "GPU health check",
            f"nvidia-smi -q -d PERFORMANCE,TEMPERATURE ({checks}); dcgmi diag -r 2 before "
            "a node returns to service",
            SCHEDULER,
            [f"{why} on {', '.join(nodes) or 'its node'}"]
            + [e for e in c.evidence if "temperature" in e or "throttled" in e.lower()],
        )
    )
    return settings


def _gpu_fault(ctx: Context, c: Candidate) -> list[Setting]:
    node, gpu = str(c.facts.get("node", "")), str(c.facts.get("gpu", ""))
    return [
        _elastic(ctx, [node], f"GPU {gpu} failed"),
        Setting(
            "GPU health check",
            "dcgmi diag -r 3 before a node returns to service; drain on Xid "
            f"{', '.join(map(str, ctx.thresholds.xid_critical))} or uncorrectable ECC",
            SCHEDULER,
            c.evidence[:2],
        ),
    ]


# --- input pipeline and shared dependencies ---------------------------------------------------
def _data_loading(ctx: Context, c: Candidate) -> list[Setting]:
    sig = ctx.sig
    found = c.facts.get("ranks") or [c.facts.get("worst_rank")]
    ranks = [r for r in found if isinstance(r, int)]
    data = median_breakdown(sig, ranks, sig.start, sig.end).get("data")
    medians = job_median(sig.compute)
    compute = statistics.median(medians.values()) if medians else None
    value = "prefetch_factor=4, pin_memory=True, persistent_workers=True"
    if data is None or compute is None or compute <= data:
        return [Setting("DataLoader(...)", f"num_workers raised, {value}", SCRIPT, c.evidence[:1])]
    # The loader delivers a batch every (data wait + the rest of the step) and the GPU takes
    # one every (rest of the step): the workers must scale by the ratio of the two.
    rest = compute - data
    factor = math.ceil(compute / rest * 10) / 10
    return [
        Setting(
            "DataLoader(...)",
            f"num_workers x {factor:g} at least, {value}",
            SCRIPT,
            [
                f"{ranks_text(ranks)} waited {data:.3f} s for data in a {compute:.3f} s step "
                f"whose other work takes {rest:.3f} s: the loader must deliver "
                f"{compute / rest:.2f}x as fast"
            ],
        )
    ]


def _shared(ctx: Context, c: Candidate) -> list[Setting]:
    sockets = socket_nodes(ctx)
    if not sockets:
        return []
    return [
        Setting(
            "NCCL_IB_HCA, NCCL_SOCKET_IFNAME",
            "the nodes' InfiniBand HCAs (e.g. mlx5), the fabric's interface; no NCCL_IB_DISABLE=1",
            ENV,
            [
                f"{contract.NCCL_INFO.name} shows the TCP socket transport on "
                f"{', '.join(sockets)} while every rank slowed down"
            ],
        )
    ]


def _none(ctx: Context, c: Candidate) -> list[Setting]:
    return []


_RULES: dict[str, tuple[Failure | None, Rule]] = {
    "memory_fragmentation": (Failure.OOM, _fragmentation),
    "does_not_fit": (Failure.OOM, _micro_batches),
    "memory_growth": (Failure.OOM, _memory_history),
    "oom_unexplained": (
        Failure.OOM,
        lambda ctx, c: _micro_batches(ctx, c) + _memory_history(ctx, c),
    ),
    "memory_creep": (Failure.OOM, _memory_history),
    "low_memory_headroom": (Failure.OOM, _none),
    # A restart's cost is the checkpoint interval's concern (_checkpointing), no setting else.
    "rank_killed": (Failure.RANK_FAILURE, _none),
    "rank_error": (Failure.RANK_FAILURE, _none),
    "workers_terminated": (Failure.RANK_FAILURE, _none),
    "rank_failure_unnamed": (Failure.RANK_FAILURE, _none),
    Failure.GPU_THROTTLING.value: (Failure.GPU_THROTTLING, _straggler),
    "node_degraded": (Failure.STRAGGLER, _straggler),
    "slow_gpu_or_process": (Failure.STRAGGLER, _straggler),
    "data_loading": (Failure.DATALOADER_BOUND, _data_loading),
    "shared_dependency": (Failure.JOB_SLOWDOWN, _shared),
}


# --- checkpointing, from what a restart cost -------------------------------------------------
def _checkpointing(ctx: Context, failure: Failure | None) -> list[Setting]:
    """A checkpoint interval from the time a restart of this failure lost: recomputing the
    steps since the last checkpoint should cost no more than the restart itself."""
    validation = ctx.report.validation
    if failure is None or validation is None:
        return []
    same = (
        {failure, Failure.HANG, Failure.NCCL_TIMEOUT}
        if failure in (Failure.HANG, Failure.NCCL_TIMEOUT)
        else {failure}
    )
    restarts = [
        i
        for i in validation.incidents
        if i.failure in same
        and i.acted_at is not None
        and i.recovered_at is not None
        and any(t.action == Action.RESTART_FROM_CHECKPOINT.value for t in i.tried)
    ]
    step = _step_seconds(ctx)
    if not restarts or step is None:
        return []
    incident = restarts[-1]
    return [_interval(ctx, incident, step)]


def _interval(ctx: Context, incident: IncidentRecord, step: float) -> Setting:
    assert incident.acted_at is not None and incident.recovered_at is not None
    lost = incident.recovered_at - incident.acted_at
    evidence = [
        f"incident {incident.id}: the restart from checkpoint took {lost:.0f} s from the action "
        f"to training passing step {incident.baseline_step} again (its step before the failure)"
        if incident.baseline_step is not None
        else f"incident {incident.id}: {lost:.0f} s from the restart to verified recovery"
    ]
    saved = [
        e.step
        for e in ctx.events(EventKind.CHECKPOINT.value)
        if e.step is not None
        and (incident.baseline_step is None or e.step <= incident.baseline_step)
    ]
    if saved and incident.baseline_step is not None:
        redone = incident.baseline_step - max(saved)
        overhead = max(MIN_CHECKPOINT_SECONDS, lost - redone * step)
        evidence.append(
            f"the last checkpoint was of step {max(saved)}: {redone} steps "
            f"({redone * step:.0f} s at {step:.3g} s per step) were computed again; the rest, "
            f"{lost - redone * step:.0f} s, is the restart itself"
        )
    else:
        overhead = max(MIN_CHECKPOINT_SECONDS, lost / 2)
        evidence.append(
            "no checkpoint event in the logs (Instrumentation.record_checkpoint) says which "
            f"share was recomputation; at most half of it ({overhead:.0f} s) is advised"
        )
    every = max(1, math.floor(overhead / step))
    evidence.append(
        f"every {every} steps x {step:.3g} s (the job's median step time) = "
        f"{every * step / 60:.1f} min of recomputation at most per restart"
    )
    return Setting("checkpoint interval", f"every {every} steps", SCRIPT, evidence)


def _step_seconds(ctx: Context) -> float | None:
    median = job_median(ctx.sig.step_time, 1)
    return statistics.median(median.values()) if median else None
