"""What the verifier reads from Prometheus: an instant query (:class:`Query`, a protocol a test
replaces) and the questions it asks of a job, a node and an alert (:class:`Reads`).

Each question is one instant PromQL query; label values are quoted as PromQL strings
(:func:`selector`), so a job id or a node name cannot change what a query means.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import httpx

from trainguard import contract
from trainguard.remediation.settings import Settings

_QUERY_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Sample:
    """One series of an instant query's answer."""

    labels: Mapping[str, str]
    value: float


class QueryError(RuntimeError):
    """Prometheus could not answer the query."""


class Query(Protocol):
    """An instant PromQL query evaluated at ``at`` (a ``time.time()`` instant)."""

    def __call__(self, expr: str, at: float) -> list[Sample]: ...


class PrometheusQuery:
    """:class:`Query` against Prometheus' HTTP API (``/api/v1/query``)."""

    def __init__(self, url: str, timeout: float = _QUERY_TIMEOUT_SECONDS) -> None:
        self._client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)

    def __call__(self, expr: str, at: float) -> list[Sample]:
        try:
            response = self._client.get(
                "/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}
            )
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise QueryError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200 or body.get("status") != "success":
            raise QueryError(f"HTTP {response.status_code}: {body.get('error', '')}")
        data = body["data"]
        if data["resultType"] == "vector":
            return [Sample(s["metric"], float(s["value"][1])) for s in data["result"]]
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        raise QueryError(f"unexpected result type {data['resultType']!r} for {expr}")

    def close(self) -> None:
        self._client.close()


QueryFactory = Callable[[Settings], Query | None]


def prometheus_query(settings: Settings) -> Query | None:
    """The verifier's Prometheus, or None when ``prometheus_url`` is unset."""
    return None if not settings.prometheus_url else PrometheusQuery(settings.prometheus_url)


def selector(name: str, **labels: str) -> str:
    """``name{label="value",...}`` with the values quoted as PromQL strings."""
    matchers = ",".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in labels.items())
    return f"{name}{{{matchers}}}"


def _seconds(span: float) -> str:
    """A range of at least ``span`` seconds, as PromQL writes it."""
    return f"{max(1, math.ceil(span))}s"


def _after(span: float) -> str:
    """The range of the last ``span`` seconds, to the millisecond, as PromQL writes it: the
    samples after an instant, none from before it."""
    return f"{max(1, math.floor(span * 1000))}ms"


class Reads:
    """The verifier's questions to Prometheus about a job, its ranks and an alert."""

    def __init__(self, query: Query) -> None:
        self.query = query

    def _one(self, expr: str, at: float) -> float | None:
        found = self.query(expr, at)
        return found[0].value if found else None

    @staticmethod
    def _ranks(job_id: str, node: str | None = None) -> str:
        labels = {"job": contract.SCRAPE_JOB_RANKS, contract.LABEL_JOB_ID: job_id}
        if node is not None:
            labels[contract.LABEL_NODE] = node
        return selector("up", **labels)

    def step(self, job_id: str, at: float) -> int | None:
        """The job's highest ``trainguard_step`` at ``at``."""
        job = {contract.LABEL_JOB_ID: job_id}
        value = self._one(f"max({selector(contract.TRAINING_STEP.name, **job)})", at)
        return None if value is None else int(value)

    def last_step(self, job_id: str, since: float, at: float) -> int | None:
        """The highest step the job reported from ``since`` to ``at``, reporting or not now."""
        job = selector(contract.TRAINING_STEP.name, **{contract.LABEL_JOB_ID: job_id})
        value = self._one(f"max(last_over_time({job}[{_seconds(at - since)}]))", at)
        return None if value is None else int(value)

    def ranks_up(self, job_id: str, at: float, node: str | None = None) -> int:
        """How many of the job's ranks (on ``node``) were up at ``at``."""
        return int(self._one(f"count({self._ranks(job_id, node)} == 1)", at) or 0)

    def listed(self, job_id: str, at: float) -> bool:
        """Whether Prometheus still scrapes any target of the job's ranks, up or down."""
        return bool(self.query(f"count({self._ranks(job_id)})", at))

    def down_at_last_scrape(self, job_id: str, since: float, at: float) -> set[str]:
        """The nodes of the job's ranks whose last scrape from ``since`` to ``at`` failed."""
        last = f"last_over_time({self._ranks(job_id)}[{_seconds(at - since)}])"
        found = self.query(f"count by ({contract.LABEL_NODE}) ({last} == 0)", at)
        return {s.labels.get(contract.LABEL_NODE, "") for s in found}

    def firing(self, alertname: str, labels: Mapping[str, str], at: float) -> bool:
        """Whether Prometheus has the alert firing for its job (else its node) at ``at``."""
        job_id = labels.get(contract.LABEL_JOB_ID)
        scope = (
            {contract.LABEL_JOB_ID: job_id}
            if job_id
            else {contract.LABEL_NODE: labels.get(contract.LABEL_NODE, "")}
        )
        expr = selector("ALERTS", alertname=alertname, alertstate="firing", **scope)
        return bool(self.query(expr, at))

    def pending_since(self, alertname: str, identity: Mapping[str, str], at: float) -> float | None:
        """When the alert (these labels of it) went pending, as Prometheus had it at ``at``."""
        found = self.query(selector("ALERTS_FOR_STATE", alertname=alertname, **identity), at)
        return min((s.value for s in found), default=None)

    def increase(self, counter: str, scope: Mapping[str, str], since: float, at: float) -> float:
        """How much ``counter`` rose over ``scope`` between the samples scraped after ``since``
        and ``at``: increase() counts across a rank's restart (a counter reset) and not a series
        that appeared at 0. An event counted by the first scrape after ``since`` happened
        before it (the OOM a repair ends, scraped just after the repair) and is not counted;
        a range rounded up to whole seconds would reach a sample from before ``since`` and
        count it."""
        expr = f"sum(increase({selector(counter, **scope)}[{_after(at - since)}]))"
        return self._one(expr, at) or 0.0

    def highest(self, gauge: str, scope: Mapping[str, str], at: float) -> float | None:
        """The highest value ``gauge`` had over ``scope`` at ``at``."""
        return self._one(f"max({selector(gauge, **scope)})", at)
