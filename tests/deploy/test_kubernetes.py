"""deploy/kubernetes/: every overlay renders with ``kubectl kustomize``, deterministically, into
manifests that validate offline against Kubernetes' and the Prometheus Operator's schemas; the
generated files equal a fresh generation; the service account may do exactly what the
Kubernetes executor does; the routing, scrapes and settings agree with the compose stack's.

Nothing here runs on a cluster: the manifests are checked at their boundary only.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3
import yaml
from kubernetes import client

from tests.deploy.kube import (
    KUBERNETES,
    OVERLAYS,
    InvalidManifestError,
    find,
    kustomize,
    load_all,
    objects,
    validate,
)
from tests.deploy.stack import REPO, binary
from trainguard import contract
from trainguard.alerts.kubernetes import render_prometheus_rule
from trainguard.alerts.rules import render
from trainguard.cli import main
from trainguard.contract import Action
from trainguard.dashboards.build import render_all
from trainguard.dashboards.kubernetes import configmap_name, render_configmaps
from trainguard.remediation.executors import ActionRecord
from trainguard.remediation.executors.kubernetes import KubernetesExecutor
from trainguard.remediation.settings import ConfigurationError, Settings
from trainguard.thresholds import Thresholds, default_path

ALERTS = REPO / "trainguard" / "alerts"
PODMONITORS = KUBERNETES / "operator" / "podmonitors.yaml"
AMC_FILE = KUBERNETES / "operator" / "alertmanagerconfig.yaml"
EXAMPLE_JOB = KUBERNETES / "examples" / "training-job.yaml"
PLAIN = "prometheus"
OPERATOR = "prometheus-operator"
SERVICE_ACCOUNT = ("trainguard", "trainguard-remediation")
TRAINING_NAMESPACE = "training"

# What kustomize v2.0.3 (kubectl 1.20, Debian bookworm's kubernetes-client) knows; the
# kustomizations keep to it so that .ci/run's fallback kubectl renders them too.
KUSTOMIZE_V2_FIELDS = {
    "bases",
    "resources",
    "namespace",
    "images",
    "patchesStrategicMerge",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
}


def kustomizations() -> list[Path]:
    return sorted(KUBERNETES.rglob("kustomization.yaml"))


# --- rendering -------------------------------------------------------------------------------


def test_there_is_an_overlay_for_the_operator_and_one_for_plain_prometheus() -> None:
    assert set(OVERLAYS) == {OPERATOR, PLAIN}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendering_is_deterministic(overlay: str) -> None:
    first = kustomize(KUBERNETES / "overlays" / overlay)
    assert first == kustomize(KUBERNETES / "overlays" / overlay)
    docs = load_all(first)
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "an object is rendered twice"


def test_kustomizations_keep_to_what_kustomize_v2_renders() -> None:
    for path in kustomizations():
        data = yaml.safe_load(path.read_text())
        assert set(data) <= KUSTOMIZE_V2_FIELDS, f"{path}: {set(data) - KUSTOMIZE_V2_FIELDS}"
        for entry in data.get("resources", []):
            assert (path.parent / entry).is_file(), f"{path}: {entry} (v2 takes files only)"
        for entry in data.get("bases", []):
            assert (path.parent / entry / "kustomization.yaml").is_file(), f"{path}: {entry}"


# --- offline validation ----------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_manifest_validates_strictly(overlay: str) -> None:
    docs = objects(overlay)
    assert docs
    for doc in docs:
        validate(doc)


def test_the_example_training_job_validates_strictly() -> None:
    for doc in load_all(EXAMPLE_JOB.read_text()):
        validate(doc)


def _broken(overlay: str, kind: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(find(objects(overlay), kind, name))


def _rejected(doc: dict[str, Any], why: str) -> None:
    with pytest.raises(InvalidManifestError, match=why):
        validate(doc)


def test_validation_rejects_an_unknown_field_in_a_core_kind() -> None:
    deployment = _broken(OPERATOR, "Deployment", "trainguard-remediation")
    deployment["spec"]["template"]["spec"]["containers"][0]["envFrom_typo"] = []
    _rejected(deployment, "envFrom_typo")


def test_validation_rejects_a_wrong_type_in_a_core_kind() -> None:
    deployment = _broken(OPERATOR, "Deployment", "trainguard-remediation")
    deployment["spec"]["replicas"] = "2"
    _rejected(deployment, "replicas")


def test_validation_rejects_an_unknown_field_in_a_podmonitor() -> None:
    monitor = _broken(OPERATOR, "PodMonitor", "trainguard-ranks")
    monitor["spec"]["podMetricsEndpoints"][0]["honor_labels"] = True
    _rejected(monitor, "honor_labels")


def test_validation_rejects_a_wrong_type_in_a_prometheusrule() -> None:
    rule = _broken(OPERATOR, "PrometheusRule", "trainguard")
    rule["spec"]["groups"][0]["rules"][0]["expr"] = ["not", "a", "string"]
    _rejected(rule, "expr")


def test_validation_rejects_an_unknown_field_in_an_alertmanagerconfig_subroute() -> None:
    config = _broken(OPERATOR, "AlertmanagerConfig", "trainguard")
    config["spec"]["route"]["routes"][1]["contnue"] = True
    _rejected(config, "contnue")


def test_validation_rejects_a_bad_enum_in_an_alertmanagerconfig() -> None:
    config = _broken(OPERATOR, "AlertmanagerConfig", "trainguard")
    config["spec"]["inhibitRules"][0]["sourceMatch"][0]["matchType"] = "=="
    _rejected(config, "matchType")


def test_validation_rejects_a_kind_it_has_no_schema_for() -> None:
    _rejected(
        {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
        "no schema",
    )


# --- generated files -------------------------------------------------------------------------


def thresholds() -> Thresholds:
    return Thresholds.load(default_path())


def test_the_committed_prometheusrule_equals_a_fresh_generation() -> None:
    committed = (KUBERNETES / "operator" / "prometheusrule.yaml").read_text()
    assert committed == render_prometheus_rule(thresholds()), (
        "stale: trainguard rules --format prometheus-rule "
        "--out deploy/kubernetes/operator/prometheusrule.yaml"
    )


def test_the_plain_overlay_s_rules_equal_a_fresh_generation() -> None:
    committed = (KUBERNETES / "overlays" / PLAIN / "trainguard.rules.yml").read_text()
    assert committed == render(thresholds()), (
        "stale: trainguard rules --out deploy/kubernetes/overlays/prometheus/trainguard.rules.yml"
    )


def test_the_committed_dashboard_configmaps_equal_a_fresh_generation() -> None:
    committed = (KUBERNETES / "base" / "dashboards.yaml").read_text()
    assert committed == render_configmaps(thresholds()), (
        "stale: trainguard dashboards --configmaps deploy/kubernetes/base/dashboards.yaml"
    )


def test_the_cli_checks_the_generated_files(tmp_path: Path) -> None:
    rule = KUBERNETES / "operator" / "prometheusrule.yaml"
    dashboards = KUBERNETES / "base" / "dashboards.yaml"

    def cli(*args: str | Path) -> int:
        return main([str(arg) for arg in args])

    assert cli("rules", "--format", "prometheus-rule", "--out", rule, "--check") == 0
    assert cli("dashboards", "--configmaps", dashboards, "--check") == 0
    stale = tmp_path / "stale.yaml"
    stale.write_text("# old\n")
    assert cli("rules", "--format", "prometheus-rule", "--out", stale, "--check") == 1
    assert cli("dashboards", "--configmaps", stale, "--check") == 1
    assert cli("rules", "--format", "prometheus-rule") == 2  # no --out: refused
    written = tmp_path / "rule.yaml"
    assert cli("rules", "--format", "prometheus-rule", "--out", written) == 0
    assert written.read_text() == rule.read_text()


def test_the_prometheusrule_holds_the_groups_of_the_rules_file() -> None:
    rule = find(objects(OPERATOR), "PrometheusRule", "trainguard")
    rules_file = yaml.safe_load((ALERTS / "trainguard.rules.yml").read_text())
    assert rule["spec"]["groups"] == rules_file["groups"]


def test_promtool_checks_the_rendered_prometheusrule(tmp_path: Path) -> None:
    rule = find(objects(OPERATOR), "PrometheusRule", "trainguard")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run(
        [binary("promtool", "Debian: prometheus"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_dashboard_is_a_sidecar_configmap_holding_the_dashboards_json() -> None:
    docs = objects(OPERATOR)
    files = render_all(thresholds())
    for name, text in files.items():
        configmap = find(docs, "ConfigMap", configmap_name(name))
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["data"] == {name: text}
        assert text == (REPO / "trainguard" / "dashboards" / name).read_text()
        # kubectl apply keeps the whole object in an annotation limited to 256 KiB.
        assert len(json.dumps(configmap)) < 256 * 1024


def _datasource_uids(value: Any) -> set[str]:
    """The datasource uids a dashboard's panels and targets name (Grafana's own left out)."""
    found: set[str] = set()
    if isinstance(value, dict):
        source = value.get("datasource")
        if isinstance(source, dict) and source.get("uid") not in (None, "-- Grafana --", "grafana"):
            found.add(source["uid"])
        for item in value.values():
            found |= _datasource_uids(item)
    elif isinstance(value, list):
        for item in value:
            found |= _datasource_uids(item)
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_datasource_the_dashboards_name_is_provisioned_for_the_sidecar(overlay: str) -> None:
    configmap = find(objects(overlay), "ConfigMap", "trainguard-grafana-datasource")
    assert configmap["metadata"]["labels"]["grafana_datasource"] == "1"
    (text,) = configmap["data"].values()
    (source,) = yaml.safe_load(text)["datasources"]
    used = set().union(
        *(_datasource_uids(json.loads(t)) for t in render_all(thresholds()).values())
    )
    assert used == {source["uid"]}
    # The Prometheus this overlay's remediation service queries, too.
    (container,) = remediation_pod(overlay)["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert source["url"] == env["TRAINGUARD_REMEDIATION_PROMETHEUS_URL"]


# --- the node exporter -----------------------------------------------------------------------


def exporter_pod(overlay: str = OPERATOR) -> dict[str, Any]:
    daemonset = find(objects(overlay), "DaemonSet", "trainguard-exporter")
    pod: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return pod


def test_the_exporter_runs_on_every_gpu_node_with_nvml_and_the_host_pids() -> None:
    pod = exporter_pod()
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    # It reads GPUs, it does not take one from training.
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert container["resources"]["requests"] and container["resources"]["limits"]


def test_the_exporter_is_root_without_privileges_on_a_read_only_root() -> None:
    (container,) = exporter_pod()["containers"]
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}


def test_the_exporter_mounts_the_pod_resources_socket_and_the_nccl_logs_read_only() -> None:
    pod = exporter_pod()
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = {e["name"]: e["value"] for e in container["env"]}
    socket = Path(env[contract.ENV_POD_RESOURCES_SOCKET])
    assert socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    mount = mounts[str(socket.parent)]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    # The NCCL collector follows the glob it is given, in the folder the ranks write to.
    glob = container["args"][container["args"].index("--nccl.log-glob") + 1]
    nccl = mounts[str(Path(glob).parent)]
    assert nccl["readOnly"] is True
    assert volumes[nccl["name"]]["hostPath"]["path"] == "/var/log/nccl"
    job = load_all(EXAMPLE_JOB.read_text())[0]["spec"]["template"]["spec"]
    nccl_file = {e["name"]: e.get("value") for e in job["containers"][0]["env"]}["NCCL_DEBUG_FILE"]
    assert Path(nccl_file).parent == Path(glob).parent
    assert {v["hostPath"]["path"] for v in job["volumes"]} == {"/var/log/nccl"}


# --- scrapes ---------------------------------------------------------------------------------


def _snake(relabel: dict[str, Any]) -> dict[str, Any]:
    """A PodMonitor relabeling as Prometheus' relabel_config."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(key, key): value for key, value in relabel.items()}


def _selection(monitor: dict[str, Any], endpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The relabel rules a PodMonitor's selector and port stand for (its operator generates
    them), in the plain configuration's spelling."""
    keep: list[dict[str, Any]] = []
    selector = monitor["spec"]["selector"]
    for label, value in selector.get("matchLabels", {}).items():
        keep.append(
            {
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_pod_label_{_meta(label)}"],
                "regex": value,
            }
        )
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "Exists"
        keep.append(
            {
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_pod_labelpresent_{_meta(expression['key'])}"],
                "regex": "true",
            }
        )
    keep.append(
        {
            "action": "drop",
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "Failed|Succeeded",
        }
    )
    if "port" in endpoint:
        keep.append(
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": endpoint["port"],
            }
        )
    return keep


def _meta(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _job_of(relabelings: list[dict[str, Any]]) -> str:
    (job,) = [r["replacement"] for r in relabelings if r.get("targetLabel") == "job"]
    return str(job)


def plain_prometheus_files() -> dict[str, str]:
    configmap = find(objects(PLAIN), "ConfigMap", "trainguard-prometheus")
    assert configmap["metadata"]["namespace"] == "monitoring"
    data: dict[str, str] = configmap["data"]
    return data


def test_the_plain_configuration_scrapes_as_the_podmonitors_do() -> None:
    config = yaml.safe_load(plain_prometheus_files()["prometheus.yml"])
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    monitors = [d for d in load_all(PODMONITORS.read_text())]
    assert {_job_of(m["spec"]["podMetricsEndpoints"][0]["relabelings"]) for m in monitors} == {
        contract.SCRAPE_JOB_RANKS,
        contract.SCRAPE_JOB_EXPORTER,
        contract.SCRAPE_JOB_REMEDIATION,
    }
    for monitor in monitors:
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        job = jobs[_job_of(endpoint["relabelings"])]
        expected = _selection(monitor, endpoint) + [_snake(r) for r in endpoint["relabelings"]]
        assert job["relabel_configs"] == expected, job["job_name"]
        assert job.get("honor_labels", False) == endpoint.get("honorLabels", False)
        assert job.get("scrape_interval") == endpoint.get("interval")
        assert job["metrics_path"] == endpoint["path"]
        (sd,) = job["kubernetes_sd_configs"]
        assert sd["role"] == "pod"
        if monitor["spec"].get("namespaceSelector", {}).get("any"):
            assert "namespaces" not in sd
        else:
            # A PodMonitor without a namespaceSelector watches its own namespace.
            assert sd["namespaces"]["names"] == ["trainguard"]


def test_rank_targets_carry_the_identity_the_rules_join_on() -> None:
    """The relabelings set job_id, rank, local_rank and node on every rank target, and the
    example job's pods match them: its label, its ports, its node."""
    (monitor,) = [
        d for d in load_all(PODMONITORS.read_text()) if d["metadata"]["name"] == "trainguard-ranks"
    ]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True
    targets = {r.get("targetLabel") for r in endpoint["relabelings"]}
    assert set(contract.RANK_IDENTITY_LABELS) <= targets
    assert contract.LABEL_LOCAL_RANK in targets
    keep = endpoint["relabelings"][0]
    template = load_all(EXAMPLE_JOB.read_text())[0]["spec"]["template"]
    ports = template["spec"]["containers"][0]["ports"]
    for port in ports:
        assert re.fullmatch(keep["regex"], port["name"])
        assert port["containerPort"] == 9400 + int(port["name"].rsplit("-", 1)[1])
    label = Settings.model_fields["kube_job_label"].default
    assert label in template["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchExpressions"] == [{"key": label, "operator": "Exists"}]


def test_promtool_checks_the_plain_configuration_with_its_rules(tmp_path: Path) -> None:
    """Debian's Prometheus (2.42) is built without Kubernetes discovery: its promtool refuses
    ``kubernetes_sd_configs`` as an unknown field. So each job's discovery block is checked for
    its shape here and swapped for a static target, and promtool checks the rest: the
    relabelling, the jobs, the rule file beside it."""
    files = plain_prometheus_files()
    config = yaml.safe_load(files["prometheus.yml"])
    for job in config["scrape_configs"]:
        if "kubernetes_sd_configs" not in job:
            continue
        (sd,) = job.pop("kubernetes_sd_configs")
        assert set(sd) <= {"role", "namespaces"} and sd["role"] == "pod", job["job_name"]
        assert set(sd.get("namespaces", {})) <= {"names"}
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "trainguard.rules.yml").write_text(files["trainguard.rules.yml"])
    done = subprocess.run(
        [binary("promtool", "Debian: prometheus"), "check", "config", "prometheus.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trainguard.rules.yml" in done.stdout  # the rules were found and checked too


def test_podmonitors_scrape_the_ports_the_pods_declare() -> None:
    docs = objects(OPERATOR)
    for kind, name, port in (
        ("DaemonSet", "trainguard-exporter", "metrics"),
        ("Deployment", "trainguard-remediation", "http"),
    ):
        template = find(docs, kind, name)["spec"]["template"]
        monitor = find(docs, "PodMonitor", name)
        assert monitor["spec"]["selector"]["matchLabels"].items() <= (
            template["metadata"]["labels"].items()
        )
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == port
        assert port in {p["name"] for p in template["spec"]["containers"][0]["ports"]}


# --- Alertmanager ----------------------------------------------------------------------------

_MATCHER = re.compile(r'^\s*(\w+)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')


def _amc_matchers(matchers: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(m["name"], m.get("matchType", "="), m["value"]) for m in matchers]


def _am_matchers(matchers: list[str]) -> list[tuple[str, str, str]]:
    parsed = [_MATCHER.match(m) for m in matchers]
    assert all(parsed), matchers
    return [(m.group(1), m.group(2), m.group(3)) for m in parsed if m]


def _amc_route(route: dict[str, Any]) -> dict[str, Any]:
    """An AlertmanagerConfig route in alertmanager.yml's spelling."""
    keys = {
        "groupBy": "group_by",
        "groupWait": "group_wait",
        "groupInterval": "group_interval",
        "repeatInterval": "repeat_interval",
        "continue": "continue",
        "receiver": "receiver",
    }
    out = {keys[k]: v for k, v in route.items() if k in keys}
    if "matchers" in route:
        out["matchers"] = [f'{n} {op} "{v}"' for n, op, v in _amc_matchers(route["matchers"])]
    if "routes" in route:
        out["routes"] = [_amc_route(r) for r in route["routes"]]
    return out


def _normalised(route: dict[str, Any]) -> dict[str, Any]:
    out = dict(route)
    if "matchers" in out:
        out["matchers"] = _am_matchers(out["matchers"])
    if "routes" in out:
        out["routes"] = [_normalised(r) for r in out["routes"]]
    return out


def _amc_inhibitions(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "source": _amc_matchers(rule["sourceMatch"]),
            "target": _amc_matchers(rule["targetMatch"]),
            "equal": rule["equal"],
        }
        for rule in config["spec"]["inhibitRules"]
    ]


def compose_alertmanager() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ALERTS / "alertmanager.yml").read_text())
    return data


def test_the_alertmanagerconfig_routes_as_the_compose_alertmanager_does() -> None:
    config = find(objects(OPERATOR), "AlertmanagerConfig", "trainguard")
    reference = compose_alertmanager()
    assert _normalised(_amc_route(config["spec"]["route"])) == _normalised(reference["route"])
    assert _amc_inhibitions(config) == [
        {
            "source": _am_matchers(rule["source_matchers"]),
            "target": _am_matchers(rule["target_matchers"]),
            "equal": rule["equal"],
        }
        for rule in reference["inhibit_rules"]
    ]
    receivers = {r["name"]: r for r in config["spec"]["receivers"]}
    assert set(receivers) == {r["name"] for r in reference["receivers"]}
    assert set(receivers["pager"]) == {"name", "pagerdutyConfigs", "slackConfigs"}
    assert set(receivers["chat"]) == {"name", "slackConfigs"}


def test_the_webhook_reaches_the_remediation_service_with_its_token() -> None:
    docs = objects(OPERATOR)
    config = find(docs, "AlertmanagerConfig", "trainguard")
    (remediation,) = [r for r in config["spec"]["receivers"] if r["name"] == "remediation"]
    (webhook,) = remediation["webhookConfigs"]
    url = urlsplit(webhook["url"])
    service = find(docs, "Service", "trainguard-remediation")
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]
    assert url.path == "/v1/alertmanager"
    assert webhook["sendResolved"] is True
    credentials = webhook["httpConfig"]["authorization"]["credentials"]
    deployment = find(docs, "Deployment", "trainguard-remediation")
    pod = deployment["spec"]["template"]["spec"]
    (tokens,) = [v for v in pod["volumes"] if "secret" in v]
    assert credentials["name"] == tokens["secret"]["secretName"]
    secret = find(docs, "Secret", credentials["name"])
    assert credentials["key"] in secret["stringData"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert Path(env["TRAINGUARD_REMEDIATION_TOKEN_FILE"]).name == credentials["key"]


def _amtool_config(tmp_path: Path) -> Path:
    config = find(objects(OPERATOR), "AlertmanagerConfig", "trainguard")
    document = {
        "route": _amc_route(config["spec"]["route"]),
        "receivers": [
            {"name": r["name"], "webhook_configs": [{"url": "http://127.0.0.1:9/"}]}
            for r in config["spec"]["receivers"]
        ],
    }
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_amtool_routes_the_services_own_page_to_people_only(tmp_path: Path) -> None:
    path = _amtool_config(tmp_path)
    amtool = binary("amtool", "Debian: prometheus-alertmanager")

    def routes(*labels: str) -> set[str]:
        done = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={path}", *labels],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return set(done.stdout.strip().split(","))

    for severity in ("critical", "warning"):
        assert routes(
            "alertname=TrainguardRemediationFailed", f"severity={severity}", "job_id=j"
        ) == {"pager"}
    assert routes("alertname=TrainingStalled", "severity=critical", "job_id=j") == {
        "remediation",
        "pager",
    }
    assert routes("alertname=GpuThermalThrottling", "severity=warning") == {"remediation", "chat"}
    assert routes("alertname=NodeDiskFull", "severity=critical") == {"pager"}


# --- the remediation service -----------------------------------------------------------------


def remediation_pod(overlay: str) -> dict[str, Any]:
    deployment = find(objects(overlay), "Deployment", "trainguard-remediation")
    assert deployment["spec"]["replicas"] == 2
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_settings_load_from_the_deployment(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (container,) = remediation_pod(overlay)["containers"]
    fields = {f"TRAINGUARD_REMEDIATION_{name.upper()}" for name in Settings.model_fields}
    for item in container["env"]:
        assert item["name"] in fields, f"{item['name']} is no setting"
        value = item.get("value", "postgresql://u:p@db:5432/trainguard")
        monkeypatch.setenv(item["name"], value)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.default_scheduler == contract.SCHEDULER_KUBERNETES
    assert settings.kube_namespace == TRAINING_NAMESPACE
    assert isinstance(settings.database(), str)  # Postgres: the replicas share it
    for url in (settings.prometheus_url, settings.alertmanager_url):
        assert url is not None and url.startswith("http://") and ".monitoring.svc:" in url


def test_the_database_url_comes_from_the_postgres_secret() -> None:
    docs = objects(OPERATOR)
    (container,) = remediation_pod(OPERATOR)["containers"]
    (database,) = [e for e in container["env"] if e["name"].endswith("_DATABASE_URL")]
    ref = database["valueFrom"]["secretKeyRef"]
    assert ref["key"] in find(docs, "Secret", ref["name"])["stringData"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_value_is_committed(overlay: str) -> None:
    for doc in objects(overlay):
        if doc["kind"] == "Secret":
            assert "data" not in doc
            assert set(doc["stringData"].values()) == {""}, doc["metadata"]["name"]


def test_the_service_refuses_the_placeholder_token(tmp_path: Path) -> None:
    placeholder = find(objects(OPERATOR), "Secret", "trainguard-remediation-tokens")
    path = tmp_path / "remediation-token"
    path.write_text(placeholder["stringData"]["remediation-token"])
    with pytest.raises(ConfigurationError, match="empty"):
        Settings(_env_file=None, token_file=path).bearer_token()  # type: ignore[call-arg]


def test_an_overlay_of_the_user_s_replaces_the_placeholders_and_the_image(tmp_path: Path) -> None:
    """The documented way to give real values: a secretGenerator with behavior replace, and
    the registry's image through `images`."""
    (tmp_path / "remediation-token").write_text("webhook-token\n")
    (tmp_path / "remediation-operator-token").write_text("operator-token\n")
    base = os.path.relpath(KUBERNETES / "overlays" / OPERATOR, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "bases": [base],
                "images": [
                    {
                        "name": "trainguard/remediation",
                        "newName": "registry.example.com/trainguard/remediation",
                        "newTag": "0.1.1",
                    }
                ],
                "generatorOptions": {"disableNameSuffixHash": True},
                "secretGenerator": [
                    {
                        "name": "trainguard-remediation-tokens",
                        "namespace": "trainguard",
                        "behavior": "replace",
                        "files": ["remediation-token", "remediation-operator-token"],
                    }
                ],
            }
        )
    )
    docs = load_all(kustomize(tmp_path))
    secret = find(docs, "Secret", "trainguard-remediation-tokens")
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert values == {
        "remediation-token": "webhook-token\n",
        "remediation-operator-token": "operator-token\n",
    }
    deployment = find(docs, "Deployment", "trainguard-remediation")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/trainguard/remediation:0.1.1"


def test_the_remediation_pods_run_unprivileged_on_a_read_only_root() -> None:
    pod = remediation_pod(OPERATOR)
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT[1]


def test_the_networkpolicy_admits_alertmanager_prometheus_and_the_ranks() -> None:
    docs = objects(OPERATOR)
    policy = find(docs, "NetworkPolicy", "trainguard-remediation")["spec"]
    template = find(docs, "Deployment", "trainguard-remediation")["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    sources = [(peer, rule["ports"]) for rule in policy["ingress"] for peer in rule["from"]]
    namespaces = {
        p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p, _ in sources
    }
    assert namespaces == {"monitoring", TRAINING_NAMESPACE}
    for _, ports in sources:
        assert ports == [{"port": "http", "protocol": "TCP"}]
    # The example job's pods, in the training namespace, are admitted.
    job = load_all(EXAMPLE_JOB.read_text())[0]
    (ranks,) = [p for p, _ in sources if "trainguard.io/job-id" in str(p)]
    assert job["metadata"]["namespace"] == TRAINING_NAMESPACE
    (expression,) = ranks["podSelector"]["matchExpressions"]
    assert expression["key"] in job["spec"]["template"]["metadata"]["labels"]
    egress_ports = {p["port"] for rule in policy["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 9090, 9093, 5432, 443, 6443}


def test_the_example_job_reaches_the_remediation_service() -> None:
    docs = objects(OPERATOR)
    service = find(docs, "Service", "trainguard-remediation")
    job = load_all(EXAMPLE_JOB.read_text())[0]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    url = urlsplit(env[contract.ENV_REMEDIATION_URL]["value"])
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]
    label = Settings.model_fields["kube_job_label"].default
    assert env[contract.ENV_JOB_ID]["valueFrom"]["fieldRef"]["fieldPath"] == (
        f"metadata.labels['{label}']"
    )
    assert env[contract.ENV_NODE]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


# --- RBAC against what the executor calls ----------------------------------------------------


class RecordingPoolManager(urllib3.PoolManager):
    """urllib3's pool manager under the official client, cut off where it would open a
    connection: records the method and path of every request the client encoded and answers as
    an API server would, without a network."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []

    # PoolManager.urlopen's own signature, which differs from its base class's.
    def urlopen(  # type: ignore[override]
        self, method: str, url: str, redirect: bool = True, **kw: Any
    ) -> urllib3.BaseHTTPResponse:
        parts = urlsplit(url)
        self.requests.append((method, parts.path, parse_qs(parts.query)))
        if method == "GET":
            body: dict[str, Any] = {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {},
                "items": [
                    {"metadata": {"name": f"train-{i}", "uid": f"uid-{i}"}} for i in range(2)
                ],
            }
        else:
            kind = "Node" if "/nodes/" in parts.path else "Pod"
            name = parts.path.rsplit("/", 1)[1]
            body = {"kind": kind, "apiVersion": "v1", "metadata": {"name": name}}
        return urllib3.HTTPResponse(
            body=json.dumps(body).encode(),
            status=200,
            headers={"Content-Type": "application/json"},
            preload_content=False,
        )


Access = tuple[str, str, str, str]  # apiGroup, resource, subresource, verb


def access_of(method: str, path: str, query: dict[str, list[str]]) -> tuple[Access, str | None]:
    """What an API request asks the authorizer for, and in which namespace (None: cluster)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        assert parts[0] == "apis", path
        group, rest = parts[1], parts[3:]
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else ""
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch") == ["true"] else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return (group, resource, subresource, verb), namespace


def granted(docs: list[dict[str, Any]]) -> dict[Access, set[str]]:
    """What the remediation service account may do: each access -> the namespaces it holds in
    ("*" for every namespace and cluster-scoped objects)."""
    namespace, name = SERVICE_ACCOUNT
    out: dict[Access, set[str]] = {}
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if {"kind": "ServiceAccount", "name": name, "namespace": namespace} not in binding[
            "subjects"
        ]:
            continue
        ref = binding["roleRef"]
        scope = (
            binding["metadata"].get("namespace", "*") if binding["kind"] == "RoleBinding" else "*"
        )
        role_namespace = None if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        (role,) = [
            d
            for d in docs
            if d["kind"] == ref["kind"]
            and d["metadata"]["name"] == ref["name"]
            and d["metadata"].get("namespace") == role_namespace
        ]
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    base, _, subresource = resource.partition("/")
                    for verb in rule["verbs"]:
                        out.setdefault((group, base, subresource, verb), set()).add(scope)
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_exactly_what_the_kubernetes_executor_calls(overlay: str) -> None:
    recorder = RecordingPoolManager()

    def api_client() -> client.ApiClient:
        configuration = client.Configuration()
        configuration.host = "https://kubernetes.invalid"
        api = client.ApiClient(configuration)
        api.rest_client.pool_manager = recorder
        return api

    executor = KubernetesExecutor(api_client, namespace="default")
    for number, action in enumerate(sorted(executor.actions, key=lambda a: a.value)):
        record = ActionRecord(
            id=number,
            action=action,
            executor="kubernetes",
            subject="llama-7b-run3",
            params={},
            alertname="TrainingStraggler",
            labels={
                contract.LABEL_JOB_ID: "llama-7b-run3",
                contract.LABEL_NAMESPACE: TRAINING_NAMESPACE,
                contract.LABEL_NODE: "gpu-node-1",
            },
        )
        executor.execute(record, executor.prepare(record))
    assert executor.actions == {
        Action.RESTART_FROM_CHECKPOINT,
        Action.EXCLUDE_NODE,
        Action.DRAIN_NODE,
        Action.ANNOTATE,
    }
    called: dict[Access, set[str | None]] = {}
    for method, path, query in recorder.requests:
        access, namespace = access_of(method, path, query)
        called.setdefault(access, set()).add(namespace)
    grants = granted(objects(overlay))
    # Nothing missing, nothing extra.
    assert set(grants) == set(called)
    for access, namespaces in called.items():
        for namespace in namespaces:
            scopes = grants[access]
            if namespace is None:
                assert scopes == {"*"}, f"{access}: cluster-scoped needs a ClusterRoleBinding"
            else:
                # Pods are granted in the training namespace only, never cluster-wide.
                assert scopes == {namespace}, f"{access} in {namespace}: {scopes}"
