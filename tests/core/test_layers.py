"""The picture of the layers in docs/contributing.md is drawn from the import-linter contract.

``lint-imports`` (run by ``make test``) enforces ``[tool.importlinter]`` of pyproject.toml; this
test draws that contract as text and fails when docs/contributing.md shows anything else. After
changing the contract, write the picture again with
``TRAINGUARD_UPDATE_GENERATED=1 .venv/bin/pytest tests/core/test_layers.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import tomllib

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "contributing.md"
BEGIN, END = (
    "<!-- layers: drawn from pyproject.toml by tests/core/test_layers.py -->",
    "<!-- /layers -->",
)


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def picture() -> str:
    """The layers top to bottom (``|``: independent, ``:``: may import each other), then the
    component edges the contract allows."""
    contracts = _contracts()
    layers = contracts["layers"]
    (container,) = layers["containers"]
    lines = [f"{container}/ (each layer imports only the layers below it)"]
    for layer in layers["layers"]:
        lines.append("  " + re.sub(r"\s*([|:])\s*", r" \1 ", layer))
    lines.append("")
    lines.append("components import each other only along these edges:")
    for edge in contracts["components"]["ignore_imports"]:
        lines.append("  " + edge.replace(f"{container}.", "").replace(".**", ".*"))
    forbidden = contracts["product"]
    lines.append("")
    lines.append(
        f"{', '.join(forbidden['source_modules'])} never imports "
        f"{', '.join(forbidden['forbidden_modules'])}"
    )
    return "\n".join(["```", *lines, "```"])


def test_the_guide_shows_the_layers_the_contract_enforces() -> None:
    text = GUIDE.read_text()
    drawn = f"{BEGIN}\n{picture()}\n{END}"
    if os.environ.get("TRAINGUARD_UPDATE_GENERATED") == "1":
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: drawn, text, flags=re.S)
        GUIDE.write_text(text)
    assert drawn in text, "stale layers picture: TRAINGUARD_UPDATE_GENERATED=1 pytest " + __file__


def test_every_package_of_the_product_is_in_a_layer() -> None:
    layers = _contracts()["layers"]
    named = {name for layer in layers["layers"] for name in re.split(r"[|:]", layer)}
    named = {name.strip() for name in named}
    children = {
        path.stem if path.is_file() else path.name
        for path in (REPO / "trainguard").iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py") or (path / "__init__.py").exists()
    }
    assert children == named, (children - named, named - children)


def test_no_module_outside_the_tests_is_over_600_lines() -> None:
    """Modules are split by responsibility before they grow past what one reader holds."""
    long = {
        str(path.relative_to(REPO)): lines
        for root in ("trainguard", "benchmarks", "examples")
        for path in (REPO / root).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > 600
    }
    assert not long, long
