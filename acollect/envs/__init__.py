"""Environments: the batched env protocol and its adapters."""

from acollect.envs.base import DONE_KEYS as DONE_KEYS
from acollect.envs.base import EnvBase as EnvBase
