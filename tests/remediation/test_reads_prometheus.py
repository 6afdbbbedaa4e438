"""The verifier's event count on a real Prometheus, at the boundary a repair draws.

A rank's last OOM happens just before its repair is carried out, but the scrape that counts it
comes just after. That event is the one the alert fired for, not a new one: counted as new, it
keeps a repair that worked from ever being judged recovered, and the ladder climbs. The history
is backfilled with ``promtool tsdb create-blocks-from openmetrics`` at a 1 s scrape, so every
sample's time is known exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.prometheus_process import backfill, prometheus_process
from trainguard import contract
from trainguard.remediation.prometheus import PrometheusQuery, Reads

OOM_EVENTS = contract.OOM_EVENTS.name
SCRAPES = 90
# The job whose last OOM (its third) was scraped 0.6 s after the repair at START + 30.4.
BOUNDARY = "boundary"
# The job that runs out of memory again 10 s after that repair.
AGAIN = "again"
REPAIRED = 30.4


def _series(job_id: str, count_at: dict[int, int], start: int) -> list[str]:
    value = 0
    lines = []
    for second in range(SCRAPES):
        value = count_at.get(second, value)
        labels = f'{contract.LABEL_JOB_ID}="{job_id}",{contract.LABEL_RANK}="0"'
        lines.append(f"{OOM_EVENTS}{{{labels}}} {value} {start + second}")
    return lines


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Reads, int]]:
    root = tmp_path_factory.mktemp("reads")
    start = int(time.time()) - 3600
    name = OOM_EVENTS.removesuffix("_total")
    lines = [f"# TYPE {name} counter"]
    lines += _series(BOUNDARY, {10: 1, 20: 2, 31: 3}, start)
    lines += _series(AGAIN, {10: 1, 20: 2, 31: 3, 41: 4}, start)
    source = root / "history.om"
    source.write_text("\n".join(lines) + "\n# EOF\n")
    backfill(source, root / "prometheus-data")
    config = root / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n")
    with prometheus_process(config, root) as prometheus:
        query = PrometheusQuery(prometheus.url)
        try:
            yield Reads(query), start
        finally:
            query.close()


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.75, 0.95])
def test_the_event_scraped_after_the_repair_is_not_a_new_one(
    history: tuple[Reads, int], fraction: float
) -> None:
    """Whatever the fraction of a second between the repair and the verifier's turn."""
    reads, start = history
    repaired = start + REPAIRED
    at = start + 60 + fraction
    assert reads.increase(OOM_EVENTS, {contract.LABEL_JOB_ID: BOUNDARY}, repaired, at) == 0


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.75, 0.95])
def test_an_event_after_the_repair_is_counted(history: tuple[Reads, int], fraction: float) -> None:
    reads, start = history
    repaired = start + REPAIRED
    at = start + 60 + fraction
    assert reads.increase(OOM_EVENTS, {contract.LABEL_JOB_ID: AGAIN}, repaired, at) >= 0.5
