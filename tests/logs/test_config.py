"""configure_logging: ECS JSON with our labels, the step and the active span's ids."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from trainguard import contract, correlation
from trainguard.events import log_event
from trainguard.logs import configure_logging, data_stream_name


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger(f"trainguard.test.{uuid.uuid4().hex}")
    log.propagate = False
    yield log
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_event_becomes_ecs_json_with_labels_and_step(tmp_path: Path, logger) -> None:
    log_file = tmp_path / "rank3.ndjson"
    setup = configure_logging(
        service_name="trainguard-rank",
        job_id="job-42",
        rank=3,
        node="node-7",
        file=log_file,
        logger=logger,
    )
    setup.set_step(120)
    log_event(
        "rank 3 ran out of memory",
        contract.EventKind.OOM,
        logger=logger,
        outcome=contract.EventOutcome.FAILURE,
        details={"tried_bytes": 2 << 30},
    )
    setup.set_step(None)
    logger.info("plain message %d", 7)
    setup.close()

    event, plain = read(log_file)
    assert event["message"] == "rank 3 ran out of memory"
    assert event["log.level"] == "warning"
    assert "@timestamp" in event and event["ecs.version"]
    assert event["event"] == {
        "kind": "event",
        "category": "process",
        "action": "oom",
        "outcome": "failure",
        "dataset": "trainguard.rank",
    }
    assert event["labels"] == {
        "job_id": "job-42",
        "rank": "3",
        "node": "node-7",
        "step": "120",
        "failure": contract.Failure.OOM.value,
    }
    assert event["service"]["name"] == "trainguard-rank"
    assert event["host"]["name"]
    assert event["data_stream"] == {
        "type": "logs",
        "dataset": "trainguard.rank",
        "namespace": "default",
    }
    assert event["trainguard"] == {"tried_bytes": 2 << 30}
    assert "original" not in event["log"]
    assert plain["message"] == "plain message 7"
    assert "step" not in plain["labels"]
    assert "trace" not in plain


def test_event_fields_win_over_the_process_context(tmp_path: Path, logger) -> None:
    log_file = tmp_path / "svc.ndjson"
    setup = configure_logging(
        service_name="svc", job_id="job-a", rank=0, file=log_file, logger=logger
    )
    setup.set_step(5)
    log_event(
        "decision",
        contract.EventKind.DECISION,
        logger=logger,
        job_id="job-b",
        rank=9,
        step=77,
        trace_id="0af7651916cd43dd8448eb211c80319c",
    )
    setup.close()
    (record,) = read(log_file)
    assert record["labels"]["job_id"] == "job-b"
    assert record["labels"]["rank"] == "9"
    assert record["labels"]["step"] == "77"
    assert record["trace"]["id"] == "0af7651916cd43dd8448eb211c80319c"


def test_trace_and_span_ids_of_the_active_span(tmp_path: Path, logger) -> None:
    log_file = tmp_path / "traced.ndjson"
    setup = configure_logging(service_name="svc", file=log_file, logger=logger)
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("trainguard.rank_step") as span:
        logger.info("inside")
        context = span.get_span_context()
    logger.info("outside")
    setup.close()
    inside, outside = read(log_file)
    assert inside["trace"]["id"] == trace.format_trace_id(context.trace_id)
    assert inside["span"]["id"] == trace.format_span_id(context.span_id)
    assert "trace" not in outside and "span" not in outside


def test_file_rotates_at_max_bytes_and_keeps_backups(tmp_path: Path, logger) -> None:
    log_file = tmp_path / "rot.ndjson"
    setup = configure_logging(
        service_name="svc", file=log_file, max_bytes=2000, backup_count=2, logger=logger
    )
    for i in range(200):
        logger.info("line %d with some padding to fill the file", i)
    setup.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["rot.ndjson", "rot.ndjson.1", "rot.ndjson.2"]
    for path in tmp_path.iterdir():
        assert path.stat().st_size <= 2000
        assert all("message" in record for record in read(path))
    assert read(log_file)[-1]["message"].startswith("line 199 ")


def test_reconfiguring_replaces_handlers_and_env_names_the_file(
    tmp_path: Path, logger, monkeypatch
) -> None:
    log_file = tmp_path / "env.ndjson"
    monkeypatch.setenv(contract.ENV_LOG_FILE, str(log_file))
    monkeypatch.setenv(contract.ENV_JOB_ID, "from-env")
    configure_logging(service_name="svc", logger=logger)
    setup = configure_logging(service_name="svc", logger=logger)
    logger.info("once")
    setup.close()
    logger.info("after close")
    # one line: the second call replaced the first call's handler, and close removed it
    (record,) = read(log_file)
    assert record["labels"]["job_id"] == "from-env"


def test_stdout_when_no_file(capsys, logger, monkeypatch) -> None:
    monkeypatch.delenv(contract.ENV_LOG_FILE, raising=False)
    setup = configure_logging(service_name="svc", rank=1, logger=logger, dataset="service")
    logger.warning("to stdout")
    setup.close()
    record = json.loads(capsys.readouterr().out)
    assert record["message"] == "to stdout"
    assert record["data_stream"]["dataset"] == "trainguard.service"


def test_data_stream_names_follow_elasticsearch_rules() -> None:
    assert data_stream_name("rank", "prod") == "logs-trainguard.rank-prod"
    for dataset, namespace in (("Rank", "default"), ("a-b", "default"), ("rank", "x y"), ("", "d")):
        with pytest.raises(ValueError):
            data_stream_name(dataset, namespace)


def test_without_a_current_span_the_published_step_ids_are_used(tmp_path: Path, logger) -> None:
    log_file = tmp_path / "step.ndjson"
    setup = configure_logging(service_name="svc", file=log_file, logger=logger)
    step_ids = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")

    def provider() -> tuple[str, str]:
        return step_ids

    correlation.publish(provider)
    try:
        logger.info("plain line")
        log_event("oom", contract.EventKind.OOM, logger=logger, trace_id=step_ids[0])
        log_event("other", contract.EventKind.DECISION, logger=logger, trace_id="ab" * 16)
    finally:
        correlation.withdraw(provider)
    logger.info("nothing published")
    setup.close()
    plain, same_trace, other_trace, unpublished = read(log_file)
    assert (plain["trace"]["id"], plain["span"]["id"]) == step_ids
    assert (same_trace["trace"]["id"], same_trace["span"]["id"]) == step_ids
    assert other_trace["trace"]["id"] == "ab" * 16 and "span" not in other_trace
    assert "trace" not in unpublished and "span" not in unpublished
