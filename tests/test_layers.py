"""acollect's module structure: no import cycles, no upward imports, one boundary each, one job per module.

Every module under ``acollect/`` is parsed with :mod:`ast` (nothing is imported, so no side
effects) and every ``import`` in it counts, at module level or inside a function: a function-level
import is still a dependency, it only hides a cycle until the function runs.

The layers, bottom to top, as ``LAYERS`` lists them (a module may import its own layer and those
below it; ``test_docstring_lists_the_layers`` keeps this list and ``LAYERS`` the same)::

    errors, _validate, _warnings, _runtime, _pickling, specs, _devices, _affinity, _time_split
    envs, _policy, _episodes, stats, _progress, replay_buffer
    _batches
    _weights
    _rollout
    inference
    _workers
    transport, launchers
    collectors
    compat
    cli, testing, __main__, and the package itself (acollect/__init__.py only re-exports)

The private packages are flows, each owning both ends of the process boundary: ``_runtime`` what every
long-lived object runs on (tasks, threads, state machines, process start) and the process boundary itself
(ZeroMQ sockets, the wire format and its tensor layout, torch.distributed); ``_batches`` a batch's memory
(its plan, shared memory, slot rings, credit pipes, lending, hand-out buffers, counts, trajectories); ``_weights``
a weight push's content (versions, structure check) and how it travels (the sync schemes); ``_rollout`` the
engines; ``inference`` the inference server, whose clients run inside workers; ``_workers`` a worker's life,
the collector's side (pool, handles, liveness, the weight pusher) and the worker's (main loop, protocol,
staging), and how it starts (the launchers). ``transport`` and ``launchers`` are public facades over them.

Besides the imports between layers, three rules hold one place each: only ``CollectorBase`` defines
``async_shutdown`` (the rules of shutting down live there once) and ``update_policy_weights_`` (one
signature, one check that a single source of weights was given, one message), and only
``acollect/_runtime/`` imports ``zmq`` (ZeroMQ's errors become ``TransportError`` at that one boundary).

There is no cap on a module's length: a module has one job, which its name and the first line of its
docstring say (``test_every_module_says_its_job``), and is as long as that job needs; a module with two
jobs is split by job, never to meet a number.

Exceptions are listed below, each with the reason and what removes it: tighten them as they go.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "acollect"

LAYERS: list[set[str]] = [
    {"errors", "_validate", "_warnings", "_runtime", "_pickling", "specs", "_devices", "_affinity", "_time_split"},
    {"envs", "_policy", "_episodes", "stats", "_progress", "replay_buffer"},
    {"_batches"},
    {"_weights"},
    {"_rollout"},
    {"inference"},
    {"_workers"},
    {"transport", "launchers"},  # public facades: their modules live in _runtime, _batches, _weights, _workers
    {"collectors"},
    {"compat"},
    {"cli", "testing", "__main__", ""},  # "": acollect/__init__.py, the public facade
]

# Imports from a higher layer into a lower one that cannot go yet: (importer, imported) -> why.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {
    ("acollect._weights.updates", "acollect._rollout.engine"): (
        "a type annotation only (under TYPE_CHECKING): PolicyWeights.apply_pending puts staged weights into the "
        "engine it is given, whose protocol lives with the engines, which stage PolicyWeights themselves; the two "
        "ends of applying weights in process. Goes when Engine's protocol moves below both (a protocol of what "
        "weights are applied to, in _weights)"
    ),
}

# Edges that close an import cycle but cannot go yet: (importer, imported) -> why. The cycle
# check ignores these edges; every other cycle fails.
CYCLE_EDGES_ALLOWED: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imported_modules(name: str, tree: ast.AST) -> Iterator[str]:
    """The acollect modules ``name`` imports, anywhere in its body (module or function level)."""
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            if base.split(".")[0] != "acollect":
                continue
            for alias in node.names:
                # `from acollect._workers import protocol`: the submodule;
                # `from acollect.envs import make_env`: the package.
                submodule = f"{base}.{alias.name}"
                yield submodule if submodule in MODULES else base


def build_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[name] = {target for target in _imported_modules(name, tree) if target != name}
    return graph


GRAPH = build_graph()


def layer_of(name: str) -> int:
    component = name.split(".")[1] if "." in name else ""
    for index, layer in enumerate(LAYERS):
        if component in layer:
            return index
    raise AssertionError(f"{name} belongs to no layer: add {component!r} to LAYERS in {__file__}")


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_one_cycle(graph, set(component)) for component in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, for the message."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError("a strongly connected component without a cycle")


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        layer_of(name)


def test_the_graph_sees_known_imports() -> None:
    # Guards the parser: a broken resolution would make the other tests pass vacuously.
    assert "acollect._workers.protocol" in GRAPH["acollect._workers.main"]  # `from acollect._workers import protocol`
    assert "acollect.envs" in GRAPH["acollect._rollout.build"]  # `from acollect.envs import AsyncEnvPool, ...`
    assert "acollect.errors" in GRAPH["acollect._runtime.wire"]


def test_no_import_cycles() -> None:
    graph = {name: {t for t in targets if (name, t) not in CYCLE_EDGES_ALLOWED} for name, targets in GRAPH.items()}
    cycles = [" -> ".join(cycle) for cycle in find_cycles(graph)]
    assert not cycles, "import cycles (module-level and function-level imports both count):\n" + "\n".join(cycles)


def test_allowed_cycle_edges_still_exist() -> None:
    stale = [edge for edge in CYCLE_EDGES_ALLOWED if edge[1] not in GRAPH.get(edge[0], set())]
    assert not stale, f"remove these from CYCLE_EDGES_ALLOWED, the import is gone: {stale}"


def test_no_upward_imports() -> None:
    upward = sorted(
        f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})"
        for name, targets in GRAPH.items()
        for target in targets
        if layer_of(target) > layer_of(name) and (name, target) not in UPWARD_ALLOWED
    )
    assert not upward, "imports from a higher layer into a lower one:\n" + "\n".join(upward)


def test_allowed_upward_imports_still_exist() -> None:
    stale = [edge for edge in UPWARD_ALLOWED if edge[1] not in GRAPH.get(edge[0], set())]
    assert not stale, f"remove these from UPWARD_ALLOWED, the import is gone: {stale}"


def test_every_module_says_its_job() -> None:
    # One job per module, said where a reader looks first: a module docstring whose first line says it.
    silent = sorted(
        name
        for name, path in MODULES.items()
        if not (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").strip()
    )
    assert not silent, "modules without a docstring saying their job:\n" + "\n".join(silent)


def test_docstring_lists_the_layers() -> None:
    listing = __doc__.split("``LAYERS`` the same)::", 1)[1].split("\n\n", 2)[1]
    listing = listing.replace(",\n", ", ")  # a layer too long for one line goes on after a comma
    documented = [
        {part.strip() for part in line.replace("and the package itself (acollect/__init__.py only re-exports)", "")
         .split(",") if part.strip()}
        for line in listing.splitlines()
    ]  # fmt: skip
    expected = [layer - {""} for layer in LAYERS]
    assert documented == expected, "the layer list of this module's docstring differs from LAYERS"


def test_no_class_chooses_its_class_in_new() -> None:
    # One rule for modes (STYLE.md): a class with a mode takes it in __init__ (RayCollector(sync=...),
    # DistributedCollector(sync=...)), or a plain function picks the class (RPCCollector); no __new__.
    found = sorted(
        f"{name}:{item.lineno} {node.name}.__new__"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__new__"
    )
    assert not found, "classes defining __new__ (give them a mode in __init__ instead):\n" + "\n".join(found)


# Classes besides CollectorBase that may define async_shutdown: class name -> why.
SHUTDOWN_DEFINERS_ALLOWED: dict[str, str] = {
    "InferenceServer": (
        "not a collector (no CollectorBase among its bases), so nothing it defines overrides the collectors' "
        "lifecycle: its own shutdown, under the one name everything in acollect is shut down with"
    ),
}


def _classes() -> Iterator[tuple[str, ast.ClassDef]]:
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                yield name, node


def _defines(node: ast.ClassDef, method: str) -> bool:
    """Whether the class body binds ``method``: a def, or an assignment (``async_shutdown = close``)."""
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method:
            return True
        if isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            if any(isinstance(t, ast.Name) and t.id == method for t in targets):
                return True
    return False


def test_only_the_base_defines_async_shutdown() -> None:
    # The rules of shutting down (any task, any number of times, at once; waiting calls wake with
    # ClosedCollectorError) live in CollectorBase.async_shutdown once; a collector adds its own steps
    # in _teardown, or through an option it was built with (RayCollector(shutdown_ray=True)).
    found = sorted(
        f"{name}:{node.lineno} {node.name}.async_shutdown"
        for name, node in _classes()
        if _defines(node, "async_shutdown") and node.name not in {"CollectorBase", *SHUTDOWN_DEFINERS_ALLOWED}
    )
    assert not found, "classes defining async_shutdown (put the step in _teardown instead):\n" + "\n".join(found)


def test_the_shutdown_allow_list_is_current() -> None:
    definers = {node.name for _, node in _classes() if _defines(node, "async_shutdown")}
    assert "CollectorBase" in definers, "CollectorBase.async_shutdown is gone: the test looks at nothing"
    stale = sorted(set(SHUTDOWN_DEFINERS_ALLOWED) - definers)
    assert not stale, f"remove these from SHUTDOWN_DEFINERS_ALLOWED, they define no async_shutdown: {stale}"
    bases = {node.name: {b.id for b in node.bases if isinstance(b, ast.Name)} for _, node in _classes()}
    collectors = {"CollectorBase"}
    while grown := {cls for cls, names in bases.items() if names & collectors} - collectors:
        collectors |= grown
    assert "RayCollector" in collectors  # the walk up the bases works
    overriding = sorted(set(SHUTDOWN_DEFINERS_ALLOWED) & collectors)
    assert not overriding, f"collector classes may not be allowed to override async_shutdown: {overriding}"


def _imports_of(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every module an ``import`` names (any package, at any depth of the body), with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.lineno, node.module


def test_only_the_runtime_imports_zmq() -> None:
    # ZeroMQ's errors become TransportError at one boundary, acollect/_runtime/; a module elsewhere that
    # used zmq itself would let ZMQError (and zmq.Again) out past it. Other packages use the runtime's
    # sockets: Endpoint, WorkerSocket, ServerSocket and Waiter.
    found = sorted(
        f"{name}:{line} imports {module}"
        for name, path in MODULES.items()
        if not name.startswith("acollect._runtime.")
        for line, module in _imports_of(ast.parse(path.read_text(encoding="utf-8")))
        if module.split(".")[0] == "zmq"
    )
    assert not found, "modules outside acollect/_runtime/ importing zmq:\n" + "\n".join(found)
    importers = {
        name
        for name, path in MODULES.items()
        if any(m.split(".")[0] == "zmq" for _, m in _imports_of(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert "acollect._runtime.endpoint" in importers  # the parser sees `import zmq`


# Classes besides CollectorBase that may define update_policy_weights_: class name -> why.
WEIGHT_UPDATERS_ALLOWED: dict[str, str] = {
    "InferenceServer": (
        "not a collector: it holds one policy, so it takes the base's first three parameters only (checked below), "
        "and refuses more than one of them through the same acollect._weights.updates.one_source"
    ),
}


def _method(node: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    found = [i for i in node.body if isinstance(i, (ast.FunctionDef, ast.AsyncFunctionDef)) and i.name == name]
    assert len(found) == 1, f"{node.name} defines {name} {len(found)} times"
    return found[0]


def _parameters(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, str, str]]:
    """(kind, name, default) of each parameter, as written: what a caller of the method may pass."""
    args = func.args
    out = [("positional", a.arg, "") for a in [*args.posonlyargs, *args.args]]
    for arg, default in zip(reversed(args.args), reversed(args.defaults), strict=False):
        index = out.index(("positional", arg.arg, ""))
        out[index] = ("positional", arg.arg, ast.unparse(default))
    for arg, kw_default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append(("keyword", arg.arg, "" if kw_default is None else ast.unparse(kw_default)))
    if args.vararg or args.kwarg:
        out.append(("variadic", "*args/**kwargs", ""))
    return out


def test_only_the_base_defines_update_policy_weights() -> None:
    # One signature, every keyword documented once, and the arguments checked once in CollectorBase; a collector
    # puts the weights in place in its _update_policy_weights hook (given an acollect._weights.updates.WeightUpdate).
    definers = {node.name: node for _, node in _classes() if _defines(node, "update_policy_weights_")}
    assert "CollectorBase" in definers, "CollectorBase.update_policy_weights_ is gone: the test looks at nothing"
    found = sorted(set(definers) - {"CollectorBase", *WEIGHT_UPDATERS_ALLOWED})
    assert not found, (
        "classes defining update_policy_weights_ (implement _update_policy_weights instead): " + ", ".join(found)
    )
    stale = sorted(set(WEIGHT_UPDATERS_ALLOWED) - set(definers))
    assert not stale, f"remove these from WEIGHT_UPDATERS_ALLOWED, they define no update_policy_weights_: {stale}"
    base = _parameters(_method(definers["CollectorBase"], "update_policy_weights_"))
    assert [p[1] for p in base[:4]] == ["self", "policy_or_weights", "policy", "weights"]
    for name in WEIGHT_UPDATERS_ALLOWED:
        own = _parameters(_method(definers[name], "update_policy_weights_"))
        assert own == base[: len(own)], f"{name}.update_policy_weights_ differs from CollectorBase's: {own}"


def test_one_source_of_weights_is_checked_in_one_place() -> None:
    phrase = "one source of weights"
    found = sorted(
        f"{name}:{lineno}"
        for name, path in MODULES.items()
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if phrase in line
    )
    assert len(found) == 1, (
        f"{phrase!r} should appear once in acollect/ (acollect._weights.updates.one_source), found {found}"
    )
    assert found[0].startswith("acollect._weights.updates:")
