"""Gymnasium spaces as acollect specs, and where each observation leaf sits in a gymnasium observation.

:func:`space_to_spec` maps Box, Discrete, MultiDiscrete, MultiBinary, Dict and Tuple spaces to
specs; the private helpers flatten a nested observation space into the leaves that
:class:`~acollect.envs._gym.GymEnv` copies into its TensorDicts at every step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from acollect.envs._base import DONE_KEYS
from acollect.errors import ConfigurationError
from acollect.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    OneHot,
)

__all__ = ["ObsLeaf", "observation_layout", "pick_leaf", "space_to_spec"]

# Keys the collector writes itself: an observation may not take them.
_RESERVED_KEYS = frozenset({"action", "reward", "next", "collector", *DONE_KEYS})


def _torch_dtype(dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=np.dtype(dtype))).dtype


def space_to_spec(
    space: spaces.Space[Any],
    *,
    categorical: bool = True,
    device: str | torch.device = "cpu",
    double_to_float: bool = False,
) -> Any:
    """Converts a gymnasium space (of one sub-env) to a spec.

    Args:
        space: a ``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``,
            or a ``Dict`` / ``Tuple`` of these (nested freely).
        categorical: map ``Discrete`` to :class:`~acollect.specs.Categorical`
            (an int64 index) when True, to :class:`~acollect.specs.OneHot` otherwise.
        device: device of the tensors the spec builds.
        double_to_float: a float64 ``Box`` (MuJoCo's observations) becomes a float32 spec, the dtype of a torch
            module's parameters; the values are cast as they are written (:class:`~acollect.envs.GymEnv`).

    Returns:
        A :class:`~acollect.specs.TensorSpec`, or a :class:`~acollect.specs.Composite`
        for ``Dict`` (same keys) and ``Tuple`` (keys ``"0"``, ``"1"``, ...).

    Raises:
        ConfigurationError: the space (or one nested in it) has no spec.

    Examples:
        >>> from gymnasium import spaces
        >>> space_to_spec(spaces.Discrete(3))
        Categorical(shape=(), dtype=torch.int64, n=3)
        >>> space_to_spec(spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3))))["1"]
        Binary(shape=(3,), dtype=torch.int8)
        >>> space_to_spec(spaces.Box(-1.0, 1.0, (17,), dtype=np.float64), double_to_float=True).dtype
        torch.float32
    """
    if isinstance(space, spaces.Box):
        dtype = _torch_dtype(space.dtype)
        return Bounded(
            low=torch.from_numpy(np.asarray(space.low, dtype=np.float64)),
            high=torch.from_numpy(np.asarray(space.high, dtype=np.float64)),
            shape=space.shape,
            dtype=torch.float32 if double_to_float and dtype == torch.float64 else dtype,
            device=device,
        )
    if isinstance(space, spaces.Discrete):
        if categorical:
            return Categorical(int(space.n), dtype=torch.int64, device=device, start=int(space.start))
        return OneHot(int(space.n), device=device)
    if isinstance(space, spaces.MultiDiscrete):
        return MultiCategorical(
            torch.from_numpy(np.asarray(space.nvec, dtype=np.int64)),
            dtype=_torch_dtype(space.dtype),
            device=device,
            start=torch.from_numpy(np.asarray(space.start, dtype=np.int64)),
        )
    if isinstance(space, spaces.MultiBinary):
        return Binary(tuple(space.shape), dtype=_torch_dtype(space.dtype), device=device)
    nested = functools.partial(space_to_spec, categorical=categorical, device=device, double_to_float=double_to_float)
    if isinstance(space, spaces.Dict):
        return Composite({str(k): nested(v) for k, v in space.items()})
    if isinstance(space, spaces.Tuple):
        return Composite({str(i): nested(v) for i, v in enumerate(space.spaces)})
    raise ConfigurationError.bad_value(
        "space", space, "a gymnasium Box, Discrete, MultiDiscrete, MultiBinary, or a Dict/Tuple of these"
    )


@dataclass(frozen=True)
class ObsLeaf:
    """One observation tensor: where it goes in a TensorDict, how to reach it in a gymnasium observation."""

    key: tuple[str, ...]
    path: tuple[Any, ...]


def _leaves(space: spaces.Space[Any], key: tuple[str, ...], path: tuple[Any, ...]) -> list[ObsLeaf]:
    if isinstance(space, spaces.Dict):
        return [leaf for k, sub in space.items() for leaf in _leaves(sub, (*key, str(k)), (*path, k))]
    if isinstance(space, spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in _leaves(sub, (*key, str(i)), (*path, i))]
    return [ObsLeaf(key, path)]


def observation_layout(
    space: spaces.Space[Any], device: torch.device, *, double_to_float: bool = False
) -> tuple[Composite, list[ObsLeaf]]:
    """The observation spec and its leaves: Dict keys at the top, anything else under ``"observation"``.

    ``double_to_float``: float64 ``Box`` leaves get float32 specs (see :func:`space_to_spec`).
    """
    if isinstance(space, spaces.Dict):
        clash = sorted(str(k) for k in space.keys() if str(k) in _RESERVED_KEYS)
        if clash:
            raise ConfigurationError.bad_value(
                "observation_space keys", clash, f"no key among the reserved {sorted(_RESERVED_KEYS)}"
            )
        return space_to_spec(space, device=device, double_to_float=double_to_float), _leaves(space, (), ())
    spec = space_to_spec(space, device=device, double_to_float=double_to_float)
    return Composite(observation=spec), _leaves(space, ("observation",), ())


def pick_leaf(obs: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        obs = obs[part]
    return obs
