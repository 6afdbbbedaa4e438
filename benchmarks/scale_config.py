"""What the scale benchmark runs Prometheus with: its settings (sizes, intervals, the faults'
factors and durations), the shipped scrape configuration made the fleet's, and the shipped rules
with their ``for`` durations capped for a run that must end."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness.processes import Children, RunError, free_port, wait_for
from benchmarks.harness.prometheus import Api
from trainguard import contract
from trainguard.thresholds import duration_seconds

ROOT = Path(__file__).resolve().parent.parent


SHIPPED_CONFIG = ROOT / "deploy" / "prometheus.yml"


SELF_JOB = "prometheus"


@dataclass(frozen=True)
class Settings:
    scrape_interval: str | None
    eval_interval: str | None
    for_cap: str | None
    warmup_s: float
    alert_margin_s: float
    settle_s: float
    step_seconds: float
    slow_factor: float
    max_rss_bytes: float
    workdir: Path | None
    keep: bool
    # time.monotonic() past which every run stops (--time-budget): the benchmark is bounded.
    ends_at: float
    # The rule files every size's Prometheus loads, written once: Prometheus places each group
    # in its interval by a hash of the group's name and file, so the same files give every run
    # the same offsets between its groups (a chain of groups lags the same at every size).
    rule_files: tuple[Path, ...] = ()
    alert_for_s: tuple[tuple[str, float], ...] = ()
    # The fleet's healthy noise (benchmarks.fleet --noise), or None for its phase jitter.
    noise: str | None = None


def start_watched_prometheus(
    children: Children,
    work: Path,
    targets: Path,
    scrape_interval: str | None,
    eval_interval: str | None,
) -> tuple[subprocess.Popen[bytes], str]:
    """The Debian ``prometheus`` on a fresh TSDB in ``work``: the shipped configuration and
    rules, every ``for`` as shipped, its ranks' scrape job reading ``targets`` (the intervals
    overridden where given). Returns the process and its address."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RunError("prometheus is not installed (Debian: apt-get install prometheus)")
    rules, _ = write_rules(work, for_cap=None)
    address = f"127.0.0.1:{free_port()}"
    config = prometheus_config(scrape_interval, eval_interval, targets, rules, address)
    (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    proc = children.start(
        [binary, f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address={address}"],
        work / "prometheus.log",
    )  # fmt: skip
    return proc, address


def wait_all_up(api: Api, ranks: int, timeout: float, *alive: subprocess.Popen[bytes]) -> None:
    """Until every one of ``ranks`` targets of the ranks' scrape job is up."""
    up = f'count(up{{job="{contract.SCRAPE_JOB_RANKS}"}} == 1)'
    wait_for(
        f"all {ranks} targets up", lambda: (api.scalar(up) or 0) >= ranks or None, timeout, *alive
    )


def shipped_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(SHIPPED_CONFIG.read_text())
    return config


def eval_interval_s(settings: Settings) -> float:
    return duration_seconds(
        settings.eval_interval or shipped_config()["global"]["evaluation_interval"]
    )


def write_rules(folder: Path, for_cap: str | None) -> tuple[list[Path], dict[str, float]]:
    """The shipped rule files, every alert's ``for`` capped at ``for_cap``; returns the files
    and each alert's ``for`` in seconds as loaded (the longest where an alert has several)."""
    files: list[Path] = []
    fors: dict[str, float] = {}
    cap = None if for_cap is None else duration_seconds(for_cap)
    for i, name in enumerate(shipped_config().get("rule_files", [])):
        document = yaml.safe_load((SHIPPED_CONFIG.parent / name).resolve().read_text())
        for group in document["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                seconds = duration_seconds(rule["for"]) if "for" in rule else 0.0
                if cap is not None and seconds > cap:
                    rule["for"], seconds = for_cap, cap
                fors[rule["alert"]] = max(seconds, fors.get(rule["alert"], 0.0))
        path = folder / f"rules-{i}.yml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        files.append(path)
    for alert in (STRAGGLER, STALL):
        if alert not in fors:
            raise RunError(f"the shipped rules have no alert {alert}")
    return files, fors


def prometheus_config(
    scrape_interval: str | None,
    eval_interval: str | None,
    targets: Path,
    rules: list[Path],
    address: str,
) -> dict[str, Any]:
    """The shipped configuration for this run: its intervals, its ranks' scrape job reading
    ``targets``, a self-scrape job and ``rules``; no exporters, no Alertmanager."""
    shipped = shipped_config()
    global_ = dict(shipped["global"])
    if scrape_interval:
        global_["scrape_interval"] = scrape_interval
    if eval_interval:
        global_["evaluation_interval"] = eval_interval
    ranks = next(j for j in shipped["scrape_configs"] if j["job_name"] == contract.SCRAPE_JOB_RANKS)
    ranks = {k: v for k, v in ranks.items() if not k.endswith("_sd_configs")}
    ranks["file_sd_configs"] = [{"files": [str(targets)]}]
    if scrape_interval:
        ranks["scrape_interval"] = scrape_interval
    return {
        "global": global_,
        "rule_files": [str(path) for path in rules],
        **({"storage": shipped["storage"]} if "storage" in shipped else {}),
        "scrape_configs": [
            ranks,
            {"job_name": SELF_JOB, "static_configs": [{"targets": [address]}]},
        ],
    }


STRAGGLER = contract.Alert.TRAINING_STRAGGLER.value


STALL = contract.Alert.TRAINING_COLLECTIVE_STALLED.value
