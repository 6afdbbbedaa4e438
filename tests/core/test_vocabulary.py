"""Failure, cause and action names are spelled in the contract only.

Every other module names a failure as ``contract.Failure.X``, a diagnosed cause as
``contract.Cause.X`` and an action as ``contract.Action.X``: a string literal equal to one of
their values anywhere else in the sources is a second spelling that a rename would miss.
"""

from __future__ import annotations

import ast
from pathlib import Path

from trainguard import contract

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "trainguard"
CONTRACT = SOURCES / "contract"
NAMES = (
    {f.value for f in contract.Failure}
    | {c.value for c in contract.Cause}
    | {a.value for a in contract.Action}
)


def literals_naming_the_vocabulary(source: str) -> list[tuple[int, str]]:
    """(line, value) of every string constant in ``source`` equal to a failure or action."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES
    ]


def test_the_scan_sees_a_second_spelling() -> None:
    assert literals_naming_the_vocabulary('x = "split_micro_batches"\ny = f"{a}"') == [
        (1, "split_micro_batches")
    ]
    assert literals_naming_the_vocabulary("x = Action.SPLIT_MICRO_BATCHES") == []


def test_no_failure_or_action_name_is_spelled_outside_the_contract() -> None:
    found = []
    for path in sorted(SOURCES.rglob("*.py")):
        if CONTRACT in path.parents:
            continue
        for line, value in literals_naming_the_vocabulary(path.read_text()):
            found.append(f"{path.relative_to(REPO)}:{line}: {value!r}")
    assert not found, "use contract.Failure / Cause / Action:\n" + "\n".join(found)
