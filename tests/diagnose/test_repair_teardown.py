"""A stall that begins as the remediation service excludes a node or restarts the job is the
repair's teardown (the survivors wait in their collective until the others are gone), not a
hang: given the job's incidents, the report keeps the hang's evidence as a warning sign and
blames no rank; without them, or long before the repair, it is the hang it always was."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tests.diagnose import synthetic
from tests.diagnose.conftest import History
from trainguard.contract import Failure
from trainguard.diagnose import diagnose

INCIDENT = Path(__file__).parent / "incidents" / "recovered.json"


def repaired_at(moment: float, action: str) -> dict[str, Any]:
    incident: dict[str, Any] = json.loads(INCIDENT.read_text())["incidents"][0]
    at = datetime.fromtimestamp(moment, timezone.utc).isoformat()
    incident.update(job_id=synthetic.HANG, acted_at=at, rung_action=action)
    incident["tried"][0].update(at=at, action=action)
    return incident


def test_a_stall_right_after_an_exclusion_is_its_teardown(history: History) -> None:
    stall = history.now - 3600 + 200 * synthetic.INTERVAL
    report = diagnose(
        history.url,
        synthetic.HANG,
        until=history.now,
        thresholds=synthetic.SHIPPED,
        incidents=[repaired_at(stall - 2, "exclude_node")],
    )
    (hang,) = [s for s in report.symptoms if s.failure is Failure.HANG]
    assert hang.severity == 1 and hang.ranks == []
    assert "exclude_node took ranks away" in hang.summary


def test_a_stall_long_before_the_repair_is_still_a_hang(history: History) -> None:
    stall = history.now - 3600 + 200 * synthetic.INTERVAL
    report = diagnose(
        history.url,
        synthetic.HANG,
        until=history.now,
        thresholds=synthetic.SHIPPED,
        incidents=[repaired_at(stall + 120, "restart_from_checkpoint")],
    )
    assert report.failure is Failure.HANG and report.symptoms[0].severity == 3
    assert report.symptoms[0].ranks == [2]
