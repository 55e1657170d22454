"""The public surface: each public module's ``__all__`` and its attributes agree.

A name users can import must be listed in ``__all__`` (so docs, star-imports and type
checkers see it), and every listed name must exist. Packages only re-export, so every public
attribute of a package counts; in a plain module only what it defines itself (def, class,
assignment) counts, not what it imported for its own use.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import inspect
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


def _defined_names(module: types.ModuleType) -> set[str]:
    """Names a module binds itself at top level (def, class, assignment), not by import."""
    tree = ast.parse(inspect.getsource(module))
    names: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            # Definitions guarded by a version check or an optional import still count.
            for field in ("body", "orelse", "finalbody"):
                pending.extend(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                pending.extend(handler.body)
    return names


def _public_attributes(module: types.ModuleType) -> set[str]:
    is_package = hasattr(module, "__path__")
    candidates = set(vars(module)) if is_package else _defined_names(module)
    return {
        name
        for name in candidates
        if not name.startswith("_")
        and hasattr(module, name)
        and not isinstance(getattr(module, name), (types.ModuleType, __future__._Feature))
    }


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
