"""Tests reach acollect's objects through their public names: no test file reads a private attribute of one.

A test that reads ``collector._pool`` breaks, or worse keeps passing while testing nothing, when the attribute
moves; where the test runs rarely (a GPU test, skipped on every machine without CUDA) nobody sees it. So each test
file is parsed (nothing imported) and every ``x._name`` in it is checked against the private names acollect's own
source defines: fields (``self._name``), class and module members (``_name = ...``, ``def _name``), ``__slots__``.
``self._name``, ``cls._name`` and ``super()._name`` are a test's own class (a test's collector subclass implements
the base's hooks); dunders are Python's; ``acollect._runtime.threads`` is a module (tests of an internal module
import it).
Also checked: ``getattr``/``setattr``/``hasattr``/``delattr`` (and ``monkeypatch.setattr``) with such a name, and the
scripts of several lines a test hands to another process as a string.

A test that needs to see something gets a public, documented accessor (``collector.pool``,
``collector.worker_configs``, ``server.policy_device``, ...), or observes the behaviour through the public API.
The check knows names, not types: ``NOT_ACOLLECTS`` lists the reaches into other libraries' objects that share a
name with a field of acollect's, each with whose it is, and fails on an entry whose reach is gone.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "acollect"
TESTS = ROOT / "tests"

_ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_private_names(tree: ast.AST) -> Iterator[str]:
    """The private names a module of acollect defines: its objects' fields, its classes' and its own members."""
    bodies: list[list[ast.stmt]] = [tree.body] if isinstance(tree, ast.Module) else []
    bodies += [node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    for body in bodies:  # members of the module and of each class
        for statement in body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield statement.name
            targets = (
                statement.targets if isinstance(statement, ast.Assign)
                else [statement.target] if isinstance(statement, (ast.AnnAssign, ast.AugAssign)) else []
            )  # fmt: skip
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        yield name.id
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in statement.targets
            ):
                for slot in ast.walk(statement.value):
                    if isinstance(slot, ast.Constant) and isinstance(slot.value, str):
                        yield slot.value
    for node in ast.walk(tree):  # fields: what its methods set or read on self (or cls)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            yield node.attr


def private_names() -> frozenset[str]:
    """Every private name acollect's source defines (see :func:`_defined_private_names`)."""
    names: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        names.update(_defined_private_names(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))))
    return frozenset(name for name in names if _private(name))


def _acollect_modules() -> frozenset[str]:
    """The dotted names of acollect's modules and packages (``acollect._runtime.threads`` is a module, not an
    attribute)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return frozenset(names)


PRIVATE = private_names()
MODULES = _acollect_modules()

# Reaches into objects that are not acollect's but share a private name with one of acollect's fields (the check
# knows names, not types): (file, expression) -> whose attribute it is. An entry no longer found fails the test.
NOT_ACOLLECTS: dict[tuple[str, str], str] = {
    ("tests/test_cli.py", "build_parser()._actions"): "argparse.ArgumentParser's arguments (argparse lists them "
    "nowhere public), not AsyncRollout._actions",
    ("tests/test_cli.py", "parser._actions"): "the same, of the parser build_parser() returned",
    ("tests/test_cli.py", "subparsers.choices['bench']._actions"): "the same, of the `acollect bench` sub-parser",
}


def _string_argument(node: ast.Call, index: int) -> str | None:
    argument = node.args[index] if len(node.args) > index else None
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return argument.value
    return None


def _reaches(tree: ast.AST, depth: int) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            owner = node.value
            own = (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
                isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super"
            )
            if not own and ast.unparse(node) not in MODULES:
                yield line, ast.unparse(node)
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called in _ATTRIBUTE_CALLS:
                name = _string_argument(node, 1)
                target = _string_argument(node, 0)  # monkeypatch.setattr("acollect.module._name", value)
                if name is None and target is not None and target.startswith("acollect."):
                    name = target.rpartition(".")[2]
                if name is not None and name in PRIVATE:
                    yield line, ast.unparse(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value and depth < 2:
            # Source run in another process (a trainer script, ``python -c``): its reaches count as the test's.
            try:
                inner = ast.parse(textwrap.dedent(node.value))  # as a test writes it: indented
            except SyntaxError:
                continue  # prose, a regex: no Python source
            for inner_line, text in _reaches(inner, depth + 1):
                yield line, f"(line {inner_line} of the string) {text}"


def reaches(source: str) -> list[tuple[int, str]]:
    """Each reach in ``source`` for a private attribute of an acollect object: ``(line, the expression)``."""
    return sorted(set(_reaches(ast.parse(source), 0)))


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def _first_private(names: Iterable[str]) -> str:
    return min(name for name in names if _private(name))


def test_the_private_names_are_acollects_own() -> None:
    # Read from the source; an object's real fields are among them, or the check would see nothing.
    from acollect import Collector, InferenceServer, MultiSyncCollector
    from acollect._workers.handles import WorkerHandle
    from acollect._workers.protocol import WorkerConfig
    from acollect.testing import CountingEnv, WeightProbe

    objects = [
        Collector(CountingEnv, frames_per_batch=4),
        MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8),
        InferenceServer(WeightProbe(0.0)),
    ]
    fields = {name for obj in objects for name in vars(obj) if _private(name)}
    assert len(fields) > 20, sorted(fields)
    assert fields <= PRIVATE, sorted(fields - PRIVATE)
    assert set(WorkerHandle(0, WorkerConfig(0, 0, 1, "", 0, None)).__slots__) <= PRIVATE
    assert not {"_exit", "_SubParsersAction"} & PRIVATE, "os's and argparse's, never acollect's"


def test_planted_reaches_are_found() -> None:
    import acollect._runtime.threads as threads_module
    from acollect import MultiSyncCollector
    from acollect._workers.handles import WorkerHandle
    from acollect.testing import CountingEnv

    field = _first_private(vars(MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8)))
    slot = _first_private(WorkerHandle.__slots__)
    member = _first_private(vars(threads_module))
    planted = "\n".join([
        f"collector.{field}.handles[0]",
        f"self.{field}, cls.{field}, super().{field}  # a test's own class",
        "os._exit, argparse._SubParsersAction  # not acollect's",
        "acollect._runtime.threads.run_in_thread  # a module, imported by a test of it",
        f"handle.{slot}",
        f"getattr(collector, '{field}')",
        f"monkeypatch.setattr(threads, '{member}', None)",
        f"monkeypatch.setattr('acollect._runtime.threads.{member}', None)",
        'TRAINER = textwrap.dedent("""',
        "    import anyio",
        f"    print(collector.{field})",
        '""")',
    ])  # fmt: skip
    assert reaches(planted) == [
        (1, f"collector.{field}"),
        (5, f"handle.{slot}"),
        (6, f"getattr(collector, '{field}')"),
        (7, f"monkeypatch.setattr(threads, '{member}', None)"),
        (8, f"monkeypatch.setattr('acollect._runtime.threads.{member}', None)"),
        (9, f"(line 3 of the string) collector.{field}"),
    ]


def _found_in(path: Path) -> list[tuple[int, str]]:
    return reaches(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", _test_files(), ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_reaches_a_private_attribute_of_an_acollect_object(path: Path) -> None:
    where = str(path.relative_to(ROOT))
    found = [f"{where}:{line}: {text}" for line, text in _found_in(path) if (where, text) not in NOT_ACOLLECTS]
    assert not found, "give the test a public accessor, or observe the behaviour through the public API:\n" + "\n".join(
        found
    )


def test_every_entry_of_not_acollects_is_still_found() -> None:
    stale = sorted(entry for entry in NOT_ACOLLECTS if entry[1] not in {text for _, text in _found_in(ROOT / entry[0])})
    assert not stale, f"remove these entries of NOT_ACOLLECTS, their reach is gone: {stale}"


def test_every_test_file_is_read_gpu_ones_included() -> None:
    # The GPU tests are skipped without CUDA: this check is what keeps them from breaking unseen.
    read = {str(p.relative_to(TESTS)) for p in _test_files()}
    gpu = {"inference/test_batched_gpu.py", "test_collector_gpu.py", "multi/test_multi_gpu.py"}
    helpers = {"conftest.py", "multi/multi_helpers.py", "chaos/chaos_helpers.py", "test_private_reach.py"}
    assert gpu | helpers <= read, sorted(gpu | helpers - read)
