"""Helpers of the Kubernetes manifest tests: rendering the overlays with ``kubectl kustomize``
and validating what they render, offline.

Validation is two well-kept validators, each on what it has schemas for:

- core kinds (Deployment, Secret, NetworkPolicy, ...): ``kubernetes-validate`` with ``strict``,
  whose JSON schemas come from Kubernetes' OpenAPI with unknown properties refused;
- the Prometheus Operator's kinds: the pydantic models of ``cloudcoil.models.prometheus_operator``
  (generated from the operator's CRDs), validated with ``extra="forbid"`` and by field alias
  only, so an unknown or snake_cased field is refused as the API server's strict field
  validation refuses it.

A kind neither knows is an error, never a skip.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pydantic
import yaml
from cloudcoil.models.prometheus_operator import v1 as monitoring_v1
from cloudcoil.models.prometheus_operator import v1alpha1 as monitoring_v1alpha1

from tests.deploy.stack import REPO, binary

KUBERNETES = REPO / "deploy" / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUBERNETES / "overlays").iterdir() if path.is_dir())
# The oldest and the newest Kubernetes whose schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.25", "1.37")

_CRD_MODELS: dict[tuple[str, str], type[pydantic.BaseModel]] = {
    ("monitoring.coreos.com/v1", "PodMonitor"): monitoring_v1.PodMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): monitoring_v1.PrometheusRule,
    (
        "monitoring.coreos.com/v1alpha1",
        "AlertmanagerConfig",
    ): monitoring_v1alpha1.AlertmanagerConfig,
}


class InvalidManifestError(Exception):
    """A manifest its validator refused, or one no validator knows."""


class _Loader(yaml.SafeLoader):
    """YAML 1.1's ``=`` value tag (kustomize writes ``matchType: =`` unquoted) read as text."""


_Loader.add_constructor(
    "tag:yaml.org,2002:value",
    lambda loader, node: loader.construct_scalar(node),  # type: ignore[arg-type]
)


def load_all(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc]


def kubectl() -> str:
    return binary("kubectl", "Debian: kubernetes-client")


def kustomize(directory: Path) -> str:
    """What ``kubectl kustomize`` renders for ``directory`` (fails the test on an error)."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {directory}: {done.stderr}"
    return done.stdout


@functools.cache
def rendered(overlay: str) -> str:
    """The overlay's rendering (rendered once per test session)."""
    return kustomize(KUBERNETES / "overlays" / overlay)


def objects(overlay: str) -> list[dict[str, Any]]:
    return load_all(rendered(overlay))


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def validate(doc: dict[str, Any]) -> None:
    """Raises InvalidManifestError unless ``doc`` is valid for every Kubernetes version tested."""
    model = _CRD_MODELS.get((doc.get("apiVersion", ""), doc.get("kind", "")))
    if model is not None:
        _validate_model(model, doc, _name(doc))
        if doc["kind"] == "AlertmanagerConfig":
            # The CRD keeps sub-routes as free-form JSON (x-kubernetes-preserve-unknown-fields);
            # the operator reads each as a Route when it builds Alertmanager's configuration.
            for route in _subroutes(doc["spec"].get("route") or {}):
                _validate_model(monitoring_v1alpha1.Route, route, f"{_name(doc)}, a sub-route")
        return
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            raise InvalidManifestError(
                f"{_name(doc)} on {version}: {where}: {error.message}"
            ) from error
        except kubernetes_validate.SchemaNotFoundError as error:
            raise InvalidManifestError(
                f"{_name(doc)}: no schema knows it ({error.message})"
            ) from error


def _validate_model(model: type[pydantic.BaseModel], doc: dict[str, Any], what: str) -> None:
    try:
        model.model_validate(doc, extra="forbid", by_alias=True, by_name=False)
    except pydantic.ValidationError as error:
        raise InvalidManifestError(f"{what}: {error}") from error


def _subroutes(route: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for child in route.get("routes") or []:
        yield child
        yield from _subroutes(child)


def _name(doc: dict[str, Any]) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
