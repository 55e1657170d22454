"""The public surface: each public module's ``__all__`` and its attributes agree.

A name users can import must be listed in ``__all__`` (so docs, star-imports and type
checkers see it), and every listed name must exist. Packages only re-export, so every public
attribute of a package counts; in a plain module only what it defines itself counts, not what
it imported for its own use.
"""

from __future__ import annotations
import __future__

import importlib
import types

import pytest

PUBLIC_MODULES = ["acollect", "acollect.envs", "acollect.errors", "acollect.specs", "acollect.testing"]

# The names the documentation promises; renaming one is an API break and must be deliberate.
PROMISED = {
    "acollect": ["Collector", "CollectorState", "ReplayBuffer"],
    "acollect.envs": ["EnvBase", "GymEnv", "TorchRLEnvAdapter", "make_env"],
    "acollect.errors": [
        "AcollectError",
        "BackgroundCollectionError",
        "ClosedCollectorError",
        "CollectorStateError",
        "ConfigurationError",
        "ProtocolError",
        "RemoteError",
        "TransportError",
        "WeightSyncError",
        "WorkerCrashedError",
        "WorkerError",
        "WorkerTimeoutError",
    ],
    "acollect.specs": [
        "Binary",
        "Bounded",
        "Categorical",
        "Composite",
        "MultiCategorical",
        "OneHot",
        "TensorSpec",
        "Unbounded",
    ],
    "acollect.testing": ["CountingEnv", "CrashingEnv", "SlowEnv"],
}


def _public_attributes(module: types.ModuleType) -> set[str]:
    is_package = hasattr(module, "__path__")
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if isinstance(value, __future__._Feature):
            continue
        if not is_package and getattr(value, "__module__", module.__name__) != module.__name__:
            # Imported for the module's own use (typing helpers, torch, ...), not part of its API.
            continue
        names.add(name)
    return names


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_lists_only_existing_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} has no __all__"
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{module_name}.__all__ has duplicates"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ lists names the module lacks: {missing}"


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_is_in_all(module_name: str) -> None:
    module = importlib.import_module(module_name)
    unlisted = sorted(_public_attributes(module) - set(module.__all__))
    assert not unlisted, f"{module_name} has public names missing from __all__ (add them or prefix _): {unlisted}"


@pytest.mark.parametrize("module_name", sorted(PROMISED))
def test_promised_names_are_exported(module_name: str) -> None:
    module = importlib.import_module(module_name)
    absent = [name for name in PROMISED[module_name] if name not in module.__all__]
    assert not absent, f"{module_name}.__all__ lacks documented names: {absent}"


def test_version_is_a_string() -> None:
    import acollect

    assert isinstance(acollect.__version__, str)
    assert acollect.__version__.count(".") >= 2
