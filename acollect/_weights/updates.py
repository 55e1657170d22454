"""Policy weights: what a push may hold, checked against the policy that runs, and versioned.

Every collector accepts the same three forms of weights: an ``nn.Module``, a TensorDict in
``TensorDict.from_module`` layout (nested keys) or a state dict (flat dotted keys, as
``module.state_dict()`` gives). :func:`as_weights` turns each into the nested TensorDict, and
:func:`check_push` checks a push against the *structure* (key -> shape, dtype) of the policy
that will receive it, before anything is sent, raising a :class:`ConfigurationError` that
names the keys and shapes at fault. A multi-process collector learns that structure from each
worker's ``hello`` (:func:`encode_structure`), so it is known with ``policy_factory`` too.

Weights of a wrapper's inner module are mapped onto the policy's keys when the match is exact
and unambiguous: the ``policy.module.state_dict()`` of a ``TensorDictModule`` policy gains the
``module.`` prefix, and a state dict with one extra leading prefix that the policy lacks (a
``DistributedDataParallel`` copy's ``module.``, a compiled module's ``_orig_mod.``) loses it.
Anything else that does not match key for key is refused.

For the in-process collector, weights handed over are *staged* (snapshotted, so the trainer may
keep training its own copy) and applied by the rollout thread at the next batch boundary, or at
once when no batch is in flight. The version counts updates; every frame of a batch carries the
version it was collected with.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict, TensorDictBase

from acollect._devices import cuda_ready, synchronize_devices, wait_ready
from acollect._validate import check_int, check_seconds
from acollect.errors import ConfigurationError, ProtocolError

if TYPE_CHECKING:
    from acollect._rollout.engine import Engine

__all__ = [
    "PolicyWeights",
    "WeightStructure",
    "WeightUpdate",
    "as_weights",
    "check_push",
    "check_weights",
    "decode_structure",
    "encode_structure",
    "one_source",
    "params_of",
    "streams_ready",
    "structure_of",
    "weights_of",
]

Weights = TensorDictBase | Mapping[str, torch.Tensor]
Key = tuple[str, ...]
#: The weights a policy holds: nested key -> (shape, dtype). Empty for a policy without weights.
WeightStructure = dict[Key, tuple[tuple[int, ...], torch.dtype]]

# A hello header is capped at 1 MiB (wire.DEFAULT_MAX_HEADER_BYTES); a structure past this size is not
# sent, and pushes to that worker are then only checked by the worker itself.
_MAX_STRUCTURE_BYTES = 1 << 18
_SHOWN = 6  # keys named in an error, at most, per kind of mismatch


def _dotted(key: Key) -> str:
    return ".".join(key)


def _listed(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    more = f" (and {len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else ""
    return f"{keys[:_SHOWN]}{more}"


def _leaves(td: TensorDictBase) -> list[tuple[Key, Any]]:
    return [((k,) if isinstance(k, str) else tuple(k), v) for k, v in td.items(include_nested=True, leaves_only=True)]


def as_weights(source: object, name: str = "policy_or_weights") -> TensorDictBase:
    """The weights in ``source`` as a TensorDict with nested keys (``TensorDict.from_module`` layout).

    A state dict's dotted keys (``"net.0.weight"``) become nested keys (``("net", "0", "weight")``),
    so a state dict and ``TensorDict.from_module`` of the same module give the same TensorDict.
    Tensors are not copied.

    Args:
        source: an ``nn.Module``, a TensorDict of weights, or a state dict.
        name: the argument named in errors.

    Raises:
        ConfigurationError: ``source`` holds something other than tensors, or a key twice.

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 1))
        >>> sorted(as_weights(net.state_dict()).keys(include_nested=True, leaves_only=True))
        [('0', 'bias'), ('0', 'weight')]
    """
    if isinstance(source, torch.nn.Module):
        return TensorDict.from_module(source)
    if isinstance(source, TensorDictBase):
        td = source
    elif isinstance(source, Mapping) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in source.items()
    ):
        td = TensorDict(dict(source), batch_size=[])
    else:
        raise ConfigurationError.bad_value(
            name, type(source).__name__, "an nn.Module, a TensorDict of weights or a state dict of tensors"
        )
    leaves = _leaves(td)
    if not any("." in part for key, _ in leaves for part in key):
        return td
    out = TensorDict(batch_size=[])
    seen: set[Key] = set()
    for key, value in leaves:
        nested = tuple(part for piece in key for part in piece.split("."))
        if nested in seen or not all(nested):
            raise ConfigurationError.bad_value(
                name, _dotted(key), "weights whose dotted keys name each tensor once (no empty parts)"
            )
        seen.add(nested)
        try:
            out.set(nested, value)
        except (KeyError, ValueError, RuntimeError) as exc:  # a key nested under another tensor's key
            raise ConfigurationError.bad_value(name, _dotted(key), f"weights with consistent keys ({exc})") from exc
    return out


def params_of(name: str, source: object) -> TensorDictBase:
    """The weights ``source`` holds (argument ``name``), checked; refused where there are none to take."""
    if source is None:  # nothing given, and no policy given at construction to take the weights of
        raise ConfigurationError.bad_value(
            name,
            None,
            "an nn.Module, a TensorDict of weights or a state dict (the collector was built without a "
            "policy holding weights: pass one)",
        )
    return as_weights(source, name)  # a state dict means the same as TensorDict.from_module


def streams_ready(models: Mapping[str, TensorDictBase]) -> tuple[Any, ...]:
    """What the calling thread queued on its CUDA streams before a push (a trainer's optimizer step on a side stream):
    the weights are copied to the host on another thread, whose streams nothing orders after the caller's."""
    return cuda_ready(leaf for td in models.values() for leaf in td.values(include_nested=True, leaves_only=True))


def one_source(**given: object) -> object:
    """The value of the one argument given (``None`` if none): more than one is refused, in this one place.

    ``update_policy_weights_`` of every collector (:class:`~acollect.collectors._base.CollectorBase`) and of the
    inference server takes its weights through here.
    """
    named = [name for name, value in given.items() if value is not None]
    if len(named) > 1:
        got = " and ".join(name if name == "policy_or_weights" else f"{name}=" for name in named)
        raise ConfigurationError(f"update_policy_weights_() takes one source of weights, got {got}")
    return given[named[0]] if named else None


@dataclass(frozen=True)
class WeightUpdate:
    """The arguments of one ``update_policy_weights_()`` call, checked (by :meth:`of`); a collector's hook gets it."""

    source: object  # a module or weights; None: the policy given at construction (or weights_dict holds them)
    weights_dict: Mapping[str, object] | None
    model_id: str
    worker_ids: tuple[int, ...] | None  # in range of the collector's workers: the collector checks that
    timeout: float

    @classmethod
    def of(
        cls,
        policy_or_weights: object,
        *,
        policy: object,
        weights: object,
        weights_dict: object,
        model_id: object,
        worker_ids: object,
        timeout: object,
    ) -> WeightUpdate:
        given = {"policy_or_weights": policy_or_weights, "policy": policy, "weights": weights}
        source = one_source(**given, weights_dict=weights_dict)
        if weights_dict is not None and (not isinstance(weights_dict, Mapping) or not weights_dict):
            raise ConfigurationError.bad_value("weights_dict", weights_dict, "a non-empty dict model id -> weights")
        if not isinstance(model_id, str) or not model_id:
            raise ConfigurationError.bad_value("model_id", model_id, "a non-empty str such as 'policy'")
        if worker_ids is not None and (isinstance(worker_ids, (str, bytes)) or not isinstance(worker_ids, Iterable)):
            raise ConfigurationError.bad_value("worker_ids", worker_ids, "None (every worker) or a list of worker ids")
        ids = None if worker_ids is None else tuple(check_int("worker_ids", wid) for wid in worker_ids)
        dict_ = weights_dict if isinstance(weights_dict, Mapping) else None
        return cls(None if dict_ else source, dict_, model_id, ids, check_seconds("timeout", timeout))

    def models(self, default: object) -> dict[str, tuple[str, object]]:
        """model id -> (the argument it came from, for errors; module or weights), ``default`` if none given."""
        if self.weights_dict is not None:
            return {str(k): (f"weights_dict[{k!r}]", v) for k, v in self.weights_dict.items()}
        return {self.model_id: ("policy_or_weights", default if self.source is None else self.source)}

    def for_workers(
        self, default: object, num_workers: int
    ) -> tuple[dict[str, TensorDictBase], list[int], tuple[Any, ...]]:
        """The weights by model id (``default``'s where none were given), the workers they go to (checked against
        ``num_workers``), and what the calling thread queued on its CUDA streams up to now (before anything awaits:
        see :func:`streams_ready`)."""
        models = {model_id: params_of(arg, source) for model_id, (arg, source) in self.models(default).items()}
        ids = list(range(num_workers)) if self.worker_ids is None else list(self.worker_ids)
        for wid in ids:
            check_int("worker_ids", wid, maximum=num_workers - 1)
        return models, ids, streams_ready(models)

    def policy_only(self, default: object, why: str) -> object:
        """The source for a collector with one policy and no workers to pick from (``why`` says so)."""
        if self.worker_ids is not None:
            raise ConfigurationError.bad_value("worker_ids", list(self.worker_ids), f"None: {why}")
        models = self.models(default)
        if set(models) != {"policy"}:
            name = "weights_dict" if self.weights_dict is not None else "model_id"
            raise ConfigurationError.bad_value(name, sorted(models), f"'policy' only: {why}")
        return models["policy"][1]


def structure_of(source: object) -> WeightStructure:
    """The structure of the weights in ``source`` (a module or weights); ``{}`` if it holds none.

    Examples:
        >>> structure_of(torch.nn.Linear(2, 1))
        {('weight',): ((1, 2), torch.float32), ('bias',): ((1,), torch.float32)}
    """
    if not isinstance(source, (torch.nn.Module, TensorDictBase, Mapping)):
        return {}
    return {key: (tuple(t.shape), t.dtype) for key, t in _leaves(as_weights(source, "source"))}


def encode_structure(source: object) -> list[list[Any]] | None:
    """``source``'s structure as msgpack-able ``[[key parts, shape, dtype], ...]`` (a ``hello`` field).

    ``None`` when it would be too large for a message header (the receiver then cannot check pushes).
    """
    structure = structure_of(source)
    size = sum(16 + 8 * len(shape) + sum(len(k) + 2 for k in key) for key, (shape, _) in structure.items())
    if size > _MAX_STRUCTURE_BYTES:
        return None
    return [[list(key), list(shape), str(dtype).removeprefix("torch.")] for key, (shape, dtype) in structure.items()]


def decode_structure(value: object) -> WeightStructure | None:
    """Reads a structure a worker sent (:func:`encode_structure`); ``None`` if it sent none.

    Raises:
        ProtocolError: the value is malformed.
    """
    if value is None:
        return None
    if not isinstance(value, list):
        raise ProtocolError(f"weights structure is a {type(value).__name__}, expected a list")
    out: WeightStructure = {}
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ProtocolError(f"weights structure entry {entry!r:.100} is not [key, shape, dtype]")
        key, shape, dtype_name = entry
        if not (isinstance(key, list) and key and all(isinstance(k, str) for k in key)):
            raise ProtocolError(f"weights structure key {key!r:.100} is not a non-empty list of str")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ProtocolError(f"weights structure shape {shape!r:.100} is not a list of ints >= 0")
        dtype = getattr(torch, dtype_name, None) if isinstance(dtype_name, str) else None
        if not isinstance(dtype, torch.dtype):
            raise ProtocolError(f"weights structure dtype {dtype_name!r:.100} is no torch dtype")
        out[tuple(key)] = (tuple(shape), dtype)
    return out


def _prefix_maps(given: set[Key], expected: set[Key]) -> tuple[int, Key] | None:
    """How ``given`` keys become ``expected`` ones: ``(n, prefix)`` drops ``n`` leading parts, then adds ``prefix``."""
    if not given or not expected or len(given) != len(expected):
        return None

    def common(keys: set[Key]) -> Key:
        first, *rest = keys
        n = min(len(k) for k in keys) - 1  # a whole key is never a prefix
        for key in rest:
            n = next((i for i in range(n) if key[i] != first[i]), n)
        return first[:n]

    # The wrapper's prefix is missing from the given keys (TensorDictModule: "module.")...
    wrap = common(expected)
    for n in range(1, len(wrap) + 1):
        if {wrap[:n] + k for k in given} == expected:
            return 0, wrap[:n]
    # ...or the given keys carry one the policy lacks (DistributedDataParallel: "module.").
    extra = common(given)
    for n in range(1, len(extra) + 1):
        if {k[n:] for k in given} == expected:
            return n, ()
    return None


def check_weights(weights: TensorDictBase, expected: WeightStructure, *, what: str = "the policy") -> TensorDictBase:
    """Checks ``weights`` (nested keys) against ``expected``; returns them, re-keyed if a prefix was mapped.

    Raises:
        ConfigurationError: naming the missing and unexpected keys, or the tensors whose shape or
            dtype differ (expected vs given).

    Examples:
        >>> net = torch.nn.Linear(2, 1)
        >>> check_weights(as_weights({"weight": torch.ones(1, 3), "bias": torch.ones(1)}), structure_of(net))
        Traceback (most recent call last):
        ...
        acollect.errors.ConfigurationError: weights for the policy do not fit it: weight: expected float32 [1, 2], ...
    """
    leaves = dict(_leaves(weights))
    given, wanted = set(leaves), set(expected)
    if given != wanted:
        mapping = _prefix_maps(given, wanted)
        if mapping is None:
            missing = [_dotted(k) for k in wanted - given]
            unexpected = [_dotted(k) for k in given - wanted]
            parts = [f"missing keys {_listed(missing)}"] if missing else []
            parts += [f"unexpected keys {_listed(unexpected)}"] if unexpected else []
            hint = " (it holds no weights)" if not expected else ""
            raise ConfigurationError(
                f"weights for {what}{hint} do not fit it: {'; '.join(parts)}. Pass the weights of the module the "
                "collector runs: module.state_dict(), TensorDict.from_module(module) or the module itself."
            )
        drop, prefix = mapping
        leaves = {prefix + key[drop:]: value for key, value in leaves.items()}
        weights = TensorDict(batch_size=[])
        for key, value in leaves.items():
            weights.set(key, value)
    wrong = []
    for key, value in leaves.items():
        shape, dtype = expected[key]
        if tuple(value.shape) != shape or value.dtype != dtype:
            name = lambda d: str(d).removeprefix("torch.")  # noqa: E731
            wrong.append(
                f"{_dotted(key)}: expected {name(dtype)} {list(shape)}, given {name(value.dtype)} {list(value.shape)}"
            )
    if wrong:
        more = f" (and {len(wrong) - _SHOWN} more)" if len(wrong) > _SHOWN else ""
        raise ConfigurationError(f"weights for {what} do not fit it: {'; '.join(wrong[:_SHOWN])}{more}.")
    return weights


def _sub_structure(structure: WeightStructure, model_id: str) -> WeightStructure | None:
    """The part of the policy's structure that ``model_id`` names (``None``: not a part of the policy)."""
    head, _, rest = model_id.partition(".")
    if head != "policy":
        return None  # e.g. "env.<attr>": only the worker knows it
    path = tuple(rest.split(".")) if rest else ()
    n = len(path)
    return {key[n:]: meta for key, meta in structure.items() if key[:n] == path and len(key) > n}


def check_push(models: Mapping[str, object], structures: Iterable[WeightStructure | None]) -> dict[str, TensorDictBase]:
    """Normalises the weights of a push and checks them against the policy of every receiver.

    Call it before anything is sent: a push it refuses changes nothing, and the collector stays usable.

    Args:
        models: model id (``"policy"``, ``"policy.<attr>"``, ``"env.<attr>"``) -> an ``nn.Module``, a
            TensorDict of weights or a state dict.
        structures: the structure of the policy each receiver runs (``None``: unknown, not checked),
            e.g. as each worker reported it in its ``hello``.

    Returns:
        model id -> the weights as a TensorDict keyed exactly as the receivers' policy.

    Raises:
        ConfigurationError: weights of the wrong form, or that do not fit a receiver's policy (the
            message names the keys, shapes and dtypes at fault).

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 1))
        >>> pushed = check_push({"policy": net.state_dict()}, [structure_of(net)])
        >>> sorted(pushed["policy"].keys(include_nested=True, leaves_only=True))
        [('0', 'bias'), ('0', 'weight')]
    """
    distinct: list[WeightStructure] = []
    for structure in structures:
        if structure is not None and structure not in distinct:
            distinct.append(structure)
    out: dict[str, TensorDictBase] = {}
    for model_id, source in models.items():
        name = "policy_or_weights" if model_id == "policy" else f"weights_dict[{model_id!r}]"
        weights = as_weights(source, name)
        what = "the policy" if model_id == "policy" else f"model {model_id!r} of the policy"
        keys: set[Key] | None = None
        checked = weights
        for structure in distinct:
            expected = _sub_structure(structure, model_id)
            if expected is None:
                continue
            checked = check_weights(weights, expected, what=what)
            found = {k for k, _ in _leaves(checked)}
            if keys is not None and found != keys:
                raise ConfigurationError(f"the workers run policies of different structures: cannot push {what}")
            keys = found
        out[model_id] = checked
    return out


def weights_of(
    source: object, target: torch.nn.Module | None, structure: WeightStructure | None = None
) -> Weights | None:
    """A checked snapshot of the weights in ``source``, or ``None`` when ``source`` *is* ``target``.

    Args:
        source: an ``nn.Module``, a TensorDict of weights, or a state dict.
        target: the module the collector runs, if known.
        structure: what the weights must fit (``None``: ``target``'s structure, if known).

    Raises:
        ConfigurationError: ``source`` holds no weights, or they do not fit the policy.
    """
    if source is not None and source is target:
        return None  # the collector runs this very module: nothing to copy
    if source is None or not isinstance(source, (torch.nn.Module, TensorDictBase, Mapping)):
        raise ConfigurationError.bad_value(
            "policy_or_weights",
            source,
            "an nn.Module, a TensorDict of weights or a state dict (the collector was built without a policy "
            "holding weights: pass one)",
        )
    if structure is None and target is not None:
        structure = structure_of(target)
    weights = check_push({"policy": source}, [structure])["policy"]
    with torch.no_grad():
        return weights.detach().clone()


class PolicyWeights:
    """Staged weights and the version counter of one collector."""

    def __init__(self) -> None:
        self.version = 0
        # The weights staged, and the events their copy was queued before on the stager's streams.
        self._pending: tuple[Weights, tuple[Any, ...]] | None = None
        self._lock = threading.Lock()

    def stage(self, weights: Weights | None, *, bump: bool = True) -> int:
        """Keeps ``weights`` for the next batch boundary, bumps the version and returns it.

        Call it on the thread that made ``weights`` (:func:`weights_of`): a copy of CUDA weights may still be
        queued on that thread's streams, and the rollout thread reads them only once it is done.
        """
        ready = cuda_ready(value for _, value in _leaves(as_weights(weights))) if weights is not None else ()
        with self._lock:
            if weights is not None:
                self._pending = (weights, ready)
            if bump:
                self.version += 1
            return self.version

    def apply_pending(self, engine: Engine) -> None:
        """Copies staged weights into the engine's policy and stamps the version. Call between batches.

        Nothing changes while the engine holds a batch an interruption left half-way: one version chooses
        every frame of a batch, so the weights wait for the batch after it.
        """
        if engine.in_batch:
            return
        with self._lock:
            pending, self._pending = self._pending, None
            version = self.version
        if pending is not None:
            weights, ready = pending
            module = engine.policy.weights_module
            if module is None:
                raise ConfigurationError.bad_value(
                    "policy_or_weights", type(weights).__name__, "a collector whose policy is an nn.Module"
                )
            load_weights(module, weights, ready)
        engine.policy_version = version


def load_weights(module: torch.nn.Module, weights: Any, ready: tuple[Any, ...] = (), *, checked: bool = False) -> None:
    """Copies ``weights`` (module, TensorDict or state dict) into ``module``'s tensors in place, landed before it
    returns: how every policy in this process takes new weights (the in-process collector's, an inference server's).

    Args:
        module: the policy's module.
        weights: what to copy.
        ready: the events of :func:`~acollect._devices.cuda_ready` the stager recorded as it handed CUDA weights
            over: they are read only once the work queued before them (their own copy) is done.
        checked: ``weights`` is a TensorDict checked against ``module`` already (:func:`check_weights`).

    Raises:
        ConfigurationError: the weights do not fit ``module`` (nothing is copied then).
    """
    if not checked:
        weights = check_weights(as_weights(weights), structure_of(module))
    wait_ready(ready)
    with torch.no_grad():
        dest = TensorDict.from_module(module)
        dest.update_(weights)  # leaf by leaf, each onto its parameter's device
    # Landed before this returns: the next pass may run on another thread, whose streams nothing orders after it.
    synchronize_devices(dest.values(include_nested=True, leaves_only=True))
