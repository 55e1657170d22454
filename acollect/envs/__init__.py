"""Environments: the batched env protocol, its adapters (gymnasium, EnvPool, PettingZoo, TorchRL, coroutine envs),
``make_env``."""

from acollect.envs._async_env import AsyncEnv as AsyncEnv
from acollect.envs._async_pool import AsyncEnvPool as AsyncEnvPool
from acollect.envs._base import DONE_KEYS as DONE_KEYS
from acollect.envs._base import EnvBase as EnvBase
from acollect.envs._envpool import EnvPoolEnv as EnvPoolEnv
from acollect.envs._envpool import is_envpool_env as is_envpool_env
from acollect.envs._factory import make_env as make_env
from acollect.envs._gym import GymEnv as GymEnv
from acollect.envs._gym import space_to_spec as space_to_spec
from acollect.envs._pettingzoo import PettingZooEnv as PettingZooEnv
from acollect.envs._torchrl import TorchRLActionSpec as TorchRLActionSpec
from acollect.envs._torchrl import TorchRLEnvAdapter as TorchRLEnvAdapter
from acollect.envs._torchrl import is_torchrl_env as is_torchrl_env

__all__ = [
    "DONE_KEYS",
    "AsyncEnv",
    "AsyncEnvPool",
    "EnvBase",
    "EnvPoolEnv",
    "GymEnv",
    "PettingZooEnv",
    "TorchRLActionSpec",
    "TorchRLEnvAdapter",
    "is_envpool_env",
    "is_torchrl_env",
    "make_env",
    "space_to_spec",
]
