"""The public surface: each public module's ``__all__`` and its attributes agree.

A name users can import must be listed in ``__all__`` (so docs, star-imports and type
checkers see it), and every listed name must exist. Packages only re-export, so every public
attribute of a package counts; in a plain module only what it defines itself (def, class,
assignment) counts, not what it imported for its own use.

One documented exception: TorchRL's spellings (:mod:`acollect.compat.torchrl`) import from
``acollect`` for code written against TorchRL, but stay out of ``acollect.__all__``, which holds
acollect's own names only. ``acollect.collectors`` sits below the compatibility layer and holds
none of them.
"""

from __future__ import annotations
import __future__

import ast
import importlib
import importlib.util
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

PUBLIC_MODULES = [
    "acollect",
    "acollect.compat.torchrl",
    "acollect.envs",
    "acollect.errors",
    "acollect.specs",
    "acollect.testing",
]

# Public attributes a module re-exports without listing them in __all__: module -> the module
# that documents them (and lists them in its own __all__).
COMPAT_REEXPORTS = {"acollect": "acollect.compat.torchrl"}

# TorchRL's names, and the acollect class or function each one is.
TORCHRL_NAMES = {
    "SyncDataCollector": "Collector",
    "MultiSyncDataCollector": "MultiSyncCollector",
    "MultiaSyncDataCollector": "MultiAsyncCollector",
    "aSyncDataCollector": "AsyncCollector",
    "DataCollectorBase": "CollectorBase",
    "BaseCollector": "CollectorBase",
    "DistributedDataCollector": "DistributedCollector",
    "DistributedSyncDataCollector": "DistributedSyncCollector",
    "RPCCollector": "RPCCollector",
    "RPCDataCollector": "RPCCollector",
}

# The names the documentation promises; renaming one is an API break and must be deliberate.
PROMISED = {
    "acollect": ["Collector", "CollectorState", "ReplayBuffer"],
    "acollect.envs": ["EnvBase", "GymEnv", "PettingZooEnv", "TorchRLEnvAdapter", "make_env"],
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
    "acollect.compat.torchrl": sorted(TORCHRL_NAMES),
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
    # dir(), not vars(): a package's names may load on first use (acollect's do), and its __dir__ lists them.
    candidates = set(dir(module)) if is_package else _defined_names(module)
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
    documented: set[str] = set()
    if module_name in COMPAT_REEXPORTS:
        documented = set(importlib.import_module(COMPAT_REEXPORTS[module_name]).__all__)
    unlisted = sorted(_public_attributes(module) - set(module.__all__) - documented)
    assert not unlisted, f"{module_name} has public names missing from __all__ (add them or prefix _): {unlisted}"


@pytest.mark.parametrize("module_name", sorted(COMPAT_REEXPORTS))
def test_compat_reexports_are_the_documented_objects(module_name: str) -> None:
    module = importlib.import_module(module_name)
    source = importlib.import_module(COMPAT_REEXPORTS[module_name])
    in_all = sorted(set(module.__all__) & set(source.__all__))
    assert not in_all, f"{module_name}.__all__ holds compatibility names (keep them out): {in_all}"
    differ = [name for name in source.__all__ if getattr(module, name, None) is not getattr(source, name)]
    assert not differ, f"{module_name} lacks, or re-binds, these names of {source.__name__}: {differ}"


def _typing_reexports(tree: ast.Module) -> dict[str, str]:
    """The names acollect/__init__.py re-exports under TYPE_CHECKING, and their modules, checking its shape."""
    typed: dict[str, str] = {}
    blocks = 0
    for node in tree.body:
        where = f"acollect/__init__.py line {node.lineno}"
        if isinstance(node, ast.If):
            blocks += 1
            assert ast.unparse(node.test) == "_typing.TYPE_CHECKING", f"{where}: only a TYPE_CHECKING block"
            assert not node.orelse, f"{where}: nothing runs in place of the re-exports"
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom), f"{where}: re-exports only"
                implicit = [alias.name for alias in imported.names if alias.asname != alias.name]
                assert not implicit, f"{where}: write `import {implicit[0]} as {implicit[0]}`"
                duplicated = [alias.name for alias in imported.names if alias.name in typed]
                assert not duplicated, f"{where}: {duplicated} listed twice"
                typed |= {alias.name: str(imported.module) for alias in imported.names}
        elif isinstance(node, ast.Import):
            assert all(alias.asname and alias.asname.startswith("_") for alias in node.names), f"{where}: private"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            assert names <= {"__version__", "__all__", "_EXPORTS", "_COMPAT_MODULE"}, f"{where} defines {names}"
            if names & {"__all__", "_EXPORTS"}:
                # Made from the block, never written out: a name spelt here would be a second list.
                assert node.value is not None
                spelt = {n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant)} - {"__version__"}
                assert not spelt, f"{where}: a second list ({sorted(map(str, spelt))})"
        elif isinstance(node, ast.FunctionDef):
            assert node.name in {"__getattr__", "__dir__", "_read_exports"}, f"{where} defines {node.name}"
        else:
            is_docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            assert is_docstring, f"{where}: re-exports only ({type(node).__name__})"
    assert blocks == 1, "acollect/__init__.py lists its names in one TYPE_CHECKING block"
    return typed


def test_init_lists_its_names_once() -> None:
    # The package defines nothing of its own, and lists its names once: as explicit re-exports
    # (`from x import Name as Name`) under TYPE_CHECKING, which type checkers read. At run time the block is
    # read, not run, into the map a PEP 562 __getattr__ loads each name by, and into __all__: what the loop below
    # sees through the public surface alone.
    import acollect

    typed = _typing_reexports(ast.parse(inspect.getsource(acollect)))
    compat = importlib.import_module(COMPAT_REEXPORTS["acollect"])
    assert {name for name, module in typed.items() if module == compat.__name__} == set(compat.__all__)
    assert sorted(acollect.__all__) == sorted({*typed, "__version__"} - set(compat.__all__))
    for name, module in typed.items():
        assert getattr(acollect, name) is getattr(importlib.import_module(module), name), name
        assert name in dir(acollect), name


def test_a_name_added_to_the_block_is_exported(tmp_path: Path) -> None:
    # One line in the TYPE_CHECKING block is all a new public name takes: a copy of acollect/__init__.py with
    # one more re-export hands it out, lists it in __all__ and in dir(), and loads it on use.
    import acollect

    source = inspect.getsource(acollect).replace(
        "    from acollect.stats import CollectorStats as CollectorStats\n",
        "    from acollect.stats import CollectorStats as CollectorStats\n"
        "    from acollect.stats import EpisodeTracker as EpisodeTracker\n",
    )
    assert "EpisodeTracker as EpisodeTracker" in source
    (tmp_path / "__init__.py").write_text(source)
    spec = importlib.util.spec_from_file_location("copy_of_acollect", tmp_path / "__init__.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "EpisodeTracker" in module.__all__
    assert "EpisodeTracker" in dir(module)
    assert module.EpisodeTracker is importlib.import_module("acollect.stats").EpisodeTracker
    assert sorted(set(module.__all__) - {"EpisodeTracker"}) == sorted(acollect.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    import acollect

    with pytest.raises(AttributeError, match="module 'acollect' has no attribute 'Colector'"):
        _ = acollect.Colector  # type: ignore[attr-defined]
    with pytest.raises(ImportError, match="Colector"):
        exec("from acollect import Colector", {})


def test_import_acollect_loads_no_torch() -> None:
    # What keeps `acollect --help` quick: the package loads its names (and torch with them) on first use.
    heavy = ("torch", "tensordict", "acollect.collectors")
    code = f"import sys, acollect; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("module_name", ["acollect", "acollect.compat.torchrl"])
@pytest.mark.parametrize("name", sorted(TORCHRL_NAMES))
def test_torchrl_names_still_import(module_name: str, name: str) -> None:
    import acollect
    from acollect.compat import torchrl

    namespace: dict[str, object] = {}
    exec(f"from {module_name} import {name}", namespace)  # the statement old code has
    assert namespace[name] is getattr(torchrl, name) is getattr(acollect, TORCHRL_NAMES[name])
    assert name in dir(importlib.import_module(module_name))


@pytest.mark.parametrize("name", sorted(TORCHRL_NAMES))
def test_torchrl_names_are_not_in_the_collectors_package(name: str) -> None:
    # acollect.collectors is below acollect.compat: holding these names would mean importing upward.
    with pytest.raises(ImportError, match=name):
        exec(f"from acollect.collectors import {name}", {})


def test_acollect_collectors_keeps_its_collectors() -> None:
    import acollect
    import acollect.collectors as collectors

    for name in [
        "AsyncCollector",
        "Collector",
        "CollectorBase",
        "CollectorState",
        "DistributedCollector",
        "DistributedSyncCollector",
        "MultiAsyncCollector",
        "MultiSyncCollector",
        "RayCollector",
        "SharedMemWeightSyncScheme",
        "WeightSyncScheme",
        "ZmqWeightSyncScheme",
    ]:
        assert getattr(collectors, name) is getattr(acollect, name), name
    with pytest.raises(AttributeError, match="NoSuchCollector"):
        _ = collectors.NoSuchCollector  # type: ignore[attr-defined]


@pytest.mark.parametrize("module_name", sorted(PROMISED))
def test_promised_names_are_exported(module_name: str) -> None:
    module = importlib.import_module(module_name)
    absent = [name for name in PROMISED[module_name] if name not in module.__all__]
    assert not absent, f"{module_name}.__all__ lacks documented names: {absent}"


def test_version_is_a_string() -> None:
    import acollect

    assert isinstance(acollect.__version__, str)
    assert acollect.__version__.count(".") >= 2
