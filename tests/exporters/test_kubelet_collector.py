"""The kubelet collector against a real gRPC server on a unix socket, built from the same proto.

The server plays the kubelet's pod-resources service: pods holding whole GPUs, a MIG device, a
non-GPU device and a pod with no device at all; one that never answers; one that fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from tests.exporters.conftest import make_context, one, registry_of, scrape, values
from tests.exporters.test_exporter_process import exporter
from trainguard import contract
from trainguard.exporters.collectors.gpu import GpuCollector
from trainguard.exporters.collectors.kubelet import (
    KubeletCollector,
    enabled_by_default,
    socket_path,
)
from trainguard.exporters.fake import FakeProvider
from trainguard.exporters.podresources import DEFAULT_SOCKET, api_pb2, api_pb2_grpc
from trainguard.exporters.podresources.client import PodResourcesError, list_devices
from trainguard.exporters.podresources.gpus import GpuRef, is_gpu_resource, resolve
from trainguard.exporters.registry import NodeCollector

POD_INFO = contract.GPU_POD_INFO.name
SUCCESS = contract.EXPORTER_COLLECTOR_SUCCESS.name
NEW_STYLE_MIG = "MIG-6f0c1d7e-2b3a-5c4d-8e9f-0a1b2c3d4e5f"
FAKE = FakeProvider(gpus=4)


def _devices(resource: str, *ids: str) -> api_pb2.ContainerDevices:
    return api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))


def node_pods() -> api_pb2.ListPodResourcesResponse:
    """What a kubelet answers on a node running a training pod, an inference pod on MIG
    slices and a web pod with no device."""
    trainer = api_pb2.ContainerResources(
        name="trainer",
        devices=[
            _devices("nvidia.com/gpu", FAKE.identity(0).uuid, FAKE.identity(1).uuid),
            _devices("example.com/infiniband", "mlx5_0"),
        ],
        cpu_ids=[4, 5, 6, 7],
    )
    server = api_pb2.ContainerResources(
        name="server",
        devices=[
            _devices("nvidia.com/mig-1g.10gb", f"MIG-{FAKE.identity(2).uuid}/7/0", NEW_STYLE_MIG),
        ],
    )
    return api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(name="llama-0", namespace="ml", containers=[trainer]),
            api_pb2.PodResources(name="infer-7", namespace="serving", containers=[server]),
            api_pb2.PodResources(
                name="web",
                namespace="default",
                containers=[api_pb2.ContainerResources(name="nginx", cpu_ids=[1])],
            ),
        ]
    )


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The pod-resources service; ``hang`` makes ``List`` wait until ``release`` is set,
    ``status`` makes it fail with that code."""

    def __init__(self, response: api_pb2.ListPodResourcesResponse) -> None:
        self.response = response
        self.hang = False
        self.status: grpc.StatusCode | None = None
        self.release = threading.Event()
        self.calls = 0

    def List(  # noqa: N802  (the proto's method name)
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.hang:
            self.release.wait(120)
        if self.status is not None:
            context.abort(self.status, "device manager not ready")
        return self.response

    def GetAllocatableResources(  # noqa: N802
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not served by this test")

    def Get(  # noqa: N802
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not served by this test")


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # A unix socket's path is limited to 107 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="tg-kubelet-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[tuple[Kubelet, Path]]:
    servicer = Kubelet(node_pods())
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    socket = socket_dir / "kubelet.sock"
    assert server.add_insecure_port(f"unix:{socket}") != 0
    server.start()
    yield servicer, socket
    servicer.release.set()
    server.stop(grace=None).wait(30)


def pod_series(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> set[tuple[str, ...]]:
    keys = ("gpu", "uuid", "pod", "namespace", "container", "resource", "device_id")
    return {tuple(dict(k)[key] for key in keys) for k in values(samples, POD_INFO)}


def test_each_gpu_and_mig_device_is_mapped_to_its_pod(kubelet: tuple[Kubelet, Path]) -> None:
    servicer, socket = kubelet
    collector = KubeletCollector(make_context(FAKE), socket, timeout_seconds=10.0)
    registry, _ = registry_of({"kubelet": collector})
    samples = scrape(registry)
    uuid0, uuid1, uuid2 = (FAKE.identity(i).uuid for i in range(3))
    mig = "nvidia.com/mig-1g.10gb"
    assert pod_series(samples) == {
        ("0", uuid0, "llama-0", "ml", "trainer", "nvidia.com/gpu", uuid0),
        ("1", uuid1, "llama-0", "ml", "trainer", "nvidia.com/gpu", uuid1),
        ("2", uuid2, "infer-7", "serving", "server", mig, f"MIG-{uuid2}/7/0"),
        # A MIG UUID does not say its GPU: kept with its id, no gpu label to join on.
        ("", "", "infer-7", "serving", "server", mig, NEW_STYLE_MIG),
    }
    assert one(samples, SUCCESS, collector="kubelet") == 1.0
    assert servicer.calls == 1


def test_pods_are_read_again_at_every_scrape(kubelet: tuple[Kubelet, Path]) -> None:
    servicer, socket = kubelet
    registry, _ = registry_of({"kubelet": KubeletCollector(make_context(FAKE), socket, 10.0)})
    assert len(values(scrape(registry), POD_INFO, pod="llama-0")) == 2
    del servicer.response.pod_resources[0]  # the training pod finished
    samples = scrape(registry)
    assert not values(samples, POD_INFO, pod="llama-0")
    assert len(values(samples, POD_INFO, pod="infer-7")) == 2
    assert servicer.calls == 2


def test_a_kubelet_that_never_answers_costs_one_deadline(kubelet: tuple[Kubelet, Path]) -> None:
    servicer, socket = kubelet
    servicer.hang = True
    context = make_context(FAKE)
    collectors: dict[str, NodeCollector] = {
        "gpu": GpuCollector(context),
        "kubelet": KubeletCollector(context, socket, timeout_seconds=0.5),
    }
    registry, _ = registry_of(collectors)
    started = time.monotonic()
    samples = scrape(registry)
    # The server holds the call for two minutes; the scrape is back after the deadline.
    assert time.monotonic() - started < 60
    assert one(samples, SUCCESS, collector="kubelet") == 0.0
    assert one(samples, SUCCESS, collector="gpu") == 1.0
    assert len(values(samples, contract.GPU_TEMPERATURE.name)) == 4
    assert not values(samples, POD_INFO)
    servicer.hang = False  # the kubelet answers again: so does the collector
    servicer.release.set()
    samples = scrape(registry)
    assert one(samples, SUCCESS, collector="kubelet") == 1.0
    assert len(values(samples, POD_INFO)) == 4


def test_the_deadline_is_reported(kubelet: tuple[Kubelet, Path]) -> None:
    servicer, socket = kubelet
    servicer.hang = True
    with pytest.raises(PodResourcesError, match="DEADLINE_EXCEEDED"):
        list_devices(socket, timeout_seconds=0.3)


def test_an_error_status_fails_the_collector_with_its_code(kubelet: tuple[Kubelet, Path]) -> None:
    servicer, socket = kubelet
    servicer.status = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(PodResourcesError, match=r"UNAVAILABLE.*device manager not ready"):
        list_devices(socket, timeout_seconds=10.0)
    registry, _ = registry_of({"kubelet": KubeletCollector(make_context(FAKE), socket, 10.0)})
    assert one(scrape(registry), SUCCESS, collector="kubelet") == 0.0


def test_a_missing_socket_is_a_counted_failure_that_says_what_to_mount(socket_dir: Path) -> None:
    socket = socket_dir / "absent.sock"
    with pytest.raises(
        PodResourcesError, match=re.escape(f"no kubelet pod-resources socket at {socket}")
    ):
        list_devices(socket, timeout_seconds=1.0)
    context = make_context(FAKE)
    collectors: dict[str, NodeCollector] = {
        "gpu": GpuCollector(context),
        "kubelet": KubeletCollector(context, socket),
    }
    registry, _ = registry_of(collectors)
    samples = scrape(registry)
    assert one(samples, SUCCESS, collector="kubelet") == 0.0
    assert one(samples, SUCCESS, collector="gpu") == 1.0


def test_a_socket_nobody_listens_on_is_a_failure(socket_dir: Path) -> None:
    import socket as sockets

    path = socket_dir / "stale.sock"
    stale = sockets.socket(sockets.AF_UNIX)
    stale.bind(str(path))  # bound, never listening: what a crashed kubelet leaves behind
    stale.close()
    with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
        list_devices(path, timeout_seconds=5.0)


def test_without_a_driver_pods_keep_the_gpus_seen_before(kubelet: tuple[Kubelet, Path]) -> None:
    _, socket = kubelet
    provider = FakeProvider(gpus=4, unavailable="NVML Shared Library Not Found")
    registry, _ = registry_of({"kubelet": KubeletCollector(make_context(provider), socket, 10.0)})
    samples = scrape(registry)
    assert one(samples, SUCCESS, collector="kubelet") == 1.0
    assert one(samples, POD_INFO, pod="llama-0", gpu="1") == 1.0


def test_on_by_default_only_where_the_socket_is_known(tmp_path: Path) -> None:
    absent = tmp_path / "kubelet.sock"
    assert not enabled_by_default({}, absent)
    assert not enabled_by_default({contract.ENV_POD_RESOURCES_SOCKET: ""}, absent)
    assert enabled_by_default({contract.ENV_POD_RESOURCES_SOCKET: "/run/k.sock"}, absent)
    absent.touch()
    assert enabled_by_default({}, absent)


def test_the_socket_comes_from_the_environment_else_the_kubelet_default() -> None:
    assert socket_path({}) == DEFAULT_SOCKET
    assert socket_path({contract.ENV_POD_RESOURCES_SOCKET: "/host/k.sock"}) == Path("/host/k.sock")


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (FAKE.identity(3).uuid, GpuRef("3", FAKE.identity(3).uuid)),
        ("2", GpuRef("2", FAKE.identity(2).uuid)),  # --device-id-strategy=index
        (f"{FAKE.identity(1).uuid}::3", GpuRef("1", FAKE.identity(1).uuid)),  # time-slicing
        (f"MIG-{FAKE.identity(0).uuid}/2/0", GpuRef("0", FAKE.identity(0).uuid)),
        (NEW_STYLE_MIG, GpuRef()),
        (
            "GPU-00000000-dead-beef-0000-000000000000",
            GpuRef("", "GPU-00000000-dead-beef-0000-000000000000"),
        ),
        ("9", GpuRef()),  # an index this node does not have
    ],
)
def test_device_ids_resolve_to_the_gpu_they_name(device_id: str, expected: GpuRef) -> None:
    assert resolve(device_id, FAKE.identities().values()) == expected


@pytest.mark.parametrize(
    ("resource", "is_gpu"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-3g.40gb", True),
        ("nvidia.com/gpudirect-rdma", False),
        ("example.com/infiniband", False),
        ("amd.com/gpu", False),
    ],
)
def test_only_nvidia_gpu_and_mig_resources_are_gpus(resource: str, is_gpu: bool) -> None:
    assert is_gpu_resource(resource) is is_gpu


def test_the_exporter_turns_it_on_when_the_socket_is_named(
    kubelet: tuple[Kubelet, Path],
) -> None:
    """The exporter process, told the socket by the variable the DaemonSet sets, maps the
    kubelet's devices to its (simulated) GPUs with no flag."""
    servicer, socket = kubelet
    simulated = "GPU-SIMULATED-0000-0000-0000-000000000001"  # simulated.py's GPU 1
    del servicer.response.pod_resources[1:]
    devices = servicer.response.pod_resources[0].containers[0].devices[0]
    devices.device_ids[:] = [simulated]
    env = {contract.ENV_POD_RESOURCES_SOCKET: str(socket)}
    with exporter(
        "--simulate-gpus", "2", "--nccl.log-glob", str(socket.parent / "x"), env=env
    ) as e:
        samples = e.scrape()
    assert one(samples, SUCCESS, collector="kubelet") == 1.0
    assert one(samples, POD_INFO, gpu="1", uuid=simulated, pod="llama-0", namespace="ml") == 1.0


def test_registering_the_collectors_loads_no_grpc() -> None:
    """gRPC and protobuf are ~28 MB of the exporter: loaded only where the kubelet is asked."""
    probe = "import sys, trainguard.exporters.collectors; print('grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
