"""Shared pytest configuration: one torch thread per test process and GPU auto-skip."""

from __future__ import annotations

import pytest
import torch

# Tests run many small envs and policies side by side on few cores; intra-op threads only
# add contention there, and workers default to one thread too, so tests see what users see.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips tests marked ``gpu`` when CUDA is not available."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# ``--doctest-modules`` would also collect the conftest files under tests/ as doctest modules, and
# several of them share the module name "conftest"; they hold no doctests, so none is collected.
collect_ignore_glob = ["conftest.py", "*/conftest.py"]
