"""The Kubernetes executor, through the official ``kubernetes`` client.

- ``restart_from_checkpoint`` deletes the job's pods (label ``trainguard.io/job-id=<job_id>`` by
  default) in the alert's ``namespace`` (which the ranks report), else the configured one; the
  controller that owns them (Job, JobSet, PyTorchJob) recreates them and the training script
  resumes from its last checkpoint.
- ``exclude_node`` cordons the alert's node and deletes the job's pods on it, so the controller
  reschedules them elsewhere and torchrun elastic re-rendezvouses.
- ``drain_node`` cordons the node.
- ``annotate`` annotates the job's pods with the alert and the action.

Pods are deleted with a UID precondition taken from the snapshot and a pod that is already gone
counts as done; cordoning and annotating are patches that converge. A retried execution
therefore never deletes a replacement pod.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from trainguard import contract
from trainguard.contract import Action
from trainguard.remediation.executors import ActionRecord, ExecutionError

ANNOTATION_ACTION = "trainguard.io/action-id"
ANNOTATION_ALERT = "trainguard.io/alert"
_GONE = (404, 409)  # not found, or the precondition UID no longer matches: a replacement pod


class KubernetesExecutor:
    name = "kubernetes"
    actions: frozenset[Action] = frozenset(
        {Action.RESTART_FROM_CHECKPOINT, Action.EXCLUDE_NODE, Action.DRAIN_NODE, Action.ANNOTATE}
    )

    def __init__(
        self,
        api_client: Callable[[], client.ApiClient],
        *,
        namespace: str = "default",
        job_label: str = "trainguard.io/job-id",
        timeout: float = 60.0,
    ) -> None:
        self._api_client = api_client
        self._core: client.CoreV1Api | None = None
        self._namespace = namespace
        self._job_label = job_label
        self._timeout = timeout

    @property
    def core(self) -> client.CoreV1Api:
        # Built on first use: the service starts (and serves other schedulers) without a cluster.
        if self._core is None:
            self._core = client.CoreV1Api(self._api_client())
        return self._core

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self._timeout, **kwargs)
        except client.ApiException as exc:
            raise ExecutionError(f"{what}: HTTP {exc.status} {exc.reason}") from exc

    def _pods(self, namespace: str, job_id: str, node: str | None = None) -> list[list[str]]:
        kwargs = {"label_selector": f"{self._job_label}={job_id}"}
        if node is not None:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        pods = self._call("list pods", self.core.list_namespaced_pod, namespace, **kwargs)
        return [[pod.metadata.name, pod.metadata.uid] for pod in pods.items]

    def prepare(self, action: ActionRecord) -> dict[str, Any]:
        namespace = action.labels.get(contract.LABEL_NAMESPACE) or self._namespace
        job_id = action.labels.get(contract.LABEL_JOB_ID, "")
        node = action.labels.get(contract.LABEL_NODE, "")
        if action.action == Action.DRAIN_NODE:
            return {"node": node}
        pods = self._pods(namespace, job_id, node if action.action == Action.EXCLUDE_NODE else None)
        if not pods and action.action != Action.EXCLUDE_NODE:
            raise ExecutionError(f"no pod labelled {self._job_label}={job_id} in {namespace}")
        return {"namespace": namespace, "pods": pods, "node": node}

    def execute(self, action: ActionRecord, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        annotations = {ANNOTATION_ACTION: str(action.id), ANNOTATION_ALERT: action.alertname}
        output: dict[str, Any] = {}
        if action.action in (Action.EXCLUDE_NODE, Action.DRAIN_NODE):
            self._call(
                "cordon node",
                self.core.patch_node,
                snapshot["node"],
                {"spec": {"unschedulable": True}, "metadata": {"annotations": annotations}},
            )
            output["cordoned"] = snapshot["node"]
        if action.action in (Action.RESTART_FROM_CHECKPOINT, Action.EXCLUDE_NODE):
            deleted, gone = [], []
            for name, uid in snapshot["pods"]:
                try:
                    self.core.delete_namespaced_pod(
                        name,
                        snapshot["namespace"],
                        body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
                        _request_timeout=self._timeout,
                    )
                except client.ApiException as exc:
                    if exc.status not in _GONE:
                        raise ExecutionError(
                            f"delete pod {name}: HTTP {exc.status} {exc.reason}"
                        ) from exc
                    gone.append(name)
                else:
                    deleted.append(name)
            output.update(deleted=deleted, already_gone=gone)
        if action.action == Action.ANNOTATE:
            for name, _ in snapshot["pods"]:
                self._call(
                    "annotate pod",
                    self.core.patch_namespaced_pod,
                    name,
                    snapshot["namespace"],
                    {"metadata": {"annotations": annotations}},
                )
            output["annotated"] = [name for name, _ in snapshot["pods"]]
        return output


def api_client_factory(
    kube_config: str | None, context: str | None
) -> Callable[[], client.ApiClient]:
    """An ApiClient from a kubeconfig file, or from the pod's service account when None."""

    def build() -> client.ApiClient:
        from kubernetes import config

        if kube_config is not None:
            built: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=kube_config, context=context
            )
            return built
        configuration = client.Configuration()
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
        return client.ApiClient(configuration)

    return build
