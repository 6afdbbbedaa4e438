"""The fault matrix's report: per fault kind, detection, time to detect, root cause, recovery,
escalations and pages; false alerts per 1,000 rank-hours; the table, the plot and the last
line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.fault_matrix_plan import (
    CATALOGUE,
    HEALTHY,
    SHIPPED,
    WORLD_SIZE,
    RunResult,
    Settings,
    spec_named,
)
from benchmarks.harness.stats import percentile


@dataclass
class KindRow:
    kind: str
    runs: int
    detection: float
    p50_detect_s: float | None
    p95_detect_s: float | None
    detect_bound_s: float
    root_cause: float
    acted: int
    should_act: int
    recovery: float | None
    p50_recover_s: float | None
    p95_recover_s: float | None
    escalations: int
    pages: int
    false_alerts: int


def summarize(results: list[RunResult], settings: Settings) -> tuple[list[KindRow], dict[str, Any]]:
    rows = []
    for spec in CATALOGUE:
        mine = [r for r in results if r.plan.fault == spec.name]
        if not mine:
            continue
        detects = [r.detect_s for r in mine if r.detect_s is not None]
        acted = [r for r in mine if r.action is not None]
        # Recovery counts every run the policy should have repaired: not acting is a failure.
        should_act = mine if settings.acts_on(spec) else []
        recovered = [r for r in should_act if r.outcome == "recovered"]
        recovers = [r.recover_s for r in recovered if r.recover_s is not None]
        rows.append(
            KindRow(
                kind=spec.name,
                runs=len(mine),
                detection=sum(r.detected for r in mine) / len(mine),
                p50_detect_s=percentile(detects, 0.5),
                p95_detect_s=percentile(detects, 0.95),
                detect_bound_s=settings.detect_bound_s(spec),
                root_cause=sum(r.root_cause_right for r in mine) / len(mine),
                acted=len(acted),
                should_act=len(should_act),
                recovery=len(recovered) / len(should_act) if should_act else None,
                p50_recover_s=percentile(recovers, 0.5),
                p95_recover_s=percentile(recovers, 0.95),
                escalations=sum(r.escalations for r in mine),
                pages=sum(r.pages for r in mine),
                false_alerts=sum(len(r.false_alerts) for r in mine),
            )
        )
    faulty = [r for r in results if r.plan.fault != HEALTHY]
    healthy = [r for r in results if r.plan.fault == HEALTHY]
    healthy_hours = sum(r.trained_seconds for r in healthy) / 3600
    rank_hours = WORLD_SIZE * sum(r.trained_seconds for r in results) / 3600
    false_alerts = sum(len(r.false_alerts) for r in results)
    acting = {spec.name for spec in CATALOGUE if settings.acts_on(spec)}
    should_act = [r for r in faulty if r.plan.fault in acting]
    detects = [r.detect_s for r in faulty if r.detect_s is not None]
    totals = {
        "runs": len(results),
        "faulty": len(faulty),
        "healthy": len(healthy),
        "detection": sum(r.detected for r in faulty) / len(faulty) if faulty else None,
        "root_cause": sum(r.root_cause_right for r in faulty) / len(faulty) if faulty else None,
        "recovery": (
            sum(r.outcome == "recovered" for r in should_act) / len(should_act)
            if should_act
            else None
        ),
        "false_alerts": false_alerts,
        "false_alerts_in_healthy_runs": sum(len(r.false_alerts) for r in healthy),
        "false_alerts_per_1000_rank_hours": (
            1000 * false_alerts / rank_hours if rank_hours else None
        ),
        "rank_hours": round(rank_hours, 3),
        "healthy_hours": round(healthy_hours, 3),
        "p95_detect_s": percentile(detects, 0.95),
        "escalations": sum(r.escalations for r in results),
        "pages": sum(r.pages for r in results),
        "errors": sum(r.error is not None for r in results),
        "defaults": settings.name,
    }
    return rows, totals


def table(rows: list[KindRow], totals: dict[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.0f}%"

    def sec(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        "| fault | runs | detected | p50 / p95 detect (s) | p95 bound (s) | root cause top-1 "
        "| acted (of should) | recovered | p50 / p95 recover (s) | escalations | pages "
        "| false alerts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.kind} | {row.runs} | {pct(row.detection)} | {sec(row.p50_detect_s)} / "
            f"{sec(row.p95_detect_s)} | {row.detect_bound_s:.0f} | {pct(row.root_cause)} | "
            f"{row.acted} of {row.should_act} | {pct(row.recovery)} | {sec(row.p50_recover_s)} / "
            f"{sec(row.p95_recover_s)} | {row.escalations} | {row.pages} | {row.false_alerts} |"
        )
    rate = totals["false_alerts_per_1000_rank_hours"]
    lines += [
        "",
        f"False alerts (any alert the run's fault does not explain, every run): "
        f"{totals['false_alerts']} in {totals['rank_hours']:.2f} rank-hours"
        + ("" if rate is None else f", {rate:.0f} per 1,000 rank-hours")
        + f"; {totals['false_alerts_in_healthy_runs']} in the {totals['healthy']} healthy runs "
        f"({totals['healthy_hours']:.2f} h of training). Runs that broke: {totals['errors']}. "
        f"Settings: {totals['defaults']}.",
    ]
    if "minutes" in totals:
        low, high = totals["load_average"]
        lines[-1] += f" {totals['minutes']} min, load average {low:.1f}-{high:.1f}."
    return "\n".join(lines) + "\n"


def plot(results: list[RunResult], path: Path, settings: Settings) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = [s.name for s in CATALOGUE if any(r.plan.fault == s.name for r in results)]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for x, name in enumerate(names):
        values = [r.detect_s for r in results if r.plan.fault == name and r.detect_s is not None]
        ax.scatter([x] * len(values), values, s=18, color="tab:blue")
        spec = spec_named(name)
        if spec is not None:
            ax.hlines(settings.detect_bound_s(spec), x - 0.35, x + 0.35, color="tab:red")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("time to detect (s)")
    bound = "target" if settings.name == SHIPPED else "2x the alert's configured delay"
    ax.set_title(f"time to detect per fault kind, {settings.name} defaults (red: {bound})")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def last_line(totals: dict[str, Any]) -> str:
    def num(value: float | None) -> str:
        return "nan" if value is None else f"{value:.4f}"

    p95 = totals["p95_detect_s"]
    p95_text = "nan" if p95 is None else f"{p95:.1f}"
    return (
        f"runs={totals['runs']} detection={num(totals['detection'])} "
        f"root_cause={num(totals['root_cause'])} recovery={num(totals['recovery'])} "
        f"false_alerts={totals['false_alerts']} p95_detect_s={p95_text} "
        f"defaults={totals['defaults']}"
    )


def escalations_line(totals: dict[str, Any]) -> str:
    return f"escalations={totals['escalations']} pages={totals['pages']}"
