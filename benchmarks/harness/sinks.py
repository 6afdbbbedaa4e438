"""What the hook's output is measured against: a span exporter that discards, an OTLP/HTTP
receiver that counts, and a scraper that reads /metrics on Prometheus' schedule."""

from __future__ import annotations

import gzip
import threading
import time
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from trainguard.exporters.serving import PROMETHEUS_SCRAPE_ACCEPT


class DiscardingExporter(SpanExporter):
    """Receives every span (so they are built and batched) and keeps none."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


# -- the OTLP receiver (parent process) ---------------------------------------------------------
class OtlpReceiver:
    """A local OTLP/HTTP endpoint: reads each POST body fully and answers 200, empty body."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.requests += 1
                    receiver.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the scraper (each rank process) ------------------------------------------------------------
class Scraper:
    """GETs ``/metrics`` of the production replica (``port``) every ``interval`` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.port: int | None = None
        self.scrapes = 0
        self.failures = 0
        self.bytes = 0
        self.seconds: list[float] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            port = self.port
            if port is not None:
                self.scrape(port)

    def scrape(self, port: int) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Accept": PROMETHEUS_SCRAPE_ACCEPT, "Accept-Encoding": "gzip"},
        )
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                body = response.read()
                if response.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
        except OSError:
            self.failures += 1
            return
        self.seconds.append(time.perf_counter() - start)
        self.bytes += len(body)
        self.scrapes += 1
