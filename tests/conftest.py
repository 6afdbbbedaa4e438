"""Suite-wide test policy: tests marked ``gpu`` run only where CUDA is available."""

from __future__ import annotations

import importlib.util

import pytest


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
