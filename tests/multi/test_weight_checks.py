"""Weight pushes that do not fit the workers' policy: refused before anything is sent, never fatal.

A state dict (dotted keys) means the same as ``TensorDict.from_module``; a push of the wrong keys,
shapes or dtypes raises ``ConfigurationError`` at once, checked against the structure each worker
reported in its hello (so with ``policy_factory`` too), and the collector goes on. A worker that still
receives weights that do not fit (a peer that skipped the check, a malformed message) refuses them
and keeps collecting; the push raises ``WeightSyncError`` naming it, promptly.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
import torch
from multi_helpers import NestedProbe, nested_probe
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import (
    ConfigurationError,
    MultiAsyncCollector,
    MultiSyncCollector,
    WeightSyncError,
    ZmqWeightSyncScheme,
)
from acollect._workers import protocol as P
from acollect.testing import CountingEnv, wait_until


def counting() -> CountingEnv:
    return CountingEnv(num_envs=2, episode_length=3)


def versions_and_actions(batch: TensorDict) -> tuple[list[int], list[int]]:
    return batch["collector", "policy_version"].unique().tolist(), batch["action"].unique().tolist()


async def next_with_version(collector: Any, version: int) -> TensorDict:
    """The first batch collected with ``version`` (older ones may come first: a batch begun ahead, before the push)."""
    with anyio.fail_after(30):
        while True:
            batch = await anext(collector)
            if batch["collector", "policy_version"].eq(version).all():
                return batch
            assert batch["collector", "policy_version"].lt(version).all()


@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
async def test_state_dict_push_reaches_every_worker(start_method: str, collector_class: type) -> None:
    async with collector_class(
        [counting] * 2, NestedProbe(0.0), frames_per_batch=8, start_method=start_method
    ) as collector:
        assert versions_and_actions(await anext(collector)) == ([0], [0])
        assert await collector.update_policy_weights_(NestedProbe(1.0).state_dict()) == 1
        batch = await next_with_version(collector, 1)
        assert batch["action"].eq(1).all()
        # keyword form, and a TensorDict with dotted keys (TensorDict(state_dict)) means the same
        flat = TensorDict(dict(NestedProbe(0.0).state_dict()), batch_size=[])
        assert await collector.update_policy_weights_(weights=flat) == 2
        batch = await next_with_version(collector, 2)
        assert batch["action"].eq(0).all()
        assert all(pid is not None for pid in collector.worker_pids)


@pytest.mark.parametrize("use_factory", [False, True], ids=["policy", "policy_factory"])
@pytest.mark.parametrize(
    ("weights", "named"),
    [
        ({"net.0.w": torch.ones(3)}, ["net.0.w", "float32 [1]", "float32 [3]"]),
        ({"net.0.w": torch.ones(1, dtype=torch.float64)}, ["net.0.w", "float32 [1]", "float64 [1]"]),
        ({"net.0.v": torch.ones(1)}, ["missing keys ['net.0.w']", "unexpected keys ['net.0.v']"]),
        ({"net.0.w": torch.ones(1), "net.1.w": torch.ones(1)}, ["unexpected keys ['net.1.w']"]),
    ],
    ids=["shape", "dtype", "key", "extra-key"],
)
async def test_a_push_that_does_not_fit_is_refused_at_once(
    start_method: str, use_factory: bool, weights: dict[str, torch.Tensor], named: list[str]
) -> None:
    policy: dict[str, Any] = {"policy_factory": nested_probe} if use_factory else {"policy": NestedProbe(0.0)}
    async with MultiSyncCollector([counting] * 2, frames_per_batch=8, start_method=start_method, **policy) as c:
        await anext(c)
        pids = c.worker_pids
        started = time.monotonic()
        with pytest.raises(ConfigurationError) as info:
            await c.update_policy_weights_(weights)
        assert time.monotonic() - started < 20  # at once: no wait for acknowledgements (30 s)
        for part in named:
            assert part in str(info.value)
        # nothing was sent: the workers collect on with version 0, and a push that fits still works
        assert c.policy_version == 0
        assert versions_and_actions(await anext(c)) == ([0], [0])
        assert await c.update_policy_weights_({"net.0.w": torch.ones(1)}) == 1
        assert versions_and_actions(await next_with_version(c, 1)) == ([1], [1])
        assert c.worker_pids == pids


async def test_a_models_part_is_checked_against_that_part(start_method: str) -> None:
    async with MultiSyncCollector(
        [counting] * 2,
        NestedProbe(0.0),
        frames_per_batch=8,
        weight_sync_schemes={"policy.net": ZmqWeightSyncScheme()},
        start_method=start_method,
    ) as c:
        with pytest.raises(ConfigurationError, match=r"model 'policy.net'.*0\.w: expected float32 \[1\]"):
            await c.update_policy_weights_(weights_dict={"policy.net": {"0.w": torch.ones(2)}})
        assert await c.update_policy_weights_(weights_dict={"policy.net": {"0.w": torch.ones(1)}}) == 1
        assert versions_and_actions(await next_with_version(c, 1)) == ([1], [1])


async def test_inner_module_weights_are_mapped_onto_a_tensordict_module(start_method: str) -> None:
    policy = TensorDictModule(NestedProbe(0.0), in_keys=["observation"], out_keys=["action"])
    async with MultiSyncCollector([counting] * 2, policy, frames_per_batch=8, start_method=start_method) as c:
        # the trainer trains the plain module: its keys lack the TensorDictModule's "module." prefix
        assert await c.update_policy_weights_(NestedProbe(1.0).state_dict()) == 1
        assert versions_and_actions(await next_with_version(c, 1)) == ([1], [1])
        assert await c.update_policy_weights_(NestedProbe(0.0)) == 2
        assert versions_and_actions(await next_with_version(c, 2)) == ([2], [0])
        # a mapped push is still checked shape for shape
        with pytest.raises(ConfigurationError, match=r"module\.net\.0\.w: expected float32 \[1\], given float32 \[2\]"):
            await c.update_policy_weights_({"net.0.w": torch.ones(2)})


async def test_a_worker_refuses_weights_that_skipped_the_check_and_lives_on(start_method: str) -> None:
    async with MultiSyncCollector([counting] * 2, NestedProbe(0.0), frames_per_batch=8, start_method=start_method) as c:
        await anext(c)
        pool, pids = c.pool, c.worker_pids
        assert pool is not None
        # As a peer that skipped the collector's check would: straight to the pool.
        bad = TensorDict({"net": {"0": {"w": torch.ones(3)}}}, batch_size=[])
        started = time.monotonic()
        with pytest.raises(WeightSyncError) as info:
            await pool.weights.push({"policy": bad}, [0, 1], 30.0, check=False)
        assert time.monotonic() - started < 20  # answered, not timed out (30 s)
        assert info.value.worker_ids == (0, 1)
        assert "worker 0" in str(info.value)
        assert "('net', '0', 'w')" in str(info.value)
        assert "[3]" in str(info.value)
        # both workers kept their weights and go on collecting
        assert pool.failure is None
        assert (await anext(c))["action"].eq(0).all()
        assert c.worker_pids == pids
        assert await c.update_policy_weights_(NestedProbe(1.0)) == 2
        assert versions_and_actions(await next_with_version(c, 2)) == ([2], [1])


@pytest.mark.parametrize(
    ("fields", "frames"),
    [
        ({"version": "seven", "models": []}, None),
        ({"version": 7}, None),
        ({"version": 7, "models": "policy"}, None),
        ({"version": 7, "models": [{"id": "policy", "layout": {"leaves": "no"}, "shm": None}]}, None),
        ({"version": 7, "models": [{"id": "policy", "layout": {"leaves": [], "nbytes": 0}, "shm": None}]}, None),
        (
            {"version": 7, "models": [{"id": "env.nothing", "layout": {"leaves": [], "nbytes": 0}, "shm": None}]},
            {"m0": torch.zeros(0, dtype=torch.uint8)},
        ),
        (
            {"version": 7, "models": [{"id": "policy", "layout": {"leaves": [], "nbytes": 0}, "shm": "acollect-no"}]},
            None,
        ),
    ],
    ids=["version", "no-models", "models-str", "leaves-str", "no-frame", "no-module", "no-segment"],
)
async def test_a_malformed_weights_message_leaves_the_worker_alive(
    start_method: str, fields: dict[str, Any], frames: dict[str, torch.Tensor] | None
) -> None:
    async with MultiSyncCollector([counting] * 2, NestedProbe(0.0), frames_per_batch=8, start_method=start_method) as c:
        await anext(c)
        pool, pids = c.pool, c.worker_pids
        assert pool is not None
        handle = pool.handles[0]
        td = TensorDict(frames, batch_size=[]) if frames is not None else None
        await pool.send(handle, P.WEIGHTS, fields, td)
        # The refusal comes back as an ack with an error; a worker that fails instead breaks the pool.
        await wait_until(lambda: pool.weights.refused(handle) is not None or pool.failure is not None)
        assert pool.failure is None
        refused = pool.weights.refused(handle)
        assert refused is not None
        assert refused[0] in (7, -1)
        for _ in range(3):  # still collecting, with its own weights, and nobody died
            assert versions_and_actions(await anext(c)) == ([0], [0])
        assert pool.failure is None
        assert c.worker_pids == pids
        assert await c.update_policy_weights_(NestedProbe(1.0)) == 1
        assert versions_and_actions(await next_with_version(c, 1)) == ([1], [1])


async def test_a_push_after_a_batch_never_splits_the_batch_begun_ahead_between_versions(start_method: str) -> None:
    # The batch after each anext() is asked for ahead before the push; a worker whose runner had not begun it when
    # the weights arrived used to apply them at once: one lockstep batch, its parts of two versions.
    async with MultiSyncCollector([counting] * 2, NestedProbe(0.0), frames_per_batch=8, start_method=start_method) as c:
        seen: list[list[int]] = []
        with anyio.fail_after(120):
            for version in range(1, 31):
                for _ in range(2):  # a batch that no push preceded: the next one is asked for ahead
                    batch = await anext(c)
                    seen.append(batch["collector", "policy_version"].unique().tolist())
                assert await c.update_policy_weights_({"net.0.w": torch.full((1,), float(version))}) == version
        mixed = [versions for versions in seen if len(versions) > 1]
        assert not mixed, f"{len(mixed)} of {len(seen)} batches mixed versions across their parts: {mixed[:5]}"
