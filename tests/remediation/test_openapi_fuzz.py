"""schemathesis against the service's own OpenAPI document: no generated input gets a 5xx."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from tests.remediation.conftest import AUTH, TOKEN, executors_with, serve_http
from trainguard.remediation.app import create_app
from trainguard.remediation.settings import Settings


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db: Path = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    service = Settings(
        token=SecretStr(TOKEN),
        db_path=db,
        sqlite_synchronous="NORMAL",
        long_poll_max_seconds=0.05,  # generated long-polls must not stall the run
    )
    with serve_http(create_app(service, executors_with())) as url:
        yield url


def test_no_server_errors(base_url: str) -> None:
    # The operations' strategies are driven by hypothesis directly: schemathesis' pytest
    # plugin (from_fixture) does not run under pytest 9.
    api = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = []
    for result in api.get_all_operations():
        assert isinstance(result, Ok), result  # the document itself is valid OpenAPI
        operations.append(result.ok())
    assert len(operations) >= 12
    statuses: Counter[int] = Counter()
    for operation, mode in itertools.product(operations, GenerationMode):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=40,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def check(case: schemathesis.Case[Any]) -> None:
            response = case.call(base_url=base_url, headers=AUTH, timeout=10)
            statuses[response.status_code] += 1
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
            )

        try:
            check()
        except Unsatisfiable:
            # An operation without parameters or body has no invalid input to generate.
            assert mode is GenerationMode.NEGATIVE, operation.label
    # Both valid and invalid inputs reached the service.
    assert statuses[200] > 50 and statuses[422] > 50, statuses
