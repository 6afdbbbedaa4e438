"""The Kubernetes executor at its boundary: the official client against a fake API server.

The fake server records every request; the tests assert the exchange (method, path, query,
body) the executor produced, which is what a real API server would have received.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from trainguard.contract import Action
from trainguard.remediation.executors import ActionRecord, ExecutionError
from trainguard.remediation.executors.kubernetes import KubernetesExecutor


class FakeApiServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pods = {"train-0": ("uid-0", "n1"), "train-1": ("uid-1", "n2")}
        self.exchange: list[dict[str, Any]] = []
        self.forbid_patch = False


class _Handler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> tuple[str, dict[str, list[str]], Any]:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.exchange.append(
            {
                "method": self.command,
                "path": url.path,
                "query": parse_qs(url.query),
                "content_type": self.headers.get("Content-Type"),
                "body": body,
            }
        )
        return url.path, parse_qs(url.query), body

    def do_GET(self) -> None:
        _, query, _ = self._record()
        node = query.get("fieldSelector", [""])[0].removeprefix("spec.nodeName=")
        items = [
            {"metadata": {"name": name, "uid": uid, "namespace": "ml"}}
            for name, (uid, on) in sorted(self.server.pods.items())
            if not node or on == node
        ]
        self._reply(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    def do_DELETE(self) -> None:
        path, _, body = self._record()
        name = path.rsplit("/", 1)[1]
        if name not in self.server.pods:
            self._reply(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
            return
        if body["preconditions"]["uid"] != self.server.pods[name][0]:
            self._reply(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
            return
        del self.server.pods[name]
        self._reply(200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name}})

    def do_PATCH(self) -> None:
        path, _, body = self._record()
        if self.server.forbid_patch:
            self._reply(403, {"kind": "Status", "code": 403, "reason": "Forbidden"})
            return
        kind = "Node" if "/nodes/" in path else "Pod"
        self._reply(200, {"kind": kind, "apiVersion": "v1", "metadata": body["metadata"]})


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _executor(api: FakeApiServer) -> KubernetesExecutor:
    def build() -> client.ApiClient:
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{api.server_address[1]}"
        return client.ApiClient(configuration)

    return KubernetesExecutor(build, namespace="default", job_label="trainguard.io/job-id")


def _action(action: Action, **labels: str) -> ActionRecord:
    return ActionRecord(
        id=7,
        action=action,
        executor="kubernetes",
        subject="j1",
        params={},
        alertname="TrainingStraggler",
        labels={"job_id": "j1", "namespace": "ml", **labels},
    )


ANNOTATIONS = {"trainguard.io/action-id": "7", "trainguard.io/alert": "TrainingStraggler"}


def test_exclude_node_cordons_and_deletes_the_pods_on_it(api: FakeApiServer) -> None:
    executor = _executor(api)
    action = _action(Action.EXCLUDE_NODE, node="n1")
    snapshot = executor.prepare(action)
    assert snapshot == {"namespace": "ml", "pods": [["train-0", "uid-0"]], "node": "n1"}
    output = executor.execute(action, snapshot)
    assert output == {"cordoned": "n1", "deleted": ["train-0"], "already_gone": []}
    get, patch, delete = api.exchange
    assert (get["method"], get["path"]) == ("GET", "/api/v1/namespaces/ml/pods")
    assert get["query"] == {
        "labelSelector": ["trainguard.io/job-id=j1"],
        "fieldSelector": ["spec.nodeName=n1"],
    }
    assert (patch["method"], patch["path"]) == ("PATCH", "/api/v1/nodes/n1")
    assert patch["body"] == {
        "spec": {"unschedulable": True},
        "metadata": {"annotations": ANNOTATIONS},
    }
    assert "merge-patch" in patch["content_type"]
    assert (delete["method"], delete["path"]) == ("DELETE", "/api/v1/namespaces/ml/pods/train-0")
    assert delete["body"]["preconditions"] == {"uid": "uid-0"}
    assert set(api.pods) == {"train-1"}


def test_restart_is_idempotent_given_the_snapshot(api: FakeApiServer) -> None:
    executor = _executor(api)
    action = _action(Action.RESTART_FROM_CHECKPOINT)
    snapshot = executor.prepare(action)
    assert executor.execute(action, snapshot)["deleted"] == ["train-0", "train-1"]
    # The controller recreated train-1 with a new UID before the retry: it must survive.
    api.pods["train-1"] = ("uid-new", "n2")
    again = executor.execute(action, snapshot)
    assert again == {"deleted": [], "already_gone": ["train-0", "train-1"]}
    assert api.pods == {"train-1": ("uid-new", "n2")}


def test_annotate_and_drain(api: FakeApiServer) -> None:
    executor = _executor(api)
    action = _action(Action.ANNOTATE)
    assert executor.execute(action, executor.prepare(action)) == {
        "annotated": ["train-0", "train-1"]
    }
    drain = _action(Action.DRAIN_NODE, node="n2")
    assert executor.prepare(drain) == {"node": "n2"}
    assert executor.execute(drain, {"node": "n2"}) == {"cordoned": "n2"}
    methods = [(e["method"], e["path"]) for e in api.exchange]
    assert methods == [
        ("GET", "/api/v1/namespaces/ml/pods"),
        ("PATCH", "/api/v1/namespaces/ml/pods/train-0"),
        ("PATCH", "/api/v1/namespaces/ml/pods/train-1"),
        ("PATCH", "/api/v1/nodes/n2"),
    ]


def test_api_errors_become_execution_errors(api: FakeApiServer) -> None:
    executor = _executor(api)
    api.forbid_patch = True
    with pytest.raises(ExecutionError, match="cordon node: HTTP 403"):
        executor.execute(_action(Action.DRAIN_NODE, node="n1"), {"node": "n1"})
    api.pods.clear()
    with pytest.raises(ExecutionError, match=r"no pod labelled trainguard\.io/job-id=j1 in ml"):
        executor.prepare(_action(Action.RESTART_FROM_CHECKPOINT))
