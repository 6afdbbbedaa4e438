"""Ask the kubelet which pod, namespace and container holds each device of the node.

One ``List`` call to the kubelet's pod-resources service over its unix socket, with a deadline
so that a kubelet that accepts the connection and never answers costs one deadline, never a
hung scrape. Each call opens its own channel: gRPC keeps a failed channel in reconnect backoff
(up to minutes), so a channel kept across scrapes would go on failing for a while after a
kubelet restart, and a connection over a local socket costs well under a millisecond.

What comes back is flattened to one :class:`DeviceAssignment` per device id, in the kubelet's
order. Which of them are GPUs, and which GPU, is :mod:`trainguard.exporters.podresources.gpus`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from trainguard.exporters.podresources import api_pb2, api_pb2_grpc

# gRPC's 4 MiB default receive limit: a node with hundreds of pods, each listing its exclusive
# CPUs and memory, stays far below it; raised so that a large node never fails on size alone.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class PodResourcesError(Exception):
    """The kubelet could not be asked: no socket, no answer within the deadline, an error."""


@dataclass(frozen=True)
class DeviceAssignment:
    """One device id of one device-plugin resource, given to one container of one pod."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


def flatten(response: api_pb2.ListPodResourcesResponse) -> list[DeviceAssignment]:
    """Every (pod, container, resource, device id) of a ``List`` answer; pods without devices
    contribute nothing."""
    return [
        DeviceAssignment(pod.namespace, pod.name, container.name, devices.resource_name, device)
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        for device in devices.device_ids
    ]


def list_devices(socket: Path, timeout_seconds: float) -> list[DeviceAssignment]:
    """The kubelet's current device assignments; :class:`PodResourcesError` when it cannot
    tell within ``timeout_seconds``."""
    if not socket.exists():
        raise PodResourcesError(
            f"no kubelet pod-resources socket at {socket} (mount /var/lib/kubelet/pod-resources "
            "into the exporter's container, or set the socket's path)"
        )
    target = f"unix:{socket.absolute()}"
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(target, options=options) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        try:
            response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout_seconds)
        except grpc.RpcError as error:
            raise PodResourcesError(
                f"kubelet pod-resources List on {socket}: {error.code().name} "
                f"({error.details() or 'no details'})"
            ) from None  # gRPC's own exception repeats the same in a long debug string
    return flatten(response)
