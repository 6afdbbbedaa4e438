"""The direct shipper against a fake Elasticsearch that keeps to the documented _bulk contract."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from elasticsearch import Elasticsearch

from tests.logs.fake_es import FakeElasticsearch
from trainguard import contract
from trainguard.events import log_event
from trainguard.logs.install import DATA_VIEW_ID, ElasticsearchInstaller
from trainguard.logs.shipper import DEAD_LETTER_FILE, ElasticsearchShipper, backoff_delay
from trainguard.logs.spool import CURSOR_FILE

STREAM = "logs-trainguard.rank-default"
DRAIN = 15.0


@pytest.fixture
def fake() -> Iterator[FakeElasticsearch]:
    server = FakeElasticsearch().start()
    yield server
    server.stop()


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger(f"trainguard.test.{uuid.uuid4().hex}")
    log.propagate = False
    log.setLevel(logging.INFO)
    yield log
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()


ShipperFactory = Callable[..., ElasticsearchShipper]


@pytest.fixture
def make_shipper(
    fake: FakeElasticsearch, tmp_path: Path, logger: logging.Logger
) -> Iterator[ShipperFactory]:
    made: list[ElasticsearchShipper] = []

    def make(**options: Any) -> ElasticsearchShipper:
        client = Elasticsearch(fake.url, max_retries=0, request_timeout=5)
        settings: dict[str, Any] = {
            "flush_interval": 0.02,
            "initial_backoff": 0.01,
            "max_backoff": 0.05,
            "close_timeout": 2.0,
            "batch_size": 25,
        }
        settings.update(options)
        spool = settings.pop("spool_dir", tmp_path / "spool")
        shipper = ElasticsearchShipper(client, spool, **settings)
        logger.addHandler(shipper)
        made.append(shipper)
        return shipper

    yield make
    for shipper in made:
        logger.removeHandler(shipper)
        shipper.close()


def messages(fake: FakeElasticsearch) -> list[str]:
    return [doc["message"] for doc in fake.docs(STREAM)]


def bulk_requests(fake: FakeElasticsearch) -> int:
    return fake.count("PUT", "/_bulk") + fake.count("POST", "/_bulk")


def wait_until(condition: Callable[[], bool], timeout: float = DRAIN) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_events_reach_the_data_stream_in_order_as_ecs(fake, make_shipper, logger) -> None:
    installer = ElasticsearchInstaller(Elasticsearch(fake.url, max_retries=0), kibana_url=fake.url)
    shipper = make_shipper(installer=installer)
    for i in range(60):
        log_event(
            f"event {i}",
            contract.EventKind.STRAGGLER,
            logger=logger,
            job_id="job-1",
            rank=i % 4,
            step=i,
        )
    assert shipper.drain(DRAIN)
    docs = fake.docs(STREAM)
    assert [d["message"] for d in docs] == [f"event {i}" for i in range(60)]
    assert docs[5]["event"]["action"] == "straggler"
    assert docs[5]["labels"] == {
        "job_id": "job-1",
        "rank": "1",
        "step": "5",
        "failure": contract.Failure.STRAGGLER.value,
    }
    assert shipper.stats.shipped == shipper.stats.accepted == 60
    # batches of at most batch_size, sent as create operations with stable ids
    assert max(fake.state.bulk_sizes) <= 25
    assert "logs-trainguard" in fake.state.policies
    assert "logs-trainguard" in fake.state.templates
    assert "trainguard-logs" in fake.state.data_views


def test_outage_spools_to_disk_and_resumes_in_order(fake, make_shipper, logger) -> None:
    fake.stop()
    shipper = make_shipper()
    for i in range(50):
        logger.info("during outage %d", i)
    time.sleep(0.3)
    assert shipper.stats.accepted == 50
    assert shipper.pending_bytes > 0
    assert shipper.stats.shipped == 0
    assert shipper.stats.retries > 0
    fake.start()  # same port
    for i in range(5):
        logger.info("after outage %d", i)
    assert shipper.drain(DRAIN)
    expected = [f"during outage {i}" for i in range(50)] + [f"after outage {i}" for i in range(5)]
    assert messages(fake) == expected


def test_429_5xx_and_dropped_connections_are_retried_without_loss(
    fake, make_shipper, logger
) -> None:
    fake.state.script.extend(
        [
            ("status", 429),
            ("status", 503),
            "drop",
            ("items", {0: 429, 7: 503}),
            ("status", 500),
        ]
    )
    shipper = make_shipper()
    for i in range(25):
        logger.info("msg %d", i)
    assert shipper.drain(DRAIN)
    got = messages(fake)
    assert sorted(got, key=lambda m: int(m.split()[1])) == [f"msg {i}" for i in range(25)]
    assert len(got) == len(set(got)) == 25
    assert shipper.stats.shipped == 25
    assert shipper.stats.retries >= 5
    assert shipper.stats.rejected == 0
    assert shipper.stats.request_refusals == 0  # 429/5xx are transient, not refusals


def test_partial_failure_dead_letters_what_elasticsearch_refuses(
    fake, make_shipper, logger, tmp_path
) -> None:
    fake.state.reject = lambda doc: 400 if "poison" in doc["message"] else None
    shipper = make_shipper()
    logger.info("good 1")
    logger.info("poison pill")
    logger.info("good 2")
    assert shipper.drain(DRAIN)
    assert messages(fake) == ["good 1", "good 2"]
    assert shipper.stats.rejected == 1
    (dead,) = [json.loads(line) for line in (tmp_path / "spool" / DEAD_LETTER_FILE).open()]
    assert dead["status"] == 400
    assert dead["error"]["type"] == "mapper_parsing_exception"
    assert json.loads(dead["event"])["message"] == "poison pill"


def test_restart_delivers_what_the_previous_process_accepted(
    fake, make_shipper, logger, tmp_path
) -> None:
    fake.stop()
    first = make_shipper(close_timeout=0.2)
    for i in range(30):
        logger.info("before restart %d", i)
    logger.removeHandler(first)
    first.close()
    assert first.stats.accepted == 30 and first.stats.shipped == 0

    fake.start()
    second = make_shipper()
    logger.info("after restart")
    assert second.drain(DRAIN)
    assert messages(fake) == [f"before restart {i}" for i in range(30)] + ["after restart"]


def test_resend_after_a_lost_cursor_is_not_duplicated(fake, make_shipper, logger, tmp_path) -> None:
    first = make_shipper()
    for i in range(20):
        logger.info("once %d", i)
    assert first.drain(DRAIN)
    logger.removeHandler(first)
    first.close()
    # A crash between Elasticsearch's answer and the cursor write: the cursor is lost.
    (tmp_path / "spool" / CURSOR_FILE).unlink()
    second = make_shipper()
    assert second.drain(DRAIN)
    assert second.stats.duplicates == 20
    assert messages(fake) == [f"once {i}" for i in range(20)]


def test_disk_budget_refuses_and_counts_then_delivers_what_it_accepted(
    fake, make_shipper, logger, tmp_path, capsys
) -> None:
    fake.stop()
    shipper = make_shipper(max_spool_bytes=8192, segment_bytes=2048)
    for i in range(100):
        logger.info("bounded %d", i)
    stats = shipper.stats
    assert stats.refused > 0
    assert stats.accepted + stats.refused == 100
    on_disk = sum(p.stat().st_size for p in (tmp_path / "spool").glob("segment-*"))
    assert on_disk <= 8192
    assert "is full" in capsys.readouterr().err
    fake.start()
    assert shipper.drain(DRAIN)
    assert messages(fake) == [f"bounded {i}" for i in range(stats.accepted)]


def test_the_clients_own_logging_is_not_shipped(fake, make_shipper, logger) -> None:
    shipper = make_shipper()
    transport_logger = logging.getLogger("elastic_transport.transport")
    previous = transport_logger.level
    transport_logger.setLevel(logging.DEBUG)
    transport_logger.addHandler(shipper)
    try:
        logger.info("one")
        assert shipper.drain(DRAIN)
        logger.info("two")
        assert shipper.drain(DRAIN)
    finally:
        transport_logger.removeHandler(shipper)
        transport_logger.setLevel(previous)
    assert messages(fake) == ["one", "two"]


def test_unreachable_kibana_does_not_hold_up_shipping_and_the_data_view_follows(
    fake, make_shipper, logger, capsys
) -> None:
    kibana = FakeElasticsearch().start()
    kibana.stop()
    installer = ElasticsearchInstaller(
        Elasticsearch(fake.url, max_retries=0), kibana_url=kibana.url
    )
    shipper = make_shipper(installer=installer)
    try:
        for i in range(10):
            logger.info("kibana down %d", i)
        assert shipper.drain(DRAIN)
        assert messages(fake) == [f"kibana down {i}" for i in range(10)]
        assert shipper.stats.shipped == 10
        # What indexing needs was installed first, in Elasticsearch.
        assert "logs-trainguard" in fake.state.policies
        assert "logs-trainguard" in fake.state.templates
        assert wait_until(lambda: shipper.stats.data_view_failures >= 2)
        assert not shipper.stats.data_view_installed

        kibana.start()  # same port
        assert wait_until(lambda: DATA_VIEW_ID in kibana.state.data_views)
        assert wait_until(lambda: shipper.stats.data_view_installed)
    finally:
        kibana.stop()
    assert capsys.readouterr().err.count("cannot install the Kibana data view") == 1


def test_a_request_too_large_is_split_and_a_lone_oversized_event_is_dead_lettered(
    fake, make_shipper, logger, tmp_path
) -> None:
    fake.state.max_bulk_bytes = 4096
    shipper = make_shipper()
    expected = [f"small {i}" for i in range(20)]
    for message in expected[:10]:
        logger.info(message)
    logger.info("huge %s", "x" * 8000)
    for message in expected[10:]:
        logger.info(message)
    assert shipper.drain(DRAIN)
    assert messages(fake) == expected
    assert shipper.stats.splits > 0
    assert shipper.stats.shipped == 20
    assert shipper.stats.rejected == 1
    (dead,) = [json.loads(line) for line in (tmp_path / "spool" / DEAD_LETTER_FILE).open()]
    assert dead["status"] == 413
    assert json.loads(dead["event"])["message"].startswith("huge xxx")


def test_a_refused_request_keeps_the_events_spooled_reports_once_and_backs_off(
    fake, make_shipper, logger, tmp_path, capsys
) -> None:
    fake.state.script.extend([("status", 401)] * 2 + [("status", 403)] * 1000)
    shipper = make_shipper(max_backoff=0.1)
    for i in range(10):
        logger.info("refused %d", i)
    time.sleep(0.8)
    assert shipper.stats.shipped == 0
    assert shipper.pending_bytes > 0
    # Capped backoff, not a hot loop: about 0.1 s apart once the cap is reached.
    assert 3 <= bulk_requests(fake) <= 20
    # Every request the server refused is counted: the two agree while the shipper backs off
    # (a request the server has answered may not have reached the shipper's count yet).
    assert wait_until(lambda: shipper.stats.request_refusals == bulk_requests(fake), 5.0)
    err = capsys.readouterr().err
    assert err.count("Elasticsearch refused the bulk request") == 2  # once per status
    assert "401" in err and "403" in err

    with fake.state.lock:  # the key is fixed
        fake.state.script.clear()
    assert shipper.drain(DRAIN)
    assert messages(fake) == [f"refused {i}" for i in range(10)]
    assert shipper.stats.rejected == 0
    assert not (tmp_path / "spool" / DEAD_LETTER_FILE).exists()


def test_backoff_stays_capped_after_a_very_long_outage() -> None:
    assert backoff_delay(0, 0.5, 60.0) == 0.5
    assert backoff_delay(3, 0.5, 60.0) == 4.0
    # A day of retries at the cap: 2**attempt as a float would overflow.
    assert backoff_delay(5000, 0.5, 60.0) == 60.0
