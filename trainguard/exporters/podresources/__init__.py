"""The kubelet's pod-resources API (v1): the proto, its generated modules and a small client.

``api.proto`` re-expresses Kubernetes' published definition; ``api_pb2*`` are generated from it
(never edit them by hand); :mod:`trainguard.exporters.podresources.client` is what the
``kubelet`` collector calls. The package itself imports neither gRPC nor protobuf (about
28 MB of the exporter's memory), so an exporter without the ``kubelet`` collector never loads
them.
"""

from pathlib import Path

# Where the kubelet serves the API: pod-resources/kubelet.sock under its root directory
# (--root-dir, /var/lib/kubelet by default).
DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
