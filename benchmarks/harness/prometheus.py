"""A client of Prometheus' HTTP API, for the benchmarks that run one."""

from __future__ import annotations

import math
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


class Api:
    """The HTTP API and own metrics of one Prometheus."""

    def __init__(self, address: str) -> None:
        self.base = f"http://{address}"
        self.client = httpx.Client(timeout=60)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def ready(self) -> bool:
        try:
            return self.client.get(f"{self.base}/-/ready").status_code == 200
        except httpx.TransportError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = self.client.get(f"{self.base}/api/v1/query", params={"query": expr})
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def samples(self, expr: str, seconds: float) -> list[dict[str, Any]]:
        """The raw samples of ``expr`` over the last ``seconds`` (a range selector read as an
        instant query: each series' samples at the times they were written)."""
        return self.query(f"{expr}[{max(1, math.ceil(seconds))}s]")

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def by_group(self, expr: str) -> dict[str, float]:
        """An instant vector by rule group name (``rule_group`` is ``<file>;<name>``)."""
        return {
            _group_name(r["metric"].get("rule_group", "")): float(r["value"][1])
            for r in self.query(expr)
        }

    def alerts(self) -> list[dict[str, Any]]:
        response = self.client.get(f"{self.base}/api/v1/alerts")
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()["data"]["alerts"]
        return alerts

    def rules(self) -> list[dict[str, Any]]:
        response = self.client.get(f"{self.base}/api/v1/rules")
        response.raise_for_status()
        groups: list[dict[str, Any]] = response.json()["data"]["groups"]
        return groups

    def own_metrics(self) -> dict[str, dict[str, float]]:
        """Prometheus' own /metrics: sample name -> its rule_group (or '') -> value."""
        text = self.client.get(f"{self.base}/metrics").text
        samples: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = _group_name(sample.labels.get("rule_group", ""))
                samples.setdefault(sample.name, {})[key] = sample.value
        return samples


def _group_name(rule_group: str) -> str:
    return rule_group.rpartition(";")[2]
