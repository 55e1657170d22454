"""Policies: whatever the user hands in, turned into one calling convention.

A collector accepts

* a ``tensordict.nn.TensorDictModule`` / ``TensorDictSequential`` (reads its
  ``in_keys``, writes its ``out_keys``, ``"action"`` among them);
* a plain ``torch.nn.Module``: called with the env's observation tensors (in
  observation-spec order) and returning the action;
* any callable taking a TensorDict and returning a TensorDict with ``"action"``;
* ``None``: a uniform random policy over the action spec;
* or, instead of ``policy``, a ``policy_factory``: a zero-argument callable
  that builds the policy where it runs (e.g. inside a worker process).

:func:`wrap_policy` turns each into a :class:`PolicyAdapter`, whose call
returns a small ``{key: tensor}`` mapping of the policy's outputs. The plain
module path never touches a TensorDict, which keeps the hot loop lean.

A policy that fails because an observation's float dtype is not its parameters'
(a float64 observation meeting a float32 ``nn.Linear``) raises a
:class:`~acollect.errors.PolicyError` naming the key, both dtypes and the fix
(:func:`dtype_mismatch`), in place of torch's ``mat1 and mat2 must have the same
dtype``; the ``try`` around the call costs nothing until it raises.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from acollect._devices import Devices, resolve_devices
from acollect.errors import ConfigurationError, PolicyError
from acollect.specs import Composite, TensorSpec

if TYPE_CHECKING:
    from acollect.envs import EnvBase

__all__ = [
    "CallablePolicy",
    "ModulePolicy",
    "PolicyAdapter",
    "RandomPolicy",
    "SplitPolicy",
    "TensorDictPolicy",
    "build_policy",
    "check_policy_outputs",
    "dtype_mismatch",
    "parse_exploration_type",
    "unseeded_generator",
    "wrap_policy",
]

NestedKey = str | tuple[str, ...]
PolicyLike = TensorDictModuleBase | torch.nn.Module | Callable[[TensorDictBase], TensorDictBase] | None


def _as_tuple(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


# What torch says when a float dtype meets another: "mat1 and mat2 must have the same dtype", "Input type
# (double) and bias type (float) should be the same", "mixed dtype (CPU): all inputs must share same datatype",
# "RNN input dtype (torch.float64) does not match weight dtype", "expected scalar type Float but found Double".
_DTYPE_WORDS = re.compile(r"dtype|datatype|scalar type|type \(", re.IGNORECASE)


def _parameters_dtype(module: object) -> torch.dtype:
    """The float dtype of ``module``'s parameters (torch's default where it has none: a plain callable)."""
    if isinstance(module, torch.nn.Module):
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
    return torch.get_default_dtype()


def dtype_mismatch(exc: Exception, inputs: Iterable[tuple[NestedKey, object]], module: object) -> PolicyError | None:
    """The :class:`~acollect.errors.PolicyError` to raise for ``exc`` where it is a float dtype mismatch between an
    observation in ``inputs`` and ``module``'s parameters; ``None`` where it is anything else.

    Examples:
        >>> net = torch.nn.Linear(3, 2)
        >>> obs = torch.zeros(4, 3, dtype=torch.float64)
        >>> try:
        ...     net(obs)
        ... except RuntimeError as exc:
        ...     print(dtype_mismatch(exc, [("observation", obs)], net))  # doctest: +ELLIPSIS
        the policy cannot read 'observation' of dtype torch.float64: its parameters are torch.float32 (...
    """
    if not isinstance(exc, (RuntimeError, ValueError)) or not _DTYPE_WORDS.search(str(exc)):
        return None
    expected = _parameters_dtype(module)
    odd = [
        (key, value.dtype)
        for key, value in inputs
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != expected
    ]
    if not odd:
        return None
    key, got = odd[0]
    name = key if isinstance(key, str) else key[0] if len(key) == 1 else tuple(key)
    if got == torch.float64 and expected == torch.float32:
        fix = (
            "Make the observations float32 where the env makes them: a gymnasium env through GymEnv does so by "
            "default (double_to_float=True); a TorchRL env takes the DoubleToFloat() transform; an env of your own "
            "declares float32 in its observation_spec. Or cast in the policy: observation.float()."
        )
    else:
        fix = (
            f"Make the observations {expected} where the env makes them (its observation_spec), or cast in the "
            f"policy: observation.to({expected}); or make the policy {got}: policy.to({got})."
        )
    more = f" ({len(odd) - 1} more keys too)" if len(odd) > 1 else ""
    return PolicyError(
        f"the policy cannot read {name!r} of dtype {got}{more}: its parameters are {expected} "
        f"({type(exc).__name__} from the policy: {exc}). {fix}"
    )


class PolicyAdapter:
    """One calling convention for every kind of policy.

    Attributes:
        module: the wrapped object (its weights are what weight updates target).
    """

    module: Any = None
    #: whether the policy only reads its input: the engine then hands it its own buffers, not a shallow copy
    #: (a policy that sets or replaces entries would detach them)
    reads_input_only: bool = False

    def __call__(self, td: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        """Runs the policy on ``td`` (observations and done flags) and returns its outputs."""
        raise NotImplementedError

    @property
    def weights_module(self) -> torch.nn.Module | None:
        """The ``nn.Module`` holding the weights, if any."""
        return self.module if isinstance(self.module, torch.nn.Module) else None

    def close(self) -> None:
        """Frees what the policy holds besides its module (a remote policy's connection); idempotent."""


@runtime_checkable
class SplitPolicy(Protocol):
    """A policy whose call splits in two: the observations go out, the actions come back later.

    An inference server's client (:class:`~acollect.inference.client.RemotePolicy`) is one. A worker whose envs
    step in groups (:class:`~acollect._rollout.groups.EngineGroups`) sends one group's observations, steps the other
    groups meanwhile, and then takes the first group's actions.

    Examples:
        >>> class Echo:
        ...     def submit(self, td):
        ...         self.td = td
        ...     def receive(self):
        ...         return {"action": self.td["observation"]}
        ...     def answer_fileno(self):
        ...         return None
        >>> isinstance(Echo(), SplitPolicy)
        True
    """

    def submit(self, td: TensorDictBase) -> None:
        """Sends the observations of ``td`` (a step's first half)."""
        ...

    def receive(self) -> dict[NestedKey, torch.Tensor]:
        """The outputs for the observations last submitted (blocking)."""
        ...

    def answer_fileno(self) -> int | None:
        """A descriptor that turns readable when the answer may have come (``None``: none to wait on)."""
        ...


def unseeded_generator() -> torch.Generator:
    """A CPU generator seeded from fresh OS entropy: what random actions draw from until a seed is given.

    ``torch.Generator()`` alone starts from one fixed seed, the same in every process: each worker's random
    actions (and each run's) would be the same sequence. Seeded from entropy, two generators never repeat each
    other, as gymnasium's unseeded spaces; ``set_seed`` makes them reproducible (``manual_seed``).

    Examples:
        >>> unseeded_generator().initial_seed() != unseeded_generator().initial_seed()
        True
    """
    generator = torch.Generator()
    generator.seed()  # std::random_device: distinct in every process and every call
    return generator


class RandomPolicy(PolicyAdapter):
    """Samples actions uniformly from the action spec (every action key of a composite one).

    Args:
        action_spec: the env's action spec.
        batch_size: the env batch size (``[n_envs]``).
        generator: a private generator, so seeding it does not touch torch's global RNG; ``None``: one seeded
            from fresh entropy (:func:`unseeded_generator`), until the engine's ``seed`` seeds it.

    Examples:
        >>> from acollect.specs import Categorical
        >>> policy = RandomPolicy(Categorical(n=3), batch_size=(4,))
        >>> policy(None)["action"].shape
        torch.Size([4])
        >>> agents = RandomPolicy(Composite(agents=Composite(action=Categorical(n=3, shape=(2,)))), batch_size=(4,))
        >>> agents(None)["agents", "action"].shape
        torch.Size([4, 2])
    """

    reads_input_only = True

    def __init__(
        self,
        action_spec: TensorSpec | Composite,
        batch_size: Sequence[int],
        generator: torch.Generator | None = None,
    ) -> None:
        self.action_spec = action_spec
        self.batch_size = tuple(batch_size)
        self.generator = generator if generator is not None else unseeded_generator()

    def __call__(self, td: TensorDictBase | None) -> dict[NestedKey, torch.Tensor]:
        spec = self.action_spec
        if isinstance(spec, Composite):  # one draw per leaf, in the spec's order: a seed gives the same actions
            return {key: leaf.rand(self.batch_size, self.generator) for key, leaf in spec.leaf_items()}
        return {"action": spec.rand(self.batch_size, self.generator)}


class TensorDictPolicy(PolicyAdapter):
    """Wraps a ``TensorDictModuleBase``: reads ``in_keys``, returns ``out_keys``."""

    def __init__(self, module: TensorDictModuleBase) -> None:
        self.module = module
        self.out_keys: list[NestedKey] = list(module.out_keys)

    def __call__(self, td: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        try:
            out = self.module(td)
        except (RuntimeError, ValueError) as exc:
            keys = getattr(self.module, "in_keys", ())
            error = dtype_mismatch(exc, ((k, td.get(k, None)) for k in keys), self.module)
            if error is None:
                raise
            raise error from exc
        if out is None:
            out = td
        found = {}
        for key in self.out_keys:
            value = out.get(key, None)
            if value is not None:  # an output the module did not write this time is left out
                found[key] = value
        return found


class ModulePolicy(PolicyAdapter):
    """Wraps a plain ``nn.Module``: observation tensors in, ``"action"`` out."""

    reads_input_only = True

    def __init__(self, module: torch.nn.Module, in_keys: Sequence[NestedKey]) -> None:
        self.module = module
        self.in_keys = list(in_keys)
        self._single = self.in_keys[0] if len(self.in_keys) == 1 else None

    def __call__(self, td: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        try:
            if self._single is not None:
                action = self.module(td.get(self._single))
            else:
                action = self.module(*(td.get(k) for k in self.in_keys))
        except (RuntimeError, ValueError) as exc:
            error = dtype_mismatch(exc, ((k, td.get(k, None)) for k in self.in_keys), self.module)
            if error is None:
                raise
            raise error from exc
        if not isinstance(action, torch.Tensor):
            raise PolicyError(
                f"{type(self.module).__name__}.forward returned {type(action).__name__}: a plain nn.Module "
                "policy must return the action tensor (wrap it in a TensorDictModule to return more outputs)."
            )
        return {"action": action}


class CallablePolicy(PolicyAdapter):
    """Wraps a callable ``TensorDict -> TensorDict`` writing ``"action"`` (and possibly more)."""

    def __init__(self, fn: Callable[[TensorDictBase], TensorDictBase], input_keys: Sequence[NestedKey]) -> None:
        self.module = fn
        # Specs name keys as tuples (``("observation",)``), TensorDicts list top-level ones as strings: compare
        # both as tuples, or every observation would pass for a policy output and be copied a second time.
        self._input_keys = {_as_tuple(k) for k in input_keys}
        self.out_keys: list[NestedKey] | None = None

    def __call__(self, td: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        try:
            out = self.module(td)
        except (RuntimeError, ValueError) as exc:
            error = dtype_mismatch(exc, ((k, td.get(k, None)) for k in sorted(self._input_keys)), self.module)
            if error is None:
                raise
            raise error from exc
        if not isinstance(out, TensorDictBase):
            out = td if out is None else out
        if not isinstance(out, TensorDictBase):
            raise PolicyError(
                f"policy returned {type(out).__name__}: expected a TensorDict holding 'action' "
                "(or None after writing 'action' into its input)."
            )
        if self.out_keys is None:
            self.out_keys = [
                k for k in out.keys(include_nested=True, leaves_only=True) if _as_tuple(k) not in self._input_keys
            ]
        return {key: out.get(key) for key in self.out_keys}


def wrap_policy(
    policy: PolicyLike,
    *,
    observation_keys: Sequence[NestedKey],
    action_spec: TensorSpec | Composite,
    batch_size: Sequence[int],
    done_keys: Sequence[NestedKey] = ("done", "terminated", "truncated"),
) -> PolicyAdapter:
    """Turns any accepted policy into a :class:`PolicyAdapter`.

    Args:
        policy: the policy (see the module docstring), or ``None`` for random actions.
        observation_keys: the env's observation keys, in spec order.
        action_spec: the env's action spec (for ``None``).
        batch_size: the env batch size.
        done_keys: keys the env writes besides observations (not policy outputs).

    Returns:
        The adapter.

    Raises:
        ConfigurationError: ``policy`` is none of the accepted kinds.

    Examples:
        >>> import torch
        >>> from acollect.specs import Categorical
        >>> net = torch.nn.Linear(4, 2)
        >>> adapter = wrap_policy(net, observation_keys=["observation"], action_spec=Categorical(2), batch_size=(1,))
        >>> type(adapter).__name__
        'ModulePolicy'
    """
    if policy is None:
        return RandomPolicy(action_spec, batch_size)
    if isinstance(policy, PolicyAdapter):
        return policy
    if isinstance(policy, TensorDictModuleBase):
        return TensorDictPolicy(policy)
    if isinstance(policy, torch.nn.Module):
        return ModulePolicy(policy, observation_keys)
    if callable(policy):
        return CallablePolicy(policy, [*observation_keys, *done_keys])
    raise ConfigurationError.bad_value(
        "policy",
        policy,
        "a TensorDictModule, an nn.Module, a callable on TensorDicts, or None for a random policy",
    )


def parse_exploration_type(value: InteractionType | str | None) -> InteractionType | None:
    """Parses ``exploration_type`` into tensordict's ``InteractionType``.

    Examples:
        >>> parse_exploration_type("mode").name
        'MODE'
    """
    if value is None or isinstance(value, InteractionType):
        return value
    if isinstance(value, str):
        try:
            return InteractionType[value.upper()]
        except KeyError:
            pass
    names = ", ".join(t.name for t in InteractionType)
    raise ConfigurationError.bad_value("exploration_type", value, f"None or one of {names}")


def place_policy(policy: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The policy on ``device``: itself if it is there already, else a copy moved there.

    A copy, so the caller's own module (say the one it trains, on another device) is never moved.
    """
    for tensor in (*policy.parameters(), *policy.buffers()):
        if tensor.device != device:
            return copy.deepcopy(policy).to(device)
    return policy


def action_outputs(
    outputs: Mapping[NestedKey, torch.Tensor], action_spec: TensorSpec | Composite
) -> list[tuple[NestedKey, TensorSpec]]:
    """The policy's output key of each action key, with its spec (``"action"`` alone for a plain action spec).

    A policy may name a nested key as a tuple or, at the top level, as a string: the key is the policy's own.

    Raises:
        PolicyError: an action key is missing, naming what the policy wrote instead.

    Examples:
        >>> from acollect.specs import Categorical
        >>> spec = Composite(agents=Composite(action=Categorical(3)))
        >>> [key for key, _ in action_outputs({("agents", "action"): torch.zeros(1)}, spec)]
        [('agents', 'action')]
    """
    by_tuple = {_as_tuple(key): key for key in outputs}
    leaves = action_spec.leaf_items() if isinstance(action_spec, Composite) else [(("action",), action_spec)]
    found = []
    for key, spec in leaves:
        if key not in by_tuple:
            name = key[0] if len(key) == 1 else key
            raise PolicyError(
                f"the policy did not write {name!r} (it wrote {sorted(map(str, outputs))}): a policy must "
                f"write the action it takes under each of the env's action keys {_names(action_spec)}."
            )
        found.append((by_tuple[key], spec))
    return found


def _names(action_spec: TensorSpec | Composite) -> list[NestedKey]:
    if not isinstance(action_spec, Composite):
        return ["action"]
    return [key[0] if len(key) == 1 else key for key in action_spec.leaf_keys()]


def check_policy_outputs(
    outputs: Mapping[NestedKey, torch.Tensor], n_envs: int, action_spec: TensorSpec | Composite
) -> None:
    """Raises :class:`~acollect.errors.PolicyError` naming what is wrong with a policy's first outputs."""
    for key, spec in action_outputs(outputs, action_spec):
        _check_action(key, outputs[key], n_envs, spec)
    for key, value in outputs.items():
        if value.shape[:1] != (n_envs,):
            raise PolicyError(
                f"the policy wrote {key!r} of shape {tuple(value.shape)}: expected a leading batch dim of "
                f"{n_envs} (one entry per env)."
            )


def _check_action(key: NestedKey, action: torch.Tensor, n_envs: int, spec: TensorSpec) -> None:
    expected = (n_envs, *spec.shape)
    if tuple(action.shape) != expected:
        raise PolicyError(
            f"the policy wrote an {key!r} of shape {tuple(action.shape)}: expected {expected} "
            f"([n_envs, *action_spec.shape] for {spec})."
        )
    if not spec.dtype.is_floating_point:
        # Once, here: a discrete action out of range is a policy bug (a float one may be clipped by the env,
        # and is then the env's business). Later steps rely on the env's own check (see GymEnv).
        rows = torch.nonzero(spec.outside(action.detach()).reshape(n_envs, -1).any(-1)).flatten().tolist()
        if rows:
            raise PolicyError(
                f"the policy wrote an {key!r} outside the action space: {action[rows[0]].tolist()!r} for env "
                f"{rows[0]}{f' (and {len(rows) - 1} more)' if len(rows) > 1 else ''}; expected values in "
                f"action_spec {spec}."
            )


def build_policy(
    env: EnvBase, *, policy: Any, policy_factory: Callable[[], Any] | None, devices: Mapping[str, Any]
) -> tuple[PolicyAdapter, Devices]:
    """Builds the policy (given, or built by ``policy_factory``) for ``env``, resolves the devices, wraps it.

    The one place a policy is placed and wrapped: the one engine builder
    (:func:`~acollect._rollout.build.build_engine`) calls it for every engine.
    """
    if policy_factory is not None:
        policy = policy_factory()
    resolved = resolve_devices(**devices, env_default=env.device, policy=policy)
    if isinstance(policy, torch.nn.Module):
        policy = place_policy(policy, resolved.policy)
    adapter = wrap_policy(
        policy,
        observation_keys=env.observation_spec.leaf_keys(),
        action_spec=env.action_spec,
        batch_size=env.batch_size,
    )
    return adapter, resolved
