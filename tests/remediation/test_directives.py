"""Directives: queued by the service, long-polled and acknowledged by the hook's client."""

from __future__ import annotations

import socket
import threading
import time

import httpx

from tests.remediation.conftest import (
    AUTH,
    TOKEN,
    alert,
    both_backends,
    executors_with,
    payload,
    serve_http,
    wait_for,
)
from trainguard.contract import Action
from trainguard.instrumentation.directives import Directive, DirectiveClient
from trainguard.remediation.app import create_app
from trainguard.remediation.settings import Settings


def _live(settings: Settings) -> Settings:
    return settings.model_copy(update={"dry_run": False})


@both_backends
def test_client_receives_and_acks_directives(settings: Settings) -> None:
    received: list[tuple[int, Directive]] = []
    lock = threading.Lock()

    def on_directive_for(rank: int):
        def callback(directive: Directive) -> None:
            with lock:
                received.append((rank, directive))

        return callback

    with serve_http(create_app(_live(settings), executors_with())) as url:
        clients = [
            DirectiveClient(url, "job-7", rank, on_directive_for(rank), token=TOKEN, poll_seconds=2)
            for rank in (0, 1)
        ]
        for client in clients:
            client.start()
            client.start()  # idempotent
        time.sleep(0.3)  # both are now waiting in a long-poll
        sent = time.monotonic()
        httpx.post(
            f"{url}/v1/alertmanager",
            json=payload(alert("TrainingOOMRisk", job_id="job-7", rank="1")),
            headers=AUTH,
        ).raise_for_status()
        wait_for(lambda: len(received) == 2)
        # The long-poll answered as soon as the directive was queued, not at its timeout.
        assert time.monotonic() - sent < 1.5
        assert sorted(rank for rank, _ in received) == [0, 1]
        assert {d.kind for _, d in received} == {Action.CHECKPOINT_NOW}
        for client in clients:
            client.stop()
            client.stop()
            assert not client.running
        actions = httpx.get(f"{url}/v1/actions", headers=AUTH).json()["actions"]
        # On the wire an action is its value.
        directive_action = next(a for a in actions if a["action"] == Action.CHECKPOINT_NOW.value)
        assert directive_action["state"] == "succeeded"
        notes = [t["note"] for t in directive_action["transitions"] if t["state"] == "acknowledged"]
        assert sorted(notes) == ["rank 0 acknowledged: success", "rank 1 acknowledged: success"]
        # Acknowledged directives are not offered again.
        again = httpx.get(
            f"{url}/v1/directives", params={"job_id": "job-7", "rank": 0, "wait": 0}, headers=AUTH
        )
        assert again.json() == {"directives": []}


def test_failed_callback_is_acked_as_failure_and_not_rerun(settings: Settings) -> None:
    calls: list[int] = []

    def explode(directive: Directive) -> None:
        calls.append(directive.id)
        raise RuntimeError("cannot checkpoint now")

    with serve_http(create_app(_live(settings), executors_with())) as url:
        httpx.post(
            f"{url}/v1/alertmanager",
            json=payload(alert("TrainingOOM", job_id="j", rank="0")),
            headers=AUTH,
        ).raise_for_status()
        client = DirectiveClient(url, "j", 0, explode, token=TOKEN, poll_seconds=0.5)
        client.start()
        wait_for(lambda: client.handled == 1)
        time.sleep(1.2)  # more polls: the failed directive is acknowledged, not redelivered
        client.stop()
        assert len(calls) == 1
        actions = httpx.get(f"{url}/v1/actions", headers=AUTH).json()["actions"]
        split = next(a for a in actions if a["action"] == Action.SPLIT_MICRO_BATCHES.value)
        notes = [t["note"] for t in split["transitions"] if t["state"] == "acknowledged"]
        assert len(notes) == 1 and notes[0].startswith("rank 0 acknowledged: failure")
        assert "cannot checkpoint now" in notes[0]


def test_client_backs_off_and_never_raises_when_the_service_is_down() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = DirectiveClient(
        f"http://127.0.0.1:{port}", "j", 0, lambda d: None, backoff_initial=0.05, backoff_max=0.2
    )
    client.start()
    wait_for(lambda: client.errors >= 3)
    assert client.running
    client.stop()
    errors = client.errors
    time.sleep(0.3)
    assert client.errors == errors  # stopped means stopped
    assert not client.running


def test_wrong_token_is_an_error_not_an_exception(settings: Settings) -> None:
    with serve_http(create_app(settings, executors_with())) as url:
        client = DirectiveClient(url, "j", 0, lambda d: None, token="nope", backoff_initial=0.05)
        client.start()
        wait_for(lambda: client.errors >= 1)
        client.stop()


def test_from_env() -> None:
    assert DirectiveClient.from_env(lambda d: None, {}) is None
    client = DirectiveClient.from_env(
        lambda d: None,
        {"TRAINGUARD_REMEDIATION_URL": "http://x:1", "TRAINGUARD_JOB_ID": "jj", "RANK": "3"},
    )
    assert client is not None and not client.running


@both_backends
def test_ack_errors(settings: Settings) -> None:
    with serve_http(create_app(settings, executors_with())) as url:
        response = httpx.post(f"{url}/v1/directives/42/ack", json={"rank": 0}, headers=AUTH)
        assert response.status_code == 404
        response = httpx.get(
            f"{url}/v1/directives", params={"job_id": "j", "rank": -1}, headers=AUTH
        )
        assert response.status_code == 422


def test_a_directive_of_an_unknown_kind_is_acknowledged_as_failed_without_the_callback() -> None:
    calls: list[Directive] = []
    client = DirectiveClient("http://127.0.0.1:1", "j", 0, calls.append)
    outcome, detail = client._carry_out(5, {"id": 5, "kind": "reboot_the_world", "params": {}})
    assert outcome == "failure" and "reboot_the_world" in detail and calls == []
    outcome, _ = client._carry_out(6, {"id": 6, "kind": "checkpoint_now"})
    assert outcome == "success" and calls == [Directive(6, Action.CHECKPOINT_NOW, {})]
