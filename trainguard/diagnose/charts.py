"""The report's PNG charts, drawn with matplotlib's Agg renderer (no display needed).

Each chart function returns a :class:`~trainguard.diagnose.model.Chart` holding the data it
drew (JSON-ready: times as unix seconds, missing values as ``None``), so the JSON report and
the tests can check what a picture shows. matplotlib is imported inside :func:`draw_all`, so
the rest of the diagnosis (and the remediation service, which stores Markdown and JSON only)
works without it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.diagnose.context import Context
from trainguard.diagnose.model import Chart
from trainguard.diagnose.prometheus import Series
from trainguard.diagnose.signals import increments
from trainguard.diagnose.straggler import median_breakdown, phase_breakdown

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEATMAP = "step_time_heatmap"
PHASES = "phase_breakdown"
MEMORY = "memory"
COLLECTIVE_AGE = "collective_age"


def _x(times: list[float]) -> Any:
    """Unix seconds as numpy datetimes (UTC), which matplotlib puts on a date axis."""
    import numpy as np

    return (np.asarray(times, dtype=float) * 1000).astype("datetime64[ms]")


def _xline(t: float) -> float:
    # matplotlib's date unit: days since its epoch, 1970-01-01 UTC by default.
    return t / 86400.0


def _points(series: Series | None) -> list[list[float | None]]:
    if series is None:
        return []
    return [[t, None if math.isnan(v) else v] for t, v in series.points]


def _figure(width: float = 10.0, height: float = 4.5) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _save(fig: Figure, out_dir: Path, name: str) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.savefig(path, format="png")
    return str(path)


def heatmap(d: Context, out_dir: Path) -> Chart | None:
    """Per-rank step compute time over the window (step time when compute is not exported)."""
    source, label = d.sig.compute, "step compute time (s)"
    if not source:
        source, label = d.sig.step_time, "step time (s)"
    if not source:
        return None
    import numpy as np

    ranks = sorted(source)
    times = sorted({t for s in source.values() for t, _ in s.points})
    column = {t: i for i, t in enumerate(times)}
    grid = np.full((len(ranks), len(times)), np.nan)
    for row, rank in enumerate(ranks):
        for t, v in source[rank].points:
            grid[row, column[t]] = v
    fig = _figure(10.0, max(3.0, 0.35 * len(ranks) + 1.5))
    ax = fig.add_subplot()
    x = _x(times)
    mesh = ax.pcolormesh(
        x, list(range(len(ranks))), np.ma.masked_invalid(grid), shading="nearest", cmap="magma"
    )
    ax.set_yticks(range(len(ranks)), [f"{r} ({d.sig.node_of(r)})" for r in ranks])
    ax.set_ylabel("rank (node)")
    ax.set_xlabel("time (UTC)")
    ax.set_title(f"Per-rank {label}, job {d.sig.job_id}")
    fig.colorbar(mesh, ax=ax, label=label)
    data = {
        "metric": label,
        "ranks": ranks,
        "times": times,
        "values": [[None if math.isnan(v) else float(v) for v in row] for row in grid],
    }
    return Chart(HEATMAP, f"Per-rank {label}", _save(fig, out_dir, HEATMAP), data)


def phases(d: Context, out_dir: Path) -> Chart | None:
    """Phase breakdown of the worst rank against the median of the others, over the time it
    straggled (the whole window when no rank did)."""
    sig = d.sig
    worst = d.worst_rank
    if worst is None:
        ratios = {
            r: sum(s.values()) / len(s.values()) for r, s in sig.compute.items() if s.values()
        }
        worst = max(ratios, key=lambda r: ratios[r]) if ratios else None
    if worst is None:
        return None
    others = [r.rank for r in sig.ranks if r.rank != worst]
    start, end = d.worst_window or (sig.start, sig.end)
    mine = phase_breakdown(sig, worst, start, end)
    median = median_breakdown(sig, others, start, end)
    names = [p for p in mine if p in median]
    if not names:
        return None
    fig = _figure(8.0, 4.5)
    ax = fig.add_subplot()
    idx = list(range(len(names)))
    ax.bar([i - 0.2 for i in idx], [mine[p] for p in names], 0.4, label=f"rank {worst}")
    ax.bar([i + 0.2 for i in idx], [median[p] for p in names], 0.4, label="median of others")
    ax.set_xticks(idx, names)
    ax.set_ylabel("seconds per step")
    ax.set_title(f"Phase breakdown: rank {worst} vs the median rank")
    ax.legend()
    data = {
        "worst_rank": worst,
        "window": [start, end],
        "phases": names,
        "worst": [mine[p] for p in names],
        "median": [median[p] for p in names],
    }
    return Chart(PHASES, f"Phase breakdown of rank {worst}", _save(fig, out_dir, PHASES), data)


def memory(d: Context, out_dir: Path) -> Chart | None:
    """Allocated / reserved / capacity of the OOM rank (else the fullest), OOMs marked."""
    sig = d.sig
    rank = d.oom_rank
    if rank is None:
        fullest = {r: max(s.values()) for r, s in sig.reserved.items() if s.values()}
        rank = max(fullest, key=lambda r: fullest[r]) if fullest else None
    if rank is None or rank not in sig.allocated:
        return None
    gib = float(1 << 30)
    series = {
        "allocated": sig.allocated.get(rank),
        "reserved": sig.reserved.get(rank),
        "capacity": sig.capacity.get(rank),
    }
    ooms = [t for t, _ in increments(sig.oom_events[rank])] if rank in sig.oom_events else []
    fig = _figure()
    ax = fig.add_subplot()
    for name, s in series.items():
        if s is not None:
            ax.plot(
                _x([t for t, _ in s.points]),
                [v / gib for _, v in s.points],
                label=name,
                linestyle="--" if name == "capacity" else "-",
            )
    for i, t in enumerate(ooms):
        ax.axvline(_xline(t), color="red", linewidth=2, label="OOM" if i == 0 else None)
    ax.set_ylabel("GiB")
    ax.set_xlabel("time (UTC)")
    ax.set_title(f"Memory of rank {rank} ({sig.node_of(rank)})")
    ax.legend(loc="upper left")
    data: dict[str, Any] = {
        "rank": rank,
        "series": {name: _points(s) for name, s in series.items() if s is not None},
        "oom_times": ooms,
    }
    return Chart(MEMORY, f"Memory of rank {rank}", _save(fig, out_dir, MEMORY), data)


def collective_age(d: Context, out_dir: Path) -> Chart | None:
    """Age of each rank's oldest in-flight collective, with the stall threshold."""
    sig = d.sig
    per_rank = {r: s for r, s in sig.oldest_inflight.items() if any(v > 0 for v in s.values())}
    if not per_rank:
        return None
    threshold = sig.stall_threshold.last() if sig.stall_threshold else None
    if threshold is None:
        threshold = d.thresholds.collective_stall_floor_seconds
    fig = _figure()
    ax = fig.add_subplot()
    for rank in sorted(sig.oldest_inflight):
        s = sig.oldest_inflight[rank]
        style = "-" if rank in per_rank else ":"
        ax.plot(_x([t for t, _ in s.points]), [v for _, v in s.points], style, label=f"rank {rank}")
    ax.axhline(threshold, color="red", linestyle="--", label=f"stall threshold {threshold:g} s")
    ax.set_ylabel("seconds")
    ax.set_xlabel("time (UTC)")
    ax.set_title("Age of the oldest in-flight collective per rank")
    ax.legend(loc="upper left", fontsize="small")
    data = {
        "threshold_seconds": threshold,
        "ranks": {str(r): _points(s) for r, s in sorted(sig.oldest_inflight.items())},
        "suspect_ranks": d.stall_ranks,
    }
    return Chart(
        COLLECTIVE_AGE, "Oldest in-flight collective", _save(fig, out_dir, COLLECTIVE_AGE), data
    )


def draw_all(d: Context, out_dir: Path) -> tuple[list[Chart], list[str]]:
    """Every chart the data allows; and a note per chart that had no data."""
    charts: list[Chart] = []
    notes: list[str] = []
    for name, draw in (
        (HEATMAP, heatmap),
        (PHASES, phases),
        (MEMORY, memory),
        (COLLECTIVE_AGE, collective_age),
    ):
        chart = draw(d, out_dir)
        if chart is None:
            notes.append(f"chart {name}: no data in the window")
        else:
            charts.append(chart)
    return charts, notes
