"""The training hook takes directives from the real remediation service."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import torch
from torch import nn

import trainguard
from tests.remediation.conftest import (
    AUTH,
    TOKEN,
    alert,
    executors_with,
    payload,
    serve_http,
    wait_for,
)
from trainguard import contract
from trainguard.instrumentation.directives import Directive
from trainguard.remediation.app import create_app
from trainguard.remediation.settings import Settings


def _actions(url: str) -> dict[str, dict[str, object]]:
    listed = httpx.get(f"{url}/v1/actions", headers=AUTH).json()["actions"]
    return {a["action"]: a for a in listed}


def _notes(url: str, action: str) -> str:
    transitions = _actions(url)[action]["transitions"]
    assert isinstance(transitions, list)
    return " ".join(str(t["note"]) for t in transitions)


def test_hook_carries_out_and_hands_over_directives(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = settings.model_copy(update={"dry_run": False})
    received: list[Directive] = []
    with serve_http(create_app(live, executors_with())) as url:
        monkeypatch.setenv(contract.ENV_REMEDIATION_TOKEN, TOKEN)
        model = nn.Linear(4, 1)
        handle = trainguard.instrument(
            model,
            job_id="job-d",
            metrics_port=-1,
            dump_dir=tmp_path,
            remediation_url=url,
            on_directive=received.append,
        )
        time.sleep(0.3)
        for name, fingerprint in (
            ("TrainingOOMRisk", "a"),
            ("TrainingOOM", "b"),
            ("TrainingCollectiveStalled", "c"),
        ):
            httpx.post(
                f"{url}/v1/alertmanager",
                json=payload(alert(name, fingerprint=fingerprint, job_id="job-d", rank="0")),
                headers=AUTH,
            ).raise_for_status()
        wait_for(lambda: handle.micro_batches == 2 and len(received) == 1)
        assert received[0].kind is contract.Action.CHECKPOINT_NOW
        wait_for(lambda: bool(list(tmp_path.glob("job-d/directive-*/stacks_rank0.txt"))))
        wait_for(
            lambda: (
                {_actions(url)[k]["state"] for k in ("checkpoint_now", "split_micro_batches")}
                == {"succeeded"}
            )
        )
        handle.uninstrument()


def test_directive_without_a_handler_is_acknowledged_as_failed(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = settings.model_copy(update={"dry_run": False})
    with serve_http(create_app(live, executors_with())) as url:
        monkeypatch.setenv(contract.ENV_REMEDIATION_TOKEN, TOKEN)
        model = nn.Linear(4, 1)
        handle = trainguard.instrument(
            model, job_id="job-e", metrics_port=-1, dump_dir=tmp_path, remediation_url=url
        )
        time.sleep(0.3)
        httpx.post(
            f"{url}/v1/alertmanager",
            json=payload(alert("TrainingOOMRisk", job_id="job-e", rank="0")),
            headers=AUTH,
        ).raise_for_status()
        wait_for(lambda: "acknowledged: failure" in _notes(url, "checkpoint_now"))
        assert "no handler for directive 'checkpoint_now'" in _notes(url, "checkpoint_now")
        model(torch.ones(1, 4))
        handle.uninstrument()
