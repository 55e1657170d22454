"""How :class:`~acollect.envs._gym.GymEnv` writes a step: cached numpy views, and sub-envs stepped one by one.

:class:`Binding` holds numpy views of the leaves of one ``(next_out, root_out)``
pair of TensorDicts, so a step writes with numpy and touches no TensorDict; the
EnvPool adapter (:mod:`acollect.envs._envpool`) writes through it too, and shares
:func:`reshape_action`.

:func:`step_sub_envs` steps the sub-envs of a plain ``SyncVectorEnv`` itself,
one after the other, as the vector env would, and writes each result straight
into those views: a finished sub-env's observation *is* its true final
observation, and it is reset at once with ``env.reset()``, as gymnasium's own
autoreset resets it. This skips what the vector env adds around its sub-envs
(merging info dicts, stacking observations, copying final observations into
the info), which costs about as much as the CartPole steps themselves, and it
never makes a no-op autoreset step, whatever the vector env's autoreset mode.

:class:`ActionBounds` tells a policy whose continuous actions leave their ``Box``
(a Gaussian's samples do), once, without changing the action.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from acollect._warnings import ActionSpaceWarning, warn
from acollect.envs._base import DONE_KEYS
from acollect.envs._gym_spaces import ObsLeaf, pick_leaf
from acollect.errors import PolicyError
from acollect.specs import Bounded, TensorSpec

__all__ = ["ActionBounds", "Binding", "ResetFailedError", "reshape_action", "step_one", "step_sub_envs", "write_row"]


class Binding:
    """Numpy views of the leaves of one (next_out, root_out) pair, cached across steps.

    CPU tensors are written through numpy views of their memory (a numpy copy
    costs a fraction of a torch op); other tensors get a numpy staging array
    copied over with :meth:`flush` once per step.

    Args:
        leaves: the observation leaves, in the env's order.
        n_envs: the number of sub-envs.
        next_td: the TensorDict a step writes its result into (``make_next()``).
        root_td: the TensorDict the next step starts from (``make_root()``).
    """

    __slots__ = (
        "done",
        "flat",
        "flush_pairs",
        "next_obs",
        "next_td",
        "obs_pairs",
        "reward",
        "root_flags",
        "root_obs",
        "root_td",
        "terminated",
        "truncated",
    )

    def __init__(
        self, leaves: Sequence[ObsLeaf], n_envs: int, next_td: TensorDictBase, root_td: TensorDictBase
    ) -> None:
        n = n_envs
        self.next_td, self.root_td = next_td, root_td
        self.flush_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.next_obs = [self._view(next_td, leaf.key, None) for leaf in leaves]
        self.root_obs = [self._view(root_td, leaf.key, None) for leaf in leaves]
        self.obs_pairs = list(zip(self.next_obs, self.root_obs, strict=True))
        #: one leaf at the root of the observation: written without picking it out of a nested one
        self.flat = len(leaves) == 1 and leaves[0].path == ()
        self.reward = self._view(next_td, "reward", (n,))
        self.done, self.terminated, self.truncated = (self._view(next_td, k, (n,)) for k in DONE_KEYS)
        self.root_flags = [self._view(root_td, k, (n,)) for k in DONE_KEYS]

    def _view(self, td: TensorDictBase, key: Any, shape: tuple[int, ...] | None) -> np.ndarray:
        tensor = td.get(key)
        if tensor is None:
            raise KeyError(f"missing {key!r}: build the TensorDicts with make_next() / make_root()")
        shape = tuple(tensor.shape) if shape is None else shape
        if tensor.device.type == "cpu" and tensor.is_contiguous() and not tensor.requires_grad:
            try:
                return tensor.numpy().reshape(shape)
            except TypeError:  # a dtype numpy lacks (bfloat16): stage it instead
                pass
        stage = torch.empty(tensor.shape, dtype=tensor.dtype if tensor.dtype != torch.bfloat16 else torch.float32)
        self.flush_pairs.append((tensor, stage))
        return stage.numpy().reshape(shape)

    def flush(self) -> None:
        """Copies the staging arrays into tensors numpy cannot view (another device, bfloat16)."""
        for tensor, stage in self.flush_pairs:
            tensor.copy_(stage)


def step_sub_envs(
    envs: Sequence[Any],
    actions: np.ndarray,
    b: Binding,
    leaves: Sequence[ObsLeaf],
    on_error: Callable[[int, Exception, bool], None] | None = None,
) -> None:
    """Steps each sub-env with its row of ``actions``; a finished one is reset at once.

    Writes the step's observations, rewards and flags into ``b``'s next views, and into its root views
    the observations the next step starts from (the reset one for a finished sub-env). A sub-env that
    raises leaves the ones before it stepped, as a ``SyncVectorEnv`` would; with ``on_error``, the others
    are stepped too and ``on_error(i, exception, ended)`` is called for sub-env ``i`` (``ended``: its step went
    through and ended its episode, and the reset after it raised).

    Args:
        envs: the sub-envs (``SyncVectorEnv.envs``).
        actions: ``[n_envs, ...]``, one row per sub-env.
        b: where to write.
        leaves: the observation leaves (used when the observation is nested).
        on_error: where a sub-env's exception goes (``None``: raised).
    """
    # Inline, with the try blocks in the loop: on CartPole a call per sub-env would cost a tenth of a step, and a
    # try costs nothing until it raises.
    reward, terminated, truncated = b.reward, b.terminated, b.truncated
    flat = b.flat
    next_obs, root_obs = b.next_obs[0] if flat else None, b.root_obs[0] if flat else None
    for i, env in enumerate(envs):
        try:
            obs, reward[i], term, trunc, _ = env.step(actions[i])
        except Exception as exc:
            if on_error is None:
                raise
            on_error(i, exc, False)
            continue
        terminated[i], truncated[i] = term, trunc
        if flat:
            next_obs[i] = obs  # type: ignore[index]
        else:
            write_row(b.next_obs, i, obs, leaves)
        if term or trunc:
            try:
                obs, _ = env.reset()
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(i, exc, True)
                continue
        if flat:
            root_obs[i] = obs  # type: ignore[index]
        else:
            write_row(b.root_obs, i, obs, leaves)
    np.logical_or(b.terminated, b.truncated, out=b.done)


class ResetFailedError(Exception):
    """A sub-env's step went through and ended its episode, and the reset after it raised :attr:`error`."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def step_one(env: Any, i: int, action: Any, b: Binding, leaves: Sequence[ObsLeaf]) -> None:
    """Steps sub-env ``i`` (``env``) with ``action`` into row ``i`` of ``b``, reset at once if it finished.

    Raises:
        ResetFailedError: the step went through (it is written) and the reset after it raised.
    """
    obs, b.reward[i], term, trunc, _ = env.step(action)
    b.terminated[i], b.truncated[i] = term, trunc
    write_row(b.next_obs, i, obs, leaves)
    if term or trunc:
        try:
            obs, _ = env.reset()
        except Exception as exc:
            raise ResetFailedError(exc) from exc
    write_row(b.root_obs, i, obs, leaves)


def write_row(views: Sequence[np.ndarray], i: int, obs: Any, leaves: Sequence[ObsLeaf]) -> None:
    """Writes one sub-env's observation ``obs`` into row ``i`` of ``views`` (one per leaf)."""
    for leaf, dst in zip(leaves, views, strict=True):
        dst[i] = pick_leaf(obs, leaf.path)


def reshape_action(act: np.ndarray, shape: tuple[int, ...], action_spec: TensorSpec) -> np.ndarray:
    """``act`` as ``shape`` (``[n_envs, *action_spec.shape]``), for an action with the right size but not shape.

    Raises:
        PolicyError: the action does not fit ``shape``.
    """
    try:
        return act.reshape(shape)
    except ValueError as exc:
        raise PolicyError(
            f"action of shape {act.shape} does not fit {shape[0]} sub-envs with action_spec "
            f"{action_spec}: expected shape {shape}"
        ) from exc


class ActionBounds:
    """Checks a step's continuous actions against their ``Box``, and warns the first time they leave it.

    A policy's action is stored as it wrote it and passed to the env as it is: clipping it here would store one
    action and step another, or store what the policy did not choose (its log-probability would no longer be the
    action's). What the env does with it is its own (Pendulum-v1 clips it, a MuJoCo env clamps it to its
    ``ctrlrange``). So the collector only says so, once per env, as an
    :class:`~acollect._warnings.ActionSpaceWarning`, naming how many entries of the step left which bounds.

    The check is two comparisons per step into buffers allocated once: in place, 3 us on a step of 8 Pendulums
    (147 us, so 1.02x); it stops once it has warned.

    Args:
        spec: the env's action spec: a float :class:`~acollect.specs.Bounded` (anything else needs no check).
        shape: the actions' shape, ``[n_envs, *spec.shape]``.

    Examples:
        >>> import numpy as np
        >>> from acollect.specs import Bounded
        >>> bounds = ActionBounds.of(Bounded(-1.0, 1.0, shape=(2,)), (3, 2))
        >>> bounds.holds(np.zeros((3, 2), dtype=np.float32))
        True
        >>> bounds.holds(np.full((3, 2), 1.5, dtype=np.float32))
        False
        >>> print(bounds.message(np.array([[0.0, 1.5], [0.0, 0.0], [-3.0, 0.0]])).split(": ")[1].split(". ")[0])
        2 of 6 action entries of one step (3 sub-envs) were outside [-1, 1] (from -3 to 1.5)
    """

    __slots__ = ("_all_in", "_high", "_in_high", "_in_low", "_low", "spec")

    def __init__(self, spec: Bounded, shape: tuple[int, ...]) -> None:
        self.spec = spec
        dtype = np.float64 if spec.dtype == torch.float64 else np.float32
        self._low = np.broadcast_to(spec.low.numpy().astype(dtype), shape).copy()
        self._high = np.broadcast_to(spec.high.numpy().astype(dtype), shape).copy()
        self._in_low = np.empty(shape, dtype=np.bool_)
        self._in_high = np.empty(shape, dtype=np.bool_)
        self._all_in = np.ones(shape, dtype=np.bool_).tobytes()

    @classmethod
    def of(cls, spec: TensorSpec, shape: tuple[int, ...]) -> ActionBounds | None:
        """The check for ``spec``, or ``None`` where there is nothing to check (a discrete or unbounded action)."""
        if not isinstance(spec, Bounded) or not spec.dtype.is_floating_point:
            return None
        if not bool((torch.isfinite(spec.low) | torch.isfinite(spec.high)).any()):
            return None
        return cls(spec, shape)

    def holds(self, act: np.ndarray) -> bool:
        """Whether every entry of ``act`` is within the bounds (a NaN is not)."""
        np.greater_equal(act, self._low, out=self._in_low)
        np.less_equal(act, self._high, out=self._in_high)
        # Bytes against a row of Trues: no reduction and its Python around it (``.all()``), half the cost per step.
        return self._in_low.tobytes() == self._all_in and self._in_high.tobytes() == self._all_in

    def message(self, act: np.ndarray) -> str:
        """What the warning says of ``act``: how many entries of how many left which bounds, and what to do."""
        act = np.asarray(act, dtype=np.float64)
        outside = ~((act >= self._low) & (act <= self._high))
        low, high = self._low.reshape(-1), self._high.reshape(-1)
        if (low == low[0]).all() and (high == high[0]).all():
            bounds = f"[{low[0]:g}, {high[0]:g}]"
        else:
            bounds = f"low={self.spec.low.tolist()}, high={self.spec.high.tolist()} (per entry)"
        return (
            f"the policy's actions left the action space: {int(outside.sum())} of {act.size} action entries of one "
            f"step ({act.shape[0]} sub-envs) were outside {bounds} (from {np.nanmin(act):.3g} to "
            f"{np.nanmax(act):.3g}{', and NaN' if np.isnan(act).any() else ''}). They are stored as the policy wrote "
            "them and passed to the env as they are; what the env does with them is its own (Pendulum-v1 clips "
            "them, MuJoCo envs clamp them to their ctrlrange). To store what the env applies, bound them in the "
            "policy (a tanh, then scaled to the bounds) or clip them there. Said once per env: later steps are not "
            "checked."
        )

    def warn(self, act: np.ndarray) -> None:
        """Warns, once per env (the caller drops this check afterwards)."""
        warn(self.message(act), ActionSpaceWarning)
