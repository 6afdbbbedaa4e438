"""An HTTP test server on 127.0.0.1 that follows Elasticsearch's documented contracts.

Enough of Elasticsearch for the shipper and the installer: ``_bulk`` (NDJSON action/source
pairs; per-item results with their own status; ``create`` into data streams, 409 for an id that
is already there), whole-request errors (401/403, 429, 5xx) and dropped connections on demand,
a request size limit answered 413 the way a proxy does (no product header, an HTML body), the ILM
policy and index template APIs, and Kibana's data view API. Every other response carries the
``X-Elastic-Product: Elasticsearch`` header the official client checks.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# What the next _bulk requests do, in order; when none is queued a request succeeds.
#   "ok"                       index everything
#   ("status", 429)            answer the whole request with this status
#   "drop"                     read the request, then close the connection without answering
#   ("items", {0: 429, 3: 400}) these positions in the request fail with these statuses
Behaviour = Any

_ERROR_TYPES = {
    400: "mapper_parsing_exception",
    401: "security_exception",
    403: "security_exception",
    404: "index_not_found_exception",
    429: "es_rejected_execution_exception",
    500: "internal_server_error",
    503: "unavailable_shards_exception",
}


@dataclass
class State:
    streams: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    ids: set[tuple[str, str]] = field(default_factory=set)
    script: deque[Behaviour] = field(default_factory=deque)
    requests: list[tuple[str, str]] = field(default_factory=list)
    bulk_sizes: list[int] = field(default_factory=list)
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    data_views: dict[str, dict[str, Any]] = field(default_factory=dict)
    reject: Callable[[dict[str, Any]], int | None] | None = None
    # Like Elasticsearch's http.max_content_length or a proxy's client_max_body_size.
    max_bulk_bytes: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def _error(status: int, reason: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "exception")
    cause = {"type": kind, "reason": reason}
    return {"error": {"root_cause": [cause], **cause}, "status": status}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read the state, not the access log."""

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("X-Elastic-Product", "Elasticsearch")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._route("GET", b"")

    def do_PUT(self) -> None:
        self._route("PUT", self._body())

    def do_POST(self) -> None:
        self._route("POST", self._body())

    def do_HEAD(self) -> None:
        self._send(200, {})

    def _route(self, method: str, body: bytes) -> None:
        state = self.server.state
        path = self.path.split("?", 1)[0]
        with state.lock:
            state.requests.append((method, path))
        if path == "/":
            self._send(200, {"name": "fake", "version": {"number": "9.0.0"}, "tagline": "x"})
        elif path == "/_bulk" and method in ("POST", "PUT"):
            self._bulk(body)
        elif path.startswith("/_ilm/policy/"):
            self._stored(method, body, state.policies, path.rsplit("/", 1)[1], self._policy_view)
        elif path.startswith("/_index_template/"):
            name = path.rsplit("/", 1)[1]
            self._stored(method, body, state.templates, name, self._template_view)
        elif path.startswith("/api/data_views/data_view"):
            self._data_view(method, path, body)
        else:
            self._send(404, _error(404, f"no handler for {method} {path}"))

    # --- _bulk ----------------------------------------------------------------------------
    def _bulk(self, body: bytes) -> None:
        state = self.server.state
        if state.max_bulk_bytes is not None and len(body) > state.max_bulk_bytes:
            self._too_large()
            return
        with state.lock:
            behaviour = state.script.popleft() if state.script else "ok"
        if behaviour == "drop":
            self.close_connection = True
            self.connection.close()
            return
        if isinstance(behaviour, tuple) and behaviour[0] == "status":
            self._send(behaviour[1], _error(behaviour[1], "scripted failure"))
            return
        item_status: dict[int, int] = behaviour[1] if isinstance(behaviour, tuple) else {}
        lines = [line for line in body.split(b"\n") if line.strip()]
        items = []
        errors = False
        with state.lock:
            state.bulk_sizes.append(len(lines) // 2)
            for position in range(0, len(lines), 2):
                action = json.loads(lines[position])
                op, meta = next(iter(action.items()))
                source = json.loads(lines[position + 1])
                index, doc_id = meta["_index"], meta.get("_id")
                status = item_status.get(position // 2)
                if status is None and op != "create":
                    status = 400  # data streams only take create
                if status is None and state.reject is not None:
                    status = state.reject(source)
                if status is None and (index, doc_id) in state.ids:
                    items.append(
                        {
                            op: {
                                "_index": index,
                                "_id": doc_id,
                                "status": 409,
                                "error": {
                                    "type": "version_conflict_engine_exception",
                                    "reason": f"[{doc_id}]: version conflict, document exists",
                                },
                            }
                        }
                    )
                    errors = True
                    continue
                if status is not None:
                    errors = True
                    error = _error(status, "scripted item failure")["error"]
                    items.append(
                        {op: {"_index": index, "_id": doc_id, "status": status, "error": error}}
                    )
                    continue
                state.ids.add((index, doc_id))
                state.streams.setdefault(index, []).append(source)
                items.append(
                    {
                        op: {
                            "_index": f".ds-{index}-2026.12.02-000001",
                            "_id": doc_id,
                            "_version": 1,
                            "result": "created",
                            "status": 201,
                        }
                    }
                )
        self._send(200, {"took": 3, "errors": errors, "items": items})

    def _too_large(self) -> None:
        page = b"<html><head><title>413 Request Entity Too Large</title></head></html>\n"
        self.send_response(413)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    # --- ILM and templates ------------------------------------------------------------------
    @staticmethod
    def _policy_view(name: str, stored: dict[str, Any]) -> dict[str, Any]:
        return {name: {"version": stored["version"], "policy": stored["body"]["policy"]}}

    @staticmethod
    def _template_view(name: str, stored: dict[str, Any]) -> dict[str, Any]:
        return {"index_templates": [{"name": name, "index_template": stored["body"]}]}

    def _stored(
        self,
        method: str,
        body: bytes,
        store: dict[str, dict[str, Any]],
        name: str,
        view: Callable[[str, dict[str, Any]], dict[str, Any]],
    ) -> None:
        with self.server.state.lock:
            if method == "PUT":
                previous = store.get(name, {"version": 0})
                store[name] = {"version": previous["version"] + 1, "body": json.loads(body)}
                answer: tuple[int, dict[str, Any]] = (200, {"acknowledged": True})
            elif name in store:
                answer = (200, view(name, store[name]))
            else:
                answer = (404, _error(404, f"[{name}] not found"))
        self._send(*answer)

    # --- Kibana -----------------------------------------------------------------------------
    def _data_view(self, method: str, path: str, body: bytes) -> None:
        state = self.server.state
        if method != "GET" and not self.headers.get("kbn-xsrf"):
            self._send(
                400, {"statusCode": 400, "message": "Request must contain a kbn-xsrf header."}
            )
            return
        if method == "GET":
            view_id = path.rsplit("/", 1)[1]
            with state.lock:
                view = state.data_views.get(view_id)
            if view is None:
                self._send(404, {"statusCode": 404, "error": "Not Found"})
            else:
                self._send(200, {"data_view": view})
            return
        view = json.loads(body)["data_view"]
        with state.lock:
            state.data_views[view["id"]] = view
        self._send(200, {"data_view": view})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: State


class FakeElasticsearch:
    """Start/stop (and restart on the same port) a fake cluster; ``state`` survives restarts."""

    def __init__(self) -> None:
        self.state = State()
        self.port = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeElasticsearch:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.state = self.state
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def docs(self, stream: str) -> list[dict[str, Any]]:
        with self.state.lock:
            return list(self.state.streams.get(stream, []))

    def count(self, method: str, prefix: str) -> int:
        with self.state.lock:
            return sum(1 for m, p in self.state.requests if m == method and p.startswith(prefix))
