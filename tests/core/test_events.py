"""Events carry the ECS fields of the contract and reach ordinary logging handlers."""

from __future__ import annotations

import logging

import pytest

from trainguard import contract
from trainguard.events import EVENTS_LOGGER, log_event


def test_event_fields_reach_the_log_record(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=EVENTS_LOGGER):
        log_event(
            "rank 1 ran out of memory",
            contract.EventKind.OOM,
            job_id="j1",
            rank=1,
            step=42,
            details={"tried_bytes": 1024},
        )
    (record,) = caplog.records
    assert record.getMessage() == "rank 1 ran out of memory"
    assert getattr(record, contract.FIELD_EVENT_ACTION) == "oom"
    assert getattr(record, contract.FIELD_JOB_ID) == "j1"
    assert getattr(record, contract.FIELD_RANK) == "1"
    assert getattr(record, contract.FIELD_STEP) == "42"
    assert getattr(record, contract.FIELD_DETAILS) == {"tried_bytes": 1024}
    assert not hasattr(record, contract.FIELD_NODE)
