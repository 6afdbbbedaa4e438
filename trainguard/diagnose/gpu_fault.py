"""GPU faults: Xid and uncorrectable ECC errors, from the exporter or the kernel log, and the
driver's failures reported without an Xid (a GPU fallen off the bus, RmInitAdapter failed)."""

from __future__ import annotations

from trainguard import contract
from trainguard.contract import Cause, Failure
from trainguard.diagnose.analysis import explains
from trainguard.diagnose.context import Context, ranks_text, utc
from trainguard.diagnose.model import Candidate, Scope, ScopeLevel, Setting, Symptom
from trainguard.diagnose.prevent import SCHEDULER, elastic_minimum, prevents
from trainguard.diagnose.prometheus import Series
from trainguard.diagnose.signals import increments
from trainguard.triage.xid import DRIVER_EVENTS, XidInfo, driver_event_drain
from trainguard.triage.xid import lookup as xid_lookup


# --- faults ---------------------------------------------------------------------------------
@explains(Failure.GPU_FAULT)
def analyse(ctx: Context) -> None:
    """Xids and uncorrectable ECC errors; Xids from kernel logs when the exporter saw none."""
    for s in ctx.sig.xid:
        for t, amount in increments(s):
            _xid(ctx, s, t, amount)
    for s in ctx.sig.ecc:
        if s.label(contract.LABEL_KIND) != "uncorrected":
            continue
        for t, amount in increments(s):
            _ecc(ctx, s.label(contract.LABEL_NODE), s.label(contract.LABEL_GPU), t, amount)
    if not ctx.sig.xid:
        for finding in ctx.findings(Failure.GPU_FAULT):
            _xid_from_log(ctx, finding.fields, finding.summary)


def _ecc(ctx: Context, node: str, gpu: str, t: float, amount: float) -> None:
    ranks = ctx.ranks_on_gpu(node, gpu)
    ctx.symptom(
        Symptom(
            Failure.GPU_FAULT,
            f"{amount:.0f} uncorrectable ECC error(s) on GPU {gpu} of node {node}",
            [contract.GPU_ECC_ERRORS.name],
            t,
            ranks,
            [node],
            3,
        ),
        Scope(ScopeLevel.NODE, f"GPU {gpu} of node {node}", ranks, [node], [gpu]),
    )
    ctx.candidate(
        Candidate(
            Cause.GPU_ECC_UNCORRECTABLE,
            f"Uncorrectable ECC errors on node {node} GPU {gpu}",
            0.9,
            [f"{contract.GPU_ECC_ERRORS.name}{{kind=uncorrected}} +{amount:.0f} at {utc(t)}"],
            [f"Drain node {node} and restart the job from its last checkpoint without it."],
            [
                "Run `dcgmi diag -r 3` before the node returns to service; RMA the "
                "GPU if uncorrectable errors recur."
            ],
            {"node": node, "gpu": gpu},
        )
    )


def _xid(ctx: Context, s: Series, t: float, amount: float) -> None:
    node, gpu = s.label(contract.LABEL_NODE), s.label(contract.LABEL_GPU)
    code = int(s.label(contract.LABEL_XID) or 0)
    evidence = [
        f"{contract.GPU_XID_ERRORS.name}{{node={node}, gpu={gpu}, xid={code}}} "
        f"+{amount:.0f} at {utc(t)}"
    ]
    _report_xid(ctx, node, gpu, code, t, evidence, ctx.ranks_on_gpu(node, gpu))


def _xid_from_log(ctx: Context, fields: dict[str, object], summary: str) -> None:
    """A kernel log's GPU fault: an Xid, or a failure the driver reports without one (a GPU
    fallen off the bus, RmInitAdapter failed), which drains like the Xid it amounts to."""
    code, event = fields.get("xid"), fields.get("event")
    if not isinstance(code, int) and event not in DRIVER_EVENTS:
        return
    host = str(fields.get("host") or "")
    nodes = {n.split(".")[0]: n for n in ctx.sig.nodes}
    if host and nodes and host.split(".")[0] not in nodes:
        ctx.report.notes.append(f"ignored (not a node of this job): {summary}")
        return
    node = nodes.get(host.split(".")[0], host) if host else ""
    gpu = f"PCI:{fields.get('pci', '?')}"
    ranks = ctx.sig.ranks_on(node)
    evidence = [f"kernel log: {summary}"]
    if isinstance(code, int):
        _report_xid(ctx, node, gpu, code, None, evidence, ranks)
        return
    assert isinstance(event, str)
    driver = DRIVER_EVENTS[event]
    drain = driver_event_drain(event, ctx.thresholds.xid_critical)
    info = XidInfo(driver.meaning, drain, driver.advice)
    _report_fault(ctx, node, gpu, event, info, None, evidence, ranks)


def _drain_advice(
    node: str, gpu: str, name: str, drain: str, t: float | None, ranks: list[int]
) -> str:
    commands = (
        f" (`scontrol update nodename={node} state=drain` / `kubectl cordon {node}`)"
        if node
        else ""
    )
    where = node or "the node whose kernel log reported it"
    return {
        "now": f"Drain {'node ' if commands else ''}{where} now{commands} and restart the "
        "job from its last checkpoint without it.",
        "after_job": f"Drain {where} when the current job ends and reset GPU {gpu}.",
        "no": "The GPU is likely healthy: look at what "
        + (ranks_text(ranks) if ranks else "the job")
        + (f" ran at {utc(t)}." if t is not None else " ran."),
    }.get(drain, f"Treat {where} as faulty and drain it until {name} is understood.")


def _report_xid(
    ctx: Context,
    node: str,
    gpu: str,
    code: int,
    t: float | None,
    evidence: list[str],
    ranks: list[int],
) -> None:
    info = xid_lookup(code, ctx.thresholds.xid_critical)
    _report_fault(ctx, node, gpu, code, info, t, evidence, ranks)


def _report_fault(
    ctx: Context,
    node: str,
    gpu: str,
    fault: int | str,
    info: XidInfo,
    t: float | None,
    evidence: list[str],
    ranks: list[int],
) -> None:
    """One GPU fault as a symptom and a cause: ``fault`` is the Xid, or the driver event a
    kernel log reported without one."""
    for rank in ranks:
        stopped = ctx.stopped(rank)
        if stopped is not None:
            evidence.append(f"rank {rank} (GPU {gpu}) stopped reporting at {utc(stopped)}")
    name = f"Xid {fault}" if isinstance(fault, int) else "the fault"
    drain = _drain_advice(node, gpu, name, info.drain, t, ranks)
    node = node or "unknown"
    severity = 3 if info.drain in ("now", "unknown", "after_job") else 2
    what = f"Xid {fault} ({info.meaning})" if isinstance(fault, int) else info.meaning
    ctx.symptom(
        Symptom(
            Failure.GPU_FAULT,
            f"{what} on GPU {gpu} of node {node}",
            [contract.GPU_XID_ERRORS.name if t is not None else "kernel log"],
            t,
            ranks,
            [node],
            severity,
        ),
        Scope(
            ScopeLevel.NODE,
            f"node {node}, GPU {gpu} ({ranks_text(ranks)}): a hardware fault of one GPU; "
            "the rest of the job fails only because it waits for it",
            ranks,
            [node],
            [gpu],
        ),
    )
    cause = Cause.GPU_XID if isinstance(fault, int) else Cause.GPU_DRIVER_EVENT
    title = f"Xid {fault} on node {node} GPU {gpu}: {info.meaning}"
    facts: dict[str, object] = {"node": node, "gpu": gpu, "drain": info.drain, "ranks": ranks}
    if isinstance(fault, int):
        facts["xid"] = fault
    else:
        title = f"{info.meaning} on node {node} GPU {gpu}"
        facts["event"] = fault
    ctx.candidate(
        Candidate(
            cause,
            title,
            0.95 if severity == 3 else 0.6,
            evidence,
            [drain],
            [info.advice],
            facts,
        )
    )


# --- prevention -------------------------------------------------------------------------------
@prevents(Cause.GPU_XID, Cause.GPU_DRIVER_EVENT, Cause.GPU_ECC_UNCORRECTABLE)
def _health_check(ctx: Context, c: Candidate) -> list[Setting]:
    node, gpu = str(c.facts.get("node", "")), str(c.facts.get("gpu", ""))
    return [
        elastic_minimum(ctx, [node], f"GPU {gpu} failed"),
        Setting(
            "GPU health check",
            "dcgmi diag -r 3 before a node returns to service; drain on Xid "
            f"{', '.join(map(str, ctx.thresholds.xid_critical))} or uncorrectable ECC",
            SCHEDULER,
            c.evidence[:2],
        ),
    ]
