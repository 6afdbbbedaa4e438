"""The committed pod-resources modules are what api.proto generates, and speak kubelet's wire.

After editing api.proto (or moving to new pinned versions of grpcio-tools / mypy-protobuf),
write the modules again with
``TRAINGUARD_UPDATE_GENERATED=1 .venv/bin/pytest tests/exporters/test_podresources_proto.py``
and review the diff.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.exporters.podresources import api_pb2, api_pb2_grpc

ROOT = Path(__file__).parents[2]
PACKAGE = Path("trainguard/exporters/podresources")
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")


def generate(out: Path) -> None:
    """grpcio-tools writes the messages and the service, mypy-protobuf their stubs."""
    scripts = str(Path(sys.executable).parent)  # where pip put mypy-protobuf's protoc plugins
    names = ("mypy", "mypy_grpc")
    plugins = {name: shutil.which(f"protoc-gen-{name}", path=scripts) for name in names}
    missing = [name for name, path in plugins.items() if path is None]
    assert not missing, f"protoc-gen-{missing[0]} not found: install the dev extra"
    (out / PACKAGE).mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *(f"--plugin=protoc-gen-{name}={path}" for name, path in plugins.items()),
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            str(ROOT / PACKAGE / "api.proto"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"protoc failed: {result.stderr}"


def test_the_committed_modules_are_what_the_proto_generates(tmp_path: Path) -> None:
    if os.environ.get("TRAINGUARD_UPDATE_GENERATED") == "1":
        generate(ROOT)
    generate(tmp_path)
    for name in GENERATED:
        fresh = (tmp_path / PACKAGE / name).read_text()
        assert fresh == (ROOT / PACKAGE / name).read_text(), f"{name} is out of date"


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("ListPodResourcesResponse", {"pod_resources": 1}),
        ("PodResources", {"name": 1, "namespace": 2, "containers": 3}),
        (
            "ContainerResources",
            {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5},
        ),
        ("ContainerDevices", {"resource_name": 1, "device_ids": 2, "topology": 3}),
        ("TopologyInfo", {"nodes": 1}),
        ("NUMANode", {"ID": 1}),
    ],
)
def test_messages_keep_kubelets_field_numbers(message: str, fields: dict[str, int]) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == fields


def test_the_service_is_kubelets_v1_pod_resources_lister() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1"
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]
    assert hasattr(api_pb2_grpc, "PodResourcesListerStub")


def test_a_response_encoded_by_hand_decodes_as_kubelet_meant_it() -> None:
    """Bytes laid out by field number, as the kubelet's Go code sends them: pod (1) -> name (1),
    namespace (2), container (3) -> name (1), devices (2) -> resource (1), ids (2)."""

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    devices = field(1, b"nvidia.com/gpu") + field(2, b"GPU-abc") + field(2, b"GPU-def")
    container = field(1, b"trainer") + field(2, devices)
    pod = field(1, b"llama-0") + field(2, b"ml") + field(3, container)
    response = api_pb2.ListPodResourcesResponse.FromString(field(1, pod))
    (decoded,) = response.pod_resources
    assert (decoded.name, decoded.namespace) == ("llama-0", "ml")
    (got,) = decoded.containers[0].devices
    assert (got.resource_name, list(got.device_ids)) == ("nvidia.com/gpu", ["GPU-abc", "GPU-def"])
