"""The files the compose stack mounts pass their own checkers, and their service names and
ports agree with docker-compose.yml."""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from tests.deploy.stack import (
    DEPLOY,
    REPO,
    binary,
    binds,
    default,
    environment,
    host_file,
    host_port,
    named_volumes,
    published_port,
    run,
    secret_file,
    secret_targets,
    services,
)
from trainguard import contract


def load(path: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def flag(service: str, name: str) -> str:
    """The value of ``--name=value`` in a service's command."""
    for part in services()[service]["command"]:
        if str(part).startswith(f"{name}="):
            return str(part).split("=", 1)[1]
    raise AssertionError(f"{service}: no {name}")


# --- Prometheus ------------------------------------------------------------------------------


def prometheus_config_path() -> PurePosixPath:
    return PurePosixPath(flag("prometheus", "--config.file"))


def prometheus_config() -> dict[str, Any]:
    return load(host_file("prometheus", prometheus_config_path()))


def test_prometheus_runs_the_repository_config_with_exemplar_storage() -> None:
    assert host_file("prometheus", prometheus_config_path()) == DEPLOY / "prometheus.yml"
    assert "--enable-feature=exemplar-storage" in services()["prometheus"]["command"]


def test_prometheus_rule_files_resolve_to_our_rules_inside_the_container() -> None:
    for rule_file in prometheus_config()["rule_files"]:
        in_container = PurePosixPath(
            *prometheus_config_path().parent.parts, *PurePosixPath(rule_file).parts
        )
        # Normalise "deploy/../alerts" the way Prometheus resolves it.
        parts: list[str] = []
        for part in in_container.parts:
            if part == "..":
                parts.pop()
            else:
                parts.append(part)
        assert host_file("prometheus", PurePosixPath(*parts)) == (
            REPO / "trainguard" / "alerts" / "trainguard.rules.yml"
        )


def test_promtool_checks_the_mounted_config_and_rules() -> None:
    promtool = binary("promtool", "Debian: prometheus")
    config = host_file("prometheus", prometheus_config_path())
    result = run(promtool, "check", "config", config)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = host_file("prometheus", "/etc/trainguard/trainguard/alerts/trainguard.rules.yml")
    result = run(promtool, "check", "rules", rules)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ranks_file_sd_is_the_volume_the_trainer_writes() -> None:
    ranks = next(
        job
        for job in prometheus_config()["scrape_configs"]
        if job["job_name"] == contract.SCRAPE_JOB_RANKS
    )
    (sd,) = ranks["file_sd_configs"]
    sd_dir = PurePosixPath(environment("trainer")[contract.ENV_FILE_SD_DIR])
    assert all(PurePosixPath(pattern).parent == sd_dir for pattern in sd["files"])
    volume = next(v for v, path in named_volumes("trainer").items() if path == sd_dir)
    assert named_volumes("prometheus")[volume] == sd_dir


def static_targets() -> dict[str, list[str]]:
    return {
        job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]]
        for job in prometheus_config()["scrape_configs"]
    }


def test_prometheus_static_targets_are_compose_services_on_their_ports() -> None:
    from trainguard.exporters.app import DEFAULT_LISTEN_ADDRESS

    targets = static_targets()
    (exporter,) = targets[contract.SCRAPE_JOB_EXPORTER]
    assert host_port(exporter) == ("exporter", int(DEFAULT_LISTEN_ADDRESS.rsplit(":", 1)[1]))
    assert "--web.listen-address" not in services()["exporter"]["command"]
    (remediation,) = targets[contract.SCRAPE_JOB_REMEDIATION]
    assert host_port(remediation) == (
        "remediation",
        int(environment("remediation")["TRAINGUARD_REMEDIATION_PORT"]),
    )
    (alertmanager,) = prometheus_config()["alerting"]["alertmanagers"][0]["static_configs"][0][
        "targets"
    ]
    assert host_port(alertmanager) == ("alertmanager", 9093)
    assert published_port("alertmanager", 9093) and published_port("prometheus", 9090)


def derived_node(address: str) -> str:
    """The node label deploy/prometheus.yml's relabelling gives an exporter target without
    a node label of its own."""
    exporter = next(
        job
        for job in prometheus_config()["scrape_configs"]
        if job["job_name"] == contract.SCRAPE_JOB_EXPORTER
    )
    first = exporter["relabel_configs"][0]
    match = re.fullmatch(first["regex"], address)
    assert match is not None
    return match.expand(first.get("replacement", "$1").replace("$", "\\"))


def test_ranks_and_gpus_carry_the_same_node_label() -> None:
    (exporter,) = static_targets()[contract.SCRAPE_JOB_EXPORTER]
    node = derived_node(exporter)
    trainer = services()["trainer"]
    assert environment("trainer")[contract.ENV_NODE] == node
    # The ranks advertise their host name (inherited from the exporter's network namespace),
    # which must be a name Prometheus resolves to them.
    assert trainer["network_mode"] == "service:exporter"
    assert services()["exporter"]["hostname"] == host_port(exporter)[0]
    # Same PID namespace: the exporter sees the ranks, remediation signals them.
    assert trainer["pid"] == "service:exporter"
    assert services()["remediation"]["pid"] == "service:exporter"


# --- Alertmanager ----------------------------------------------------------------------------


def alertmanager_config_path() -> PurePosixPath:
    return PurePosixPath(flag("alertmanager", "--config.file"))


def alertmanager_config() -> dict[str, Any]:
    return load(host_file("alertmanager", alertmanager_config_path()))


def test_amtool_checks_the_mounted_config() -> None:
    amtool = binary("amtool", "Debian: prometheus-alertmanager")
    config = host_file("alertmanager", alertmanager_config_path())
    result = run(amtool, "check-config", config)
    assert result.returncode == 0, result.stdout + result.stderr
    # Its templates resolve next to the config inside the container.
    for template in alertmanager_config()["templates"]:
        assert host_file("alertmanager", alertmanager_config_path().parent / template).is_file()


def walk(node: Any) -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def test_alertmanager_secret_files_are_mounted_secrets() -> None:
    mounted = secret_targets("alertmanager")
    files = [v for k, v in walk(alertmanager_config()) if str(k).endswith("_file")]
    assert files
    for path in files:
        assert PurePosixPath(path) in mounted, f"{path} is not a secret of the alertmanager"


def test_alertmanager_webhook_reaches_the_remediation_service_with_its_token() -> None:
    (receiver,) = [r for r in alertmanager_config()["receivers"] if r["name"] == "remediation"]
    (hook,) = receiver["webhook_configs"]
    assert host_port(hook["url"]) == (
        "remediation",
        int(environment("remediation")["TRAINGUARD_REMEDIATION_PORT"]),
    )
    token_path = PurePosixPath(hook["http_config"]["authorization"]["credentials_file"])
    service_token = PurePosixPath(environment("remediation")["TRAINGUARD_REMEDIATION_TOKEN_FILE"])
    # Both read the same secret.
    assert (
        secret_targets("alertmanager")[token_path] == secret_targets("remediation")[service_token]
    )


# --- Grafana ---------------------------------------------------------------------------------

PROVISIONING = PurePosixPath("/etc/grafana/provisioning")


def grafana_datasources() -> list[dict[str, Any]]:
    folder = host_file("grafana", PROVISIONING / "datasources")
    sources: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.yml")):
        data = load(path)
        assert data["apiVersion"] == 1, path
        sources.extend(data["datasources"])
    return sources


def test_grafana_datasources_have_the_provisioning_shape() -> None:
    sources = grafana_datasources()
    assert {s["type"] for s in sources} == {"prometheus", "jaeger", "elasticsearch"}
    for source in sources:
        assert {"name", "type", "uid", "url", "access"} <= set(source), source
        assert source["access"] == "proxy"
    assert len({s["uid"] for s in sources}) == len(sources)


def test_grafana_datasource_urls_are_compose_services_on_their_ports() -> None:
    ports = {"prometheus": 9090, "jaeger": 16686, "elasticsearch": 9200}
    for source in grafana_datasources():
        host, port = host_port(source["url"])
        assert (host, port) == (source["type"], ports[source["type"]]), source["url"]
        assert published_port(host, port)


def test_grafana_exemplars_link_to_jaeger() -> None:
    sources = {s["type"]: s for s in grafana_datasources()}
    (destination,) = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert destination["datasourceUid"] == sources["jaeger"]["uid"]
    assert destination["name"] == contract.EXEMPLAR_TRACE_ID


def test_grafana_logs_datasource_reads_trainguards_data_streams() -> None:
    sources = {s["type"]: s for s in grafana_datasources()}
    pattern = sources["elasticsearch"]["jsonData"]["index"]
    stream = f"{contract.LOG_DATA_STREAM_PREFIX}.rank-default"
    assert re.fullmatch(pattern.replace(".", r"\.").replace("*", ".*"), stream)


def test_grafana_provisions_the_mounted_dashboards() -> None:
    folder = host_file("grafana", PROVISIONING / "dashboards")
    (provider,) = load(next(folder.glob("*.yml")))["providers"]
    assert provider["type"] == "file"
    dashboards = host_file("grafana", provider["options"]["path"])
    assert dashboards == REPO / "trainguard" / "dashboards"
    uids = {s["uid"] for s in grafana_datasources()}
    found = sorted(dashboards.glob("*.json"))
    assert found
    for path in found:
        used = {
            v["uid"]
            for k, v in walk(json.loads(path.read_text()))
            if k == "datasource" and isinstance(v, dict) and "uid" in v
        }
        assert used <= uids | {"-- Grafana --", "grafana"}, f"{path.name}: {used - uids}"
    home = environment("grafana")["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert host_file("grafana", home).is_file()
    assert PurePosixPath(environment("grafana")["GF_SECURITY_ADMIN_PASSWORD__FILE"]) in (
        secret_targets("grafana")
    )


# --- traces: the trainer -> OpenTelemetry Collector -> Jaeger v2 -----------------------------


def collector_config() -> dict[str, Any]:
    return load(host_file("otel-collector", flag("otel-collector", "--config")))


def jaeger_config() -> dict[str, Any]:
    command = services()["jaeger"]["command"]
    return load(host_file("jaeger", command[command.index("--config") + 1]))


def check_pipeline_shape(config: dict[str, Any], name: str) -> None:
    """Every component a pipeline or the service names is defined, and every defined one
    is used: the collector refuses the first and silently ignores the second."""
    service = config["service"]
    used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
    for pipeline in service["pipelines"].values():
        for kind in used:
            used[kind] |= set(pipeline.get(kind, []))
    for kind, names in used.items():
        assert names == set(config.get(kind) or {}), f"{name}: {kind} {names}"
    assert set(service.get("extensions", [])) == set(config.get("extensions") or {}), name


def test_collector_config_has_the_collector_shape() -> None:
    config = collector_config()
    check_pipeline_shape(config, "otel-collector")
    assert set(config["service"]["pipelines"]) == {"traces"}


def test_trainer_sends_spans_to_the_collectors_otlp_http_receiver() -> None:
    host, port = host_port(environment("trainer")["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert host == "otel-collector"
    http = collector_config()["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert host_port(http)[1] == port == 4318


def test_collector_exports_to_jaegers_otlp_grpc_receiver() -> None:
    exporters = collector_config()["exporters"]
    (name,) = exporters
    # otlp_grpc is the OTLP/gRPC exporter's name since collector 0.144 (otlp is deprecated).
    assert name.split("/")[0] == "otlp_grpc"
    host, port = host_port(exporters[name]["endpoint"])
    assert host == "jaeger"
    grpc = jaeger_config()["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert host_port(grpc)[1] == port


def test_jaeger_config_stores_what_it_receives_and_serves_it() -> None:
    config = jaeger_config()
    check_pipeline_shape(config, "jaeger")
    backends = set(config["extensions"]["jaeger_storage"]["backends"])
    assert config["extensions"]["jaeger_query"]["storage"]["traces"] in backends
    assert config["exporters"]["jaeger_storage_exporter"]["trace_storage"] in backends
    # Grafana and the README use the query service's default port.
    assert "http" not in config["extensions"]["jaeger_query"]
    assert published_port("jaeger", 16686)


# --- logs: the trainer -> files -> Filebeat -> Elasticsearch <- Kibana -----------------------


def test_filebeat_reads_the_trainers_log_volume_and_writes_to_elasticsearch() -> None:
    config_path = PurePosixPath(services()["filebeat"]["command"][-1])
    config = load(host_file("filebeat", config_path))
    assert host_file("filebeat", config_path) == DEPLOY / "filebeat.yml"
    log_dir = PurePosixPath(environment("filebeat")["TRAINGUARD_LOG_DIR"])
    assert environment("trainer")["TRAINGUARD_LOG_DIR"] == str(log_dir)
    volume = next(v for v, path in named_volumes("trainer").items() if path == log_dir)
    assert named_volumes("filebeat")[volume] == log_dir
    (inp,) = config["filebeat.inputs"]
    assert all(p.startswith("${TRAINGUARD_LOG_DIR:") for p in inp["paths"])
    (hosts,) = config["output.elasticsearch"]["hosts"]
    fallback = re.fullmatch(r"\$\{ELASTICSEARCH_HOSTS:(.+)\}", hosts)
    assert fallback is not None
    for url in (fallback.group(1), environment("filebeat")["ELASTICSEARCH_HOSTS"]):
        assert host_port(url) == ("elasticsearch", 9200)


def test_logs_setup_targets_the_compose_elasticsearch_and_kibana() -> None:
    command = services()["logs-setup"]["command"]
    assert command[:2] == ["trainguard", "logs-setup"]
    assert host_port(command[command.index("--elasticsearch") + 1]) == ("elasticsearch", 9200)
    assert host_port(command[command.index("--kibana") + 1]) == ("kibana", 5601)
    assert json.loads(environment("kibana")["ELASTICSEARCH_HOSTS"]) == ["http://elasticsearch:9200"]
    # Security is off for the demo only, and says so.
    assert environment("elasticsearch")["xpack.security.enabled"] == "false"
    assert "DEMO ONLY" in (REPO / "docker-compose.yml").read_text()


# --- the remediation service and the demo trainer -------------------------------------------


def remediation_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    from trainguard.remediation.settings import Settings

    env = environment("remediation")
    unknown = {
        key.removeprefix("TRAINGUARD_REMEDIATION_").lower()
        for key in env
        if key.startswith("TRAINGUARD_REMEDIATION_")
    } - set(Settings.model_fields)
    assert not unknown, f"not settings of the service: {unknown}"
    for key in list(env):
        if key.endswith("_FILE") or key == "TRAINGUARD_REMEDIATION_DB_PATH":
            continue
        monkeypatch.setenv(key, env[key])
    token = secret_targets("remediation")[PurePosixPath(env["TRAINGUARD_REMEDIATION_TOKEN_FILE"])]
    monkeypatch.setenv("TRAINGUARD_REMEDIATION_TOKEN_FILE", str(secret_file(token)))
    policy = host_file("remediation", env["TRAINGUARD_REMEDIATION_POLICY_FILE"])
    monkeypatch.setenv("TRAINGUARD_REMEDIATION_POLICY_FILE", str(policy))
    # Settings also read ./.env: start from a directory that has none.
    monkeypatch.chdir(tmp_path)
    return Settings()


def test_remediation_settings_load_live_for_the_demo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = remediation_settings(monkeypatch, tmp_path)
    assert settings.host == "0.0.0.0"
    assert settings.dry_run is False and settings.require_approval is False
    assert settings.bearer_token() == secret_file("remediation-token").read_text().strip()
    db = PurePosixPath(environment("remediation")["TRAINGUARD_REMEDIATION_DB_PATH"])
    assert db.parent in named_volumes("remediation").values()


def test_demo_policy_acts_on_the_demo_job_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from trainguard.remediation.policy import load_policy

    settings = remediation_settings(monkeypatch, tmp_path)
    policy = load_policy(settings.policy_file)
    demo_job = environment("trainer")[contract.ENV_JOB_ID]
    planned = set()
    for alert in contract.Alert:
        labels = {
            contract.LABEL_JOB_ID: demo_job,
            contract.LABEL_RANK: "1",
            contract.LABEL_NODE: "exporter",
        }
        if policy.plan(alert.value, labels) is not None:
            planned.add(alert.value)
        other = dict(labels, **{contract.LABEL_JOB_ID: "someone-elses-job"})
        assert policy.plan(alert.value, other) is None, alert
        assert policy.plan(alert.value, {contract.LABEL_NODE: "exporter"}) is None, alert
    # The three faults the demo injects are all planned for.
    assert {
        contract.Alert.TRAINING_STRAGGLER.value,
        contract.Alert.TRAINING_COLLECTIVE_STALLED.value,
        contract.Alert.TRAINING_OOM.value,
    } <= planned


def test_trainer_reaches_the_remediation_service_with_the_shared_token() -> None:
    env = environment("trainer")
    assert host_port(env[contract.ENV_REMEDIATION_URL]) == (
        "remediation",
        int(environment("remediation")["TRAINGUARD_REMEDIATION_PORT"]),
    )
    assert secret_targets("trainer")[PurePosixPath(env["TRAINGUARD_REMEDIATION_TOKEN_FILE"])] == (
        "remediation-token"
    )


def test_trainer_command_runs_the_demo_under_torchrun() -> None:
    command = [default(str(part)) for part in services()["trainer"]["command"]]
    assert command[0] == "torchrun"
    assert command[command.index("--nproc-per-node") + 1] == "2"
    assert int(command[command.index("--max-restarts") + 1]) >= 1
    assert command[command.index("-m") + 1] == "trainguard.demo.train"
    checkpoints = PurePosixPath(command[command.index("--checkpoint-dir") + 1])
    assert checkpoints in named_volumes("trainer").values()
    faults = command[command.index("--faults") + 1]
    ranks = {int(r) for r in re.findall(r"rank=(\d+)", faults)}
    assert {kind.split(":")[0] for kind in faults.split(";")} == {"straggler", "hang", "oom"}
    assert max(ranks) < 2, "a fault names a rank the two-process job does not have"


def test_the_stacks_deploy_files_are_all_mounted() -> None:
    mounted = {source for name in services() for source in binds(name).values()}
    stack_files = [
        DEPLOY / "prometheus.yml",
        DEPLOY / "filebeat.yml",
        DEPLOY / "otel-collector.yml",
        DEPLOY / "jaeger.yml",
        DEPLOY / "remediation-demo-policy.yaml",
        *sorted((DEPLOY / "grafana").rglob("*.yml")),
    ]
    for path in stack_files:
        assert any(path == m or m in path.parents for m in mounted), f"{path} is not mounted"
