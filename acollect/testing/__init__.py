"""Helpers for testing code that drives collectors: the ones acollect's own tests use.

* coroutine envs (:mod:`acollect.testing._async_envs`): :class:`AsyncCountingEnv`;
* envs (:mod:`acollect.testing._envs`): :class:`CountingEnv` (a counter as
  observation, so gaps, repeats and transitions that did not happen show),
  :class:`CrashingEnv`, :class:`SlowEnv`, :class:`Gate` (an env held mid-batch until the test opens it),
  :class:`PixelEnv`, the stream check :func:`assert_counting_batch` and
  :func:`wait_until`;
* a multi-agent env (:mod:`acollect.testing._groups`): :class:`GroupCountingEnv`, groups of agents under nested
  keys, and its frame-by-frame check :func:`assert_group_counting_batch`;
* gymnasium envs (:mod:`acollect.testing._gym_envs`): :class:`CountingGymEnv`, :class:`CrashingGymEnv`,
  :class:`EchoGymEnv` (its next observation echoes the action it received);
* leak checks (:mod:`acollect.testing._leaks`): :class:`ResourceSnapshot`,
  :func:`leaked_resources`, :func:`assert_no_leaks`, the context manager
  :func:`no_leaks`, and :func:`our_children`, :func:`our_segments`,
  :func:`our_threads`, :func:`open_fds`;
* probe policies (:mod:`acollect.testing._policies`): :class:`WeightProbe`
  and :class:`TwoPartProbe`, whose actions show which weights collected a batch, and
  :class:`SplitProbe`, whose calls split in two as an inference server's client's do.

Examples:
    >>> import anyio
    >>> from acollect import Collector
    >>> from acollect.testing import CountingEnv, WeightProbe, assert_counting_batch, no_leaks
    >>> async def main():
    ...     with no_leaks():
    ...         async with Collector(CountingEnv, WeightProbe(0.0), frames_per_batch=8) as collector:
    ...             batch = await anext(collector)
    ...             assert_counting_batch(batch)
    ...             await collector.update_policy_weights_(WeightProbe(1.0))
    ...             await anext(collector)  # the weight push landed at this batch boundary
    ...             return (await anext(collector))["action"].unique().tolist()
    >>> anyio.run(main)
    [1]
"""

from acollect.testing._async_envs import AsyncCountingEnv as AsyncCountingEnv
from acollect.testing._envs import ENV_STRIDE as ENV_STRIDE
from acollect.testing._envs import RESET_JUMP as RESET_JUMP
from acollect.testing._envs import CountingEnv as CountingEnv
from acollect.testing._envs import CrashingEnv as CrashingEnv
from acollect.testing._envs import Gate as Gate
from acollect.testing._envs import GatedEnv as GatedEnv
from acollect.testing._envs import PixelEnv as PixelEnv
from acollect.testing._envs import SlowEnv as SlowEnv
from acollect.testing._envs import assert_counting_batch as assert_counting_batch
from acollect.testing._envs import wait_until as wait_until
from acollect.testing._groups import GroupCountingEnv as GroupCountingEnv
from acollect.testing._groups import assert_group_counting_batch as assert_group_counting_batch
from acollect.testing._gym_envs import CountingGymEnv as CountingGymEnv
from acollect.testing._gym_envs import CrashingGymEnv as CrashingGymEnv
from acollect.testing._gym_envs import EchoGymEnv as EchoGymEnv
from acollect.testing._leaks import ResourceSnapshot as ResourceSnapshot
from acollect.testing._leaks import assert_no_leaks as assert_no_leaks
from acollect.testing._leaks import leaked_resources as leaked_resources
from acollect.testing._leaks import no_leaks as no_leaks
from acollect.testing._leaks import open_fds as open_fds
from acollect.testing._leaks import our_children as our_children
from acollect.testing._leaks import our_segments as our_segments
from acollect.testing._leaks import our_threads as our_threads
from acollect.testing._policies import Doubler as Doubler
from acollect.testing._policies import SplitProbe as SplitProbe
from acollect.testing._policies import TwoPartProbe as TwoPartProbe
from acollect.testing._policies import WeightProbe as WeightProbe

__all__ = [
    "ENV_STRIDE",
    "RESET_JUMP",
    "AsyncCountingEnv",
    "CountingEnv",
    "CountingGymEnv",
    "CrashingEnv",
    "CrashingGymEnv",
    "Doubler",
    "EchoGymEnv",
    "Gate",
    "GatedEnv",
    "GroupCountingEnv",
    "PixelEnv",
    "ResourceSnapshot",
    "SlowEnv",
    "SplitProbe",
    "TwoPartProbe",
    "WeightProbe",
    "assert_counting_batch",
    "assert_group_counting_batch",
    "assert_no_leaks",
    "leaked_resources",
    "no_leaks",
    "open_fds",
    "our_children",
    "our_segments",
    "our_threads",
    "wait_until",
]
