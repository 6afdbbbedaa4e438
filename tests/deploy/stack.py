"""Helpers of the compose-stack tests: the compose file, its mounts, and host:port parsing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
GPU_OVERRIDE = REPO / "docker-compose.gpu.yml"
DOCKERFILE = REPO / "Dockerfile"
DEPLOY = REPO / "deploy"


def binary(name: str, hint: str) -> str:
    """Path of a tool the tests run; skips (fails under CI's flag) when it is missing."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        message = f"{name} not installed ({hint})"
        if os.environ.get("TRAINGUARD_REQUIRE_BINARIES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose()["services"]
    return result


def environment(service: str) -> dict[str, str]:
    env = services()[service].get("environment", {})
    assert isinstance(env, dict), f"{service}: write environment as a mapping"
    return {str(k): str(v) for k, v in env.items()}


_DEFAULT = re.compile(r"\$\{[A-Z0-9_]+:-([^}]*)\}")


def default(text: str) -> str:
    """``text`` with every ``${VAR:-default}`` replaced by its default (what compose uses
    when the variable is unset)."""
    return _DEFAULT.sub(lambda m: m.group(1), text)


def binds(service: str) -> dict[PurePosixPath, Path]:
    """Bind mounts of a service: container path -> host path (relative to the repository)."""
    result: dict[PurePosixPath, Path] = {}
    for volume in services()[service].get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith((".", "/")):
            result[PurePosixPath(target)] = (REPO / default(source)).resolve()
    return result


def named_volumes(service: str) -> dict[str, PurePosixPath]:
    """Named volumes of a service: volume name -> container path."""
    result: dict[str, PurePosixPath] = {}
    for volume in services()[service].get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if not source.startswith((".", "/")):
            result[source] = PurePosixPath(target)
    return result


def host_file(service: str, container_path: str | PurePosixPath) -> Path:
    """The repository file a service sees at ``container_path`` (through a file or a folder
    bind mount); fails when nothing is mounted there."""
    wanted = PurePosixPath(container_path)
    for target, source in binds(service).items():
        if wanted == target:
            return source
        if target in wanted.parents:
            return source / wanted.relative_to(target)
    raise AssertionError(f"{service} has nothing mounted at {wanted}")


def secret_targets(service: str) -> dict[PurePosixPath, str]:
    """Secrets of a service: container path -> secret name."""
    result: dict[PurePosixPath, str] = {}
    for entry in services()[service].get("secrets", []):
        if isinstance(entry, str):
            result[PurePosixPath("/run/secrets") / entry] = entry
        else:
            target = entry.get("target", entry["source"])
            path = PurePosixPath(target)
            result[path if path.is_absolute() else PurePosixPath("/run/secrets") / path] = entry[
                "source"
            ]
    return result


def secret_file(name: str) -> Path:
    return (REPO / default(compose()["secrets"][name]["file"])).resolve()


def published_port(service: str, container_port: int) -> bool:
    return any(
        str(p).rsplit(":", 1)[-1].split("/")[0] == str(container_port)
        for p in services()[service].get("ports", [])
    )


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` of a URL or a bare address."""
    parts = urlsplit(address if "//" in address else f"//{address}")
    assert parts.hostname is not None and parts.port is not None, address
    return parts.hostname, parts.port
