"""A small client for Prometheus' HTTP query API (``/api/v1/query`` and ``query_range``).

Only what the diagnosis needs: range and instant queries returning float series, with every
failure (unreachable server, HTTP error, an API ``error`` answer, a malformed body) raised as
:class:`PrometheusError` naming the query and the server, so the command can say what went
wrong instead of printing a traceback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import httpx


class PrometheusError(RuntimeError):
    """Prometheus could not answer a query."""


@dataclass(frozen=True)
class Series:
    """One series of a query result: its labels and its (unix time, value) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]

    def label(self, name: str, default: str = "") -> str:
        return self.labels.get(name, default)

    def values(self) -> list[float]:
        return [v for _, v in self.points if not math.isnan(v)]

    def last(self) -> float | None:
        values = self.values()
        return values[-1] if values else None


def _float(text: Any) -> float:
    # Prometheus encodes sample values as strings ("NaN", "+Inf" included).
    return float(text)


class PrometheusClient:
    """Queries one Prometheus server; ``timeout`` bounds every request."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        headers: dict[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise PrometheusError(f"Prometheus URL must start with http:// or https://: {url!r}")
        self.url = url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.url, timeout=timeout, headers=headers, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str, params: dict[str, str]) -> Any:
        try:
            response = self._client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {exc}") from exc
        try:
            body = response.json()
        except ValueError as exc:
            raise PrometheusError(
                f"Prometheus at {self.url} answered {response.status_code} with a body that "
                f"is not JSON (is this the Prometheus URL?)"
            ) from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error", body) if isinstance(body, dict) else body
            raise PrometheusError(
                f"Prometheus at {self.url} refused {params.get('query', '')!r}: {error}"
            )
        return body.get("data")

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get(
            "/api/v1/query_range",
            {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        return self._series(data, query, "matrix")

    def query(self, query: str, at: float) -> list[Series]:
        data = self._get("/api/v1/query", {"query": query, "time": f"{at:.3f}"})
        return self._series(data, query, "vector")

    def _series(self, data: Any, query: str, kind: str) -> list[Series]:
        if not isinstance(data, dict) or data.get("resultType") != kind:
            raise PrometheusError(f"unexpected answer to {query!r} from {self.url}: {data!r}")
        out = []
        try:
            for item in data["result"]:
                labels = {k: str(v) for k, v in item["metric"].items() if k != "__name__"}
                if kind == "matrix":
                    points = [(float(t), _float(v)) for t, v in item["values"]]
                else:
                    t, v = item["value"]
                    points = [(float(t), _float(v))]
                out.append(Series(labels, points))
        except (KeyError, TypeError, ValueError) as exc:
            raise PrometheusError(f"malformed answer to {query!r} from {self.url}") from exc
        return out
