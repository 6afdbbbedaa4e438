"""docker-compose.yml: valid for Compose, pinned, healthy, with named volumes and real files."""

from __future__ import annotations

import os
import re
from pathlib import PurePosixPath

import yaml

from tests.deploy.stack import (
    COMPOSE_FILE,
    DOCKERFILE,
    GPU_OVERRIDE,
    REPO,
    binary,
    binds,
    compose,
    default,
    named_volumes,
    run,
    secret_file,
    secret_targets,
    services,
)

OUR_TARGETS = {"trainer", "exporter", "remediation"}
# Keys of the Compose specification that Compose v2 and docker-compose 1.29 both implement.
COMMON_SERVICE_KEYS = {
    "build", "command", "depends_on", "deploy", "entrypoint", "environment", "healthcheck",
    "hostname", "image", "network_mode", "pid", "ports", "restart", "secrets", "user", "volumes",
}  # fmt: skip
# Long-running services without a healthcheck, and why.
NO_HEALTHCHECK = {
    "otel-collector": "the image has no shell or HTTP client to probe with",
    "trainer": "the workload itself; its health is what the stack monitors",
}
ONE_SHOT = {"volume-init", "logs-setup"}


def docker_compose() -> str:
    return binary("docker-compose", "Debian: docker-compose")


def test_docker_compose_config_validates() -> None:
    result = run(docker_compose(), "-f", COMPOSE_FILE, "config", "-q")
    assert result.returncode == 0, result.stderr


def test_gpu_override_validates_and_demands_a_cuda_torch_index() -> None:
    tool = docker_compose()
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_TORCH_INDEX_URL"}
    missing = run(tool, "-f", COMPOSE_FILE, "-f", GPU_OVERRIDE, "config", "-q", env=env)
    assert missing.returncode != 0
    assert "TRAINGUARD_TORCH_INDEX_URL" in missing.stderr

    env["TRAINGUARD_TORCH_INDEX_URL"] = "https://download.pytorch.org/whl/cu-test"
    result = run(tool, "-f", COMPOSE_FILE, "-f", GPU_OVERRIDE, "config", env=env)
    assert result.returncode == 0, result.stderr
    merged = yaml.safe_load(result.stdout)["services"]
    for name in ("exporter", "trainer"):
        (device,) = merged[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert "--simulate-gpus" not in merged["exporter"]["command"]
    # The trainer and logs-setup share an image tag, so they must be built alike.
    for name in ("trainer", "logs-setup"):
        assert merged[name]["build"]["args"]["TORCH_INDEX_URL"].endswith("cu-test")
        assert merged[name]["image"] == merged["trainer"]["image"]


def test_cpu_stack_simulates_gpus_and_says_so_in_the_readme() -> None:
    command = services()["exporter"]["command"]
    assert command[command.index("--simulate-gpus") + 1] == "2"
    assert "deploy" not in services()["exporter"]
    assert "--simulate-gpus 2" in (REPO / "README.md").read_text()


def test_keeps_to_the_spec_both_compose_versions_implement() -> None:
    data = compose()
    assert "version" not in data and "name" not in data
    for name, service in services().items():
        unknown = set(service) - COMMON_SERVICE_KEYS
        assert not unknown, f"{name}: {unknown}"


def test_upstream_images_are_pinned_and_ours_are_built_from_the_dockerfile() -> None:
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE.read_text(), re.MULTILINE))
    for name, service in services().items():
        image = default(service["image"])
        if "build" in service:
            build = service["build"]
            assert build["context"] == "." and build["target"] in targets & OUR_TARGETS, name
            assert image.startswith(f"trainguard/{build['target']}:"), name
            continue
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag not in {"latest", "main", "stable"}, f"{name}: {image} is not pinned"
        assert re.search(r"\d+\.\d+\.\d+", tag), f"{name}: {image} is not a release tag"


def test_jaeger_is_v2_not_the_end_of_life_all_in_one() -> None:
    image = services()["jaeger"]["image"]
    assert image.startswith("jaegertracing/jaeger:2.")
    assert not any("all-in-one" in s["image"] for s in services().values())


def test_every_bind_mounted_file_exists() -> None:
    for name in services():
        for target, source in binds(name).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is missing"
            assert REPO in source.parents, f"{name}: {source} is outside the repository"


def test_secrets_exist_are_demo_only_and_never_baked_into_images() -> None:
    declared = compose()["secrets"]
    for name in declared:
        path = secret_file(name)
        content = path.read_text().strip()
        assert content and "\n" not in content, f"{path}: one line expected"
        assert "DEMO-ONLY" in content, f"{path}: placeholders must say they are demo-only"
    used = {s for service in services() for s in secret_targets(service).values()}
    assert used == set(declared)
    assert "deploy/secrets" in (REPO / ".dockerignore").read_text().split()


def test_state_lives_in_declared_named_volumes() -> None:
    declared = set(compose()["volumes"])
    used: set[str] = set()
    for name in services():
        for volume, target in named_volumes(name).items():
            assert volume in declared, f"{name}: volume {volume} is not declared"
            used.add(volume)
            assert target.is_absolute()
    assert used == declared
    for name, path in {
        "prometheus": "/prometheus",
        "alertmanager": "/alertmanager",
        "grafana": "/var/lib/grafana",
        "elasticsearch": "/usr/share/elasticsearch/data",
        "filebeat": "/usr/share/filebeat/data",
    }.items():
        assert PurePosixPath(path) in named_volumes(name).values(), name


def test_shared_volumes_are_handed_to_our_uid_before_use() -> None:
    init = services()["volume-init"]
    owned = set(named_volumes("volume-init"))
    assert init["entrypoint"][:3] == ["chown", "-R", "10001:10001"]
    assert sorted(init["command"]) == sorted(str(p) for p in named_volumes("volume-init").values())
    assert "USER 10001:10001" in DOCKERFILE.read_text()
    for name in ("trainer", "remediation", "exporter"):
        writable = {v for v in services()[name].get("volumes", []) if not str(v).endswith(":ro")}
        for volume in writable:
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in owned, f"{name} writes to {source}, which volume-init skips"
        assert services()[name]["depends_on"]["volume-init"]["condition"] == (
            "service_completed_successfully"
        )


def test_every_long_running_service_has_a_healthcheck() -> None:
    dockerfile = DOCKERFILE.read_text()
    for name, service in services().items():
        if name in ONE_SHOT:
            assert service["restart"] == "no", name
            continue
        if name in NO_HEALTHCHECK:
            continue
        if "build" in service:
            stage = dockerfile.split(f" AS {service['build']['target']}\n", 1)[1].split("FROM ")[0]
            assert "HEALTHCHECK" in stage, f"{name}: no HEALTHCHECK in its Dockerfile target"
        else:
            check = service["healthcheck"]
            # Exec form: the images need no shell, and an unknown program fails loudly.
            assert check["test"][0] == "CMD" and len(check["test"]) > 1, name
            assert {"interval", "timeout", "retries"} <= set(check), name


def test_dependencies_wait_for_health_where_there_is_one() -> None:
    for name, service in services().items():
        for dependency, spec in service.get("depends_on", {}).items():
            assert dependency in services(), f"{name} depends on unknown {dependency}"
            condition = spec["condition"]
            if dependency in ONE_SHOT:
                assert condition == "service_completed_successfully", (name, dependency)
            elif "healthcheck" in services()[dependency] or dependency == "remediation":
                assert condition == "service_healthy", (name, dependency)


def test_ports_are_published_on_loopback_by_default() -> None:
    for name, service in services().items():
        for port in service.get("ports", []):
            assert str(port).startswith("${TRAINGUARD_BIND:-127.0.0.1}:"), f"{name}: {port}"
