"""The exporter's /metrics app: the text format whatever Prometheus asks, gzip when asked."""

from __future__ import annotations

import gzip
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from trainguard.exporters.serving import (
    PROMETHEUS_SCRAPE_ACCEPT,
    Exposition,
    WsgiApp,
    metrics_app,
)


def _call(app: Any, method: str = "GET", **headers: str) -> tuple[str, dict[str, str], bytes]:
    answer: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        answer["status"], answer["headers"] = status, dict(response_headers)

    environ = {"REQUEST_METHOD": method, "PATH_INFO": "/metrics", "QUERY_STRING": ""}
    environ.update({f"HTTP_{k.upper()}": v for k, v in headers.items()})
    body = b"".join(app(environ, start_response))
    return answer["status"], answer["headers"], body


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    gauge = Gauge("demo_temperature_celsius", "A gauge.", ["gpu"], registry=registry)
    for gpu in range(64):
        gauge.labels(str(gpu)).set(40 + gpu)
    return registry


def scrape_app(registry: CollectorRegistry) -> WsgiApp:
    exposition = Exposition.render(registry)
    return metrics_app(lambda: exposition)


def test_openmetrics_asked_text_answered() -> None:
    status, headers, body = _call(scrape_app(_registry()), accept=PROMETHEUS_SCRAPE_ACCEPT)
    assert status.startswith("200")
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in headers
    assert b'demo_temperature_celsius{gpu="63"} 103.0' in body
    assert b"# EOF" not in body


def test_gzip_when_asked_same_body() -> None:
    app = scrape_app(_registry())
    _, _, plain = _call(app, accept=PROMETHEUS_SCRAPE_ACCEPT)
    status, headers, body = _call(app, accept=PROMETHEUS_SCRAPE_ACCEPT, accept_encoding="gzip")
    assert status.startswith("200")
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == plain
    assert len(body) < len(plain) / 3


def test_other_methods_are_prometheus_client_s_answers_uncompressed() -> None:
    status, headers, body = _call(scrape_app(_registry()), "POST", accept_encoding="gzip")
    assert status.startswith("405")
    assert "Content-Encoding" not in headers
    assert b"use OPTIONS or GET" in body
