"""Each rank serves its own ``/metrics`` and announces it to Prometheus through ``file_sd``.

The port is base + local rank so ranks of one node never collide; a port already taken moves
the rank to the next free one (then to any free port) instead of failing. The ``file_sd``
target file carries the rank identity as target labels, so ``up`` of a rank that died still
names its job and rank (``TrainingRankDown``). Files are written atomically (write + rename)
so Prometheus never reads half a file.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

logger = logging.getLogger("trainguard.instrumentation")

PORT_SEARCH_SPAN = 64


@dataclass
class MetricsEndpoint:
    """A running ``/metrics`` server and the ``file_sd`` file announcing it."""

    server: WSGIServer
    thread: threading.Thread
    port: int
    file_sd_path: Path | None = None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
        if self.file_sd_path is not None:
            self.file_sd_path.unlink(missing_ok=True)


def serve_metrics(registry: CollectorRegistry, addr: str, base_port: int) -> MetricsEndpoint:
    """Serve ``registry`` on ``base_port`` or the next free port; ``0`` picks any free port.

    Raises ``OSError`` only when no port at all could be bound.
    """
    candidates = [0] if base_port == 0 else [*range(base_port, base_port + PORT_SEARCH_SPAN), 0]
    last_error: OSError | None = None
    for port in candidates:
        try:
            server, thread = start_http_server(port, addr=addr, registry=registry)
        except OSError as error:
            last_error = error
            continue
        bound = int(server.server_port)
        if bound != base_port and base_port != 0:
            logger.warning("trainguard: port %d is taken; serving /metrics on %d", base_port, bound)
        return MetricsEndpoint(server=server, thread=thread, port=bound)
    assert last_error is not None
    raise last_error


def scrape_target(addr: str, port: int) -> str:
    """``host:port`` Prometheus should scrape: the bound address unless it is a wildcard (then
    the host's name), an IPv6 address in brackets."""
    host = socket.gethostname() if addr in ("", "0.0.0.0", "::") else addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def write_file_sd(directory: Path, name: str, target: str, labels: dict[str, str]) -> Path:
    """Write one ``file_sd`` target group atomically and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    tmp = directory / f".{name}.json.tmp"
    tmp.write_text(json.dumps([{"targets": [target], "labels": labels}], indent=2))
    tmp.replace(path)
    return path
