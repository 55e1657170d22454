"""The in-process Collector: layout, lifecycle, options and errors, on real envs."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule
from tensordict.nn.probabilistic import interaction_type

from acollect import (
    BackgroundCollectionError,
    ClosedCollectorError,
    Collector,
    CollectorState,
    CollectorStateError,
    ConfigurationError,
    GymEnv,
    PolicyError,
    ReplayBuffer,
)
from acollect.testing import (
    RESET_JUMP,
    CountingEnv,
    CrashingEnv,
    Gate,
    SlowEnv,
    WeightProbe,
    our_threads,
    wait_until,
)


class AlwaysZero(torch.nn.Module):
    """Deterministic policy for CountingEnv (Categorical(2) actions)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.int64)


class LinearArgmax(torch.nn.Module):
    """A policy whose action depends on its weights only (obs are ignored but for the batch size)."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.tensor([1.0, 0.0]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.logits.argmax().expand(obs.shape[0]).clone()


async def test_layout_matches_torchrl() -> None:
    async with Collector(lambda: CountingEnv(num_envs=3, episode_length=4), AlwaysZero(), frames_per_batch=30) as c:
        batch = await anext(c)
    assert batch.batch_size == (3, 10)
    assert batch.names == [None, "time"]
    leaves = set(batch.keys(include_nested=True, leaves_only=True))
    assert leaves == {
        "observation",
        "action",
        "done",
        "terminated",
        "truncated",
        ("next", "observation"),
        ("next", "reward"),
        ("next", "done"),
        ("next", "terminated"),
        ("next", "truncated"),
        ("collector", "traj_ids"),
        ("collector", "policy_version"),
    }
    assert batch["next", "reward"].shape == (3, 10, 1)
    assert batch["next", "done"].dtype == torch.bool
    obs, nxt = batch["observation"].squeeze(-1), batch["next", "observation"].squeeze(-1)
    # Every transition is real: each step advances the counter by exactly one.
    assert torch.equal(nxt - obs, torch.ones_like(obs))
    done = batch["next", "done"].squeeze(-1)
    assert done.sum() > 0
    assert torch.equal(batch["next", "done"], batch["next", "terminated"] | batch["next", "truncated"])
    # Within an episode the next root observation is the previous next one; after an episode end it is the
    # reset observation (RESET_JUMP above the final one), never a repeat or a no-op step.
    jump = torch.where(done[:, :-1], RESET_JUMP, 0.0)
    assert torch.equal(obs[:, 1:], nxt[:, :-1] + jump)
    assert not batch["done"].any()


async def test_traj_ids_new_at_each_episode_and_continue_across_batches() -> None:
    async with Collector(
        lambda: CountingEnv(num_envs=2, episode_length=3), None, frames_per_batch=8, total_frames=32
    ) as c:
        batches = [b async for b in c]
    assert len(batches) == 4
    ids = torch.cat([b["collector", "traj_ids"] for b in batches], dim=1)
    done = torch.cat([b["next", "done"].squeeze(-1) for b in batches], dim=1)
    for env in range(2):
        changes = ids[env, 1:] != ids[env, :-1]
        assert torch.equal(changes, done[env, :-1]), "a new trajectory id exactly after each episode end"
    per_env = [set(ids[e].tolist()) for e in range(2)]
    assert not per_env[0] & per_env[1], "trajectory ids are unique across envs"


async def test_len_total_frames_and_endless() -> None:
    with pytest.warns(UserWarning, match="not a multiple") as caught:
        c = Collector(CountingEnv, None, frames_per_batch=4, total_frames=10)
    assert caught[0].filename == __file__  # the caller's line, not acollect's
    assert len(c) == 3
    async with c:
        frames = [b.numel() async for b in c]
    assert frames == [4, 4, 4]
    endless = Collector(CountingEnv, None, frames_per_batch=4)
    with pytest.raises(TypeError, match="endless"):
        len(endless)
    async with endless:
        n = 0
        async for _ in endless:
            n += 1
            if n == 5:
                break
    assert endless.frames == 20


async def test_frames_per_batch_rounded_up_to_env_multiple() -> None:
    # Only building the env says how many it steps: rounded (and warned) at set-up, pointing at `async with`.
    c = Collector(lambda: CountingEnv(num_envs=3), None, frames_per_batch=10, total_frames=-1)
    assert c.frames_per_batch == 10
    with pytest.warns(UserWarning, match=r"frames_per_batch=10 is not a multiple of the number of envs \(3\)") as w:
        async with c:
            batch = await anext(c)
    assert [x.filename for x in w] == [__file__]
    assert batch.batch_size == (3, 4)
    assert (c.requested_frames_per_batch, c.frames_per_batch) == (10, 12)  # the attribute tells the truth


async def test_frames_per_batch_rounded_at_construction_when_the_arguments_say_the_envs() -> None:
    with pytest.warns(UserWarning, match=r"each batch holds 12 frames") as w:
        c = Collector("CartPole-v1", None, frames_per_batch=10, total_frames=24, env_kwargs={"num_envs": 3})
    assert [x.filename for x in w] == [__file__]
    assert c.frames_per_batch == 12
    assert len(c) == 2
    async with c:  # nothing more to say: no second warning
        sizes = [b.numel() async for b in c]
    assert sizes == [12, 12]


async def test_frames_per_batch_rounding_also_checks_total_frames() -> None:
    c = Collector(lambda: CountingEnv(num_envs=3), None, frames_per_batch=10, total_frames=30)
    with pytest.warns(UserWarning, match="not a multiple") as w:
        async with c:
            pass
    assert [str(x.message).split(" is not")[0] for x in w] == ["frames_per_batch=10", "total_frames=30"]
    assert {x.filename for x in w} == {__file__}
    assert len(c) == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"frames_per_batch": 0}, "frames_per_batch=0"),
        ({"frames_per_batch": -5}, "frames_per_batch=-5"),
        ({"frames_per_batch": 4, "total_frames": 0}, "total_frames=0"),
        ({"frames_per_batch": 4, "device": "gpu"}, "device='gpu'"),
        ({"frames_per_batch": 4, "storing_device": "cuda:7"}, "storing_device='cuda:7'"),
        ({"frames_per_batch": 4, "max_frames_per_traj": 0}, "max_frames_per_traj=0"),
        ({"frames_per_batch": 4, "exploration_type": "greedy"}, "exploration_type='greedy'"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Collector(CountingEnv, None, **kwargs)


def test_unknown_env_id_is_a_clear_error_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="'NoSuchEnv-v0' is not a registered gymnasium id"):
        Collector("NoSuchEnv-v0", None, frames_per_batch=4)
    with pytest.raises(ConfigurationError, match=r"'CartPol-v1'.*did you mean 'CartPole-v1'"):
        Collector(functools.partial(GymEnv, "CartPol-v1", num_envs=2), None, frames_per_batch=4)


async def test_a_policy_acting_outside_the_action_space_fails_set_up() -> None:
    class Seven(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.full((obs.shape[0],), 7)

    c = Collector("CartPole-v1", Seven(), frames_per_batch=4)
    with pytest.raises(PolicyError, match=r"outside the action space: 7 for env 0.*Categorical\(.*n=2"):
        async with c:
            pass
    assert c.state is CollectorState.CLOSED


async def test_an_action_leaving_the_action_space_mid_batch_is_a_policy_error() -> None:
    class SevenLater(torch.nn.Module):
        calls = 0

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            self.calls += 1  # the set-up probe and the first steps act 0, the fourth step acts 7
            return torch.full((obs.shape[0],), 7 if self.calls == 4 else 0)

    async with Collector("CartPole-v1", SevenLater(), frames_per_batch=8, env_kwargs={"num_envs": 2}) as c:
        with pytest.raises(PolicyError, match=r"action 7 \(sub-env 0 and 1 more\) is outside the action space") as info:
            await anext(c)
    assert isinstance(info.value.__cause__, AssertionError)


async def test_policy_without_action_and_wrong_shape() -> None:
    def no_action(td: TensorDict) -> TensorDict:
        return td.set("logits", torch.zeros(td.shape[0], 2))

    with pytest.raises(PolicyError, match="did not write 'action'"):
        async with Collector(CountingEnv, no_action, frames_per_batch=4):
            pass

    class WrongShape(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.zeros(obs.shape[0], 3, dtype=torch.int64)

    with pytest.raises(PolicyError, match=r"shape \(1, 3\).*expected \(1,\)"):
        async with Collector(CountingEnv, WrongShape(), frames_per_batch=4):
            pass


def test_policy_and_policy_factory_are_exclusive() -> None:
    with pytest.raises(ConfigurationError, match="policy_factory"):
        Collector(CountingEnv, AlwaysZero(), policy_factory=AlwaysZero, frames_per_batch=4)


class WaitsForTheLoop(CountingEnv):
    """A counting env whose every step spins, holding the GIL as a simulator written in Python does, until a task on
    the event loop has run since the step began (``ticks``, which that task counts, has changed)."""

    def __init__(self, ticks: list[int], num_envs: int) -> None:
        super().__init__(num_envs)
        self.ticks = ticks

    def _before_step(self) -> None:
        seen, deadline = self.ticks[0], time.monotonic() + 20
        while self.ticks[0] == seen:
            if time.monotonic() > deadline:
                raise TimeoutError("no task of the event loop ran for 20 s while a batch was collected")


async def test_the_event_loop_runs_other_tasks_while_a_batch_is_collected() -> None:
    # Each step waits for a tick of a task on the loop: collection that blocked the loop would never end a step.
    # How late the loop's tasks run meanwhile is a figure, measured by benchmarks/lag.py.
    ticks = [0]
    stop = anyio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            await anyio.sleep(0.001)
            ticks[0] += 1

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            async with Collector(lambda: WaitsForTheLoop(ticks, 4), None, frames_per_batch=64, total_frames=192) as c:
                batches = [batch async for batch in c]
            stop.set()
    assert len(batches) == 3
    assert ticks[0] >= 48, "a tick for every step"


async def test_lifecycle_states_and_closed_errors() -> None:
    c = Collector(CountingEnv, None, frames_per_batch=4)
    assert c.state is CollectorState.NEW
    async with c:
        assert c.state is CollectorState.RUNNING
        await anext(c)
    assert c.state is CollectorState.CLOSED
    await c.async_shutdown()  # idempotent
    with pytest.raises(ClosedCollectorError, match="iterate"):
        await anext(c)
    with pytest.raises(ClosedCollectorError):
        await c.update_policy_weights_(AlwaysZero())
    with pytest.raises(ClosedCollectorError):
        c.start(ReplayBuffer(10))


async def test_shutdown_from_new_state_and_envs_closed() -> None:
    envs: list[CountingEnv] = []

    def make() -> CountingEnv:
        envs.append(CountingEnv(num_envs=2))
        return envs[-1]

    await Collector(make, None, frames_per_batch=4).async_shutdown()
    assert envs == []
    c = Collector(make, None, frames_per_batch=4)
    await anext(c)
    await c.async_shutdown()
    assert len(envs) == 1
    assert envs[0].is_closed


async def test_cancelling_the_consumer_leaves_no_thread_and_no_open_env() -> None:
    envs = []

    def make() -> GymEnv:
        envs.append(GymEnv("CartPole-v1", num_envs=4))
        return envs[-1]

    for delay in (0.0, 0.01, 0.05):
        c = Collector(make, None, frames_per_batch=100_000)
        async with c:
            with anyio.move_on_after(delay) as scope:
                await anext(c)
            assert scope.cancelled_caught
            assert not our_threads()
        assert envs[-1].is_closed
    assert not our_threads()


async def test_cancelled_batch_does_not_corrupt_the_next() -> None:
    async with Collector(lambda: CountingEnv(num_envs=2, episode_length=5), None, frames_per_batch=20_000) as c:
        with anyio.move_on_after(0.02):
            await anext(c)
        c2_batch = await anext(c)
    obs, nxt = c2_batch["observation"], c2_batch["next", "observation"]
    assert torch.equal(nxt - obs, torch.ones_like(obs))
    assert c.frames == 20_000


async def test_background_mode_fills_buffer_and_pause_stops_it() -> None:
    rb = ReplayBuffer(100_000)
    async with Collector(lambda: CountingEnv(num_envs=4), None, frames_per_batch=64) as c:
        with pytest.raises(ConfigurationError, match="replay_buffer"):
            c.start(object())  # type: ignore[arg-type]
        c.start(replay_buffer=rb)
        with pytest.raises(CollectorStateError, match="already"):
            c.start(rb)
        await wait_until(lambda: len(rb) >= 640)
        with pytest.raises(CollectorStateError, match="background"):
            await anext(c)
        async with c.pause():
            assert c.state is CollectorState.PAUSED
            size = len(rb)
            await anyio.sleep(0.2)
            assert len(rb) == size
        assert c.state is CollectorState.RUNNING
        await wait_until(lambda: len(rb) > size)
    assert not our_threads()


async def test_background_mode_writes_batches_in_slices_the_loop_runs_between() -> None:
    """A task on the loop sees the buffer part-way through a batch, and every transition it samples is whole."""
    rb = ReplayBuffer(5_000)
    sizes: set[int] = set()
    async with Collector(lambda: CountingEnv(num_envs=4, episode_length=7), None, frames_per_batch=2_048) as c:
        c.start(replay_buffer=rb)
        with anyio.fail_after(60):
            while len(rb) < rb.capacity:  # two batches, then a third overwriting the oldest rows
                sizes.add(len(rb))
                if len(rb):
                    sample = rb.sample(64)
                    assert torch.equal(sample["next", "observation"] - sample["observation"],
                                       torch.ones_like(sample["observation"]))  # fmt: skip
                await anyio.lowlevel.checkpoint()
    # Written whole, the buffer would only ever hold multiples of 2,048 transitions.
    assert any(size % 2_048 for size in sizes), sorted(sizes)


@pytest.mark.parametrize(("interval", "offers_per_step"), [(0.0, 1), (None, 0)])
async def test_collection_thread_offers_the_gil_at_step_boundaries(
    monkeypatch: pytest.MonkeyPatch, interval: float | None, offers_per_step: int
) -> None:
    import acollect._runtime.threads as threads_module

    offers: list[str] = []
    offer = threads_module.yield_gil

    def counted() -> object:  # the real offer, counted by the thread that makes it
        offers.append(threading.current_thread().name)
        return offer()

    monkeypatch.setattr(threads_module, "yield_gil", counted)
    async with Collector(lambda: CountingEnv(num_envs=4), None, frames_per_batch=64, total_frames=128,
                         gil_handover_interval=interval) as c:  # fmt: skip
        assert [batch.shape[-1] async for batch in c] == [16, 16]
    assert offers == ["acollect-rollout"] * (32 * offers_per_step)


@pytest.mark.parametrize("bad", [-0.001, float("nan"), True, "1ms"])
def test_gil_handover_interval_is_checked(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="gil_handover_interval"):
        Collector(lambda: CountingEnv(num_envs=4), None, frames_per_batch=64, gil_handover_interval=bad)  # type: ignore[arg-type]


async def test_background_error_is_raised_at_next_call_and_never_lost() -> None:
    rb = ReplayBuffer(1000)
    c = Collector(lambda: CrashingEnv(crash_at_step=50), None, frames_per_batch=16)
    c.start(rb)
    await wait_until(lambda: not c.running_in_background)
    with pytest.raises(BackgroundCollectionError, match="step") as info:
        await c.update_policy_weights_(AlwaysZero())
    assert isinstance(info.value.__cause__, RuntimeError)
    await c.async_shutdown()  # reported already: not raised twice

    c = Collector(lambda: CrashingEnv(crash_at_step=10), None, frames_per_batch=4)
    c.start(rb)
    await wait_until(lambda: not c.running_in_background)
    with pytest.raises(BackgroundCollectionError):
        await c.async_shutdown()  # not reported yet: raised here


async def test_weight_updates_apply_between_batches_and_bump_version() -> None:
    trainer_policy = LinearArgmax()
    async with Collector(lambda: CountingEnv(num_envs=2), policy_factory=LinearArgmax, frames_per_batch=8) as c:
        first = await anext(c)
        assert first["collector", "policy_version"].unique().tolist() == [0]
        assert first["action"].unique().tolist() == [0]
        with torch.no_grad():
            trainer_policy.logits.copy_(torch.tensor([0.0, 1.0]))
        await c.update_policy_weights_(trainer_policy)
        with torch.no_grad():
            trainer_policy.logits.copy_(torch.tensor([5.0, 0.0]))  # the collector holds a snapshot
        second = await anext(c)
        assert second["collector", "policy_version"].unique().tolist() == [1]
        assert second["action"].unique().tolist() == [1]
        await c.update_policy_weights_(weights=TensorDict.from_module(trainer_policy))
        third = await anext(c)
        assert third["collector", "policy_version"].unique().tolist() == [2]
        assert third["action"].unique().tolist() == [0]
        assert c.policy_version == 2


async def test_weight_update_in_background_never_mixes_versions() -> None:
    rb = ReplayBuffer(1_000_000)
    async with Collector(lambda: CountingEnv(num_envs=4), policy_factory=LinearArgmax, frames_per_batch=256) as c:
        c.start(rb)
        source = LinearArgmax()
        for version in range(1, 6):
            with torch.no_grad():
                source.logits.copy_(torch.tensor([float(version % 2 == 0), float(version % 2)]))
            await c.update_policy_weights_(source)
            await anyio.sleep(0.02)
    data = rb.sample(len(rb) * 2)
    versions, actions = data["collector", "policy_version"], data["action"]
    for v in versions.unique().tolist():
        expected = 0 if v % 2 == 0 else 1
        assert actions[versions == v].unique().tolist() == [expected], f"version {v} mixed weights"


async def test_pushes_queued_mid_batch_apply_in_order_and_every_frame_acts_with_its_version(tmp_path: Path) -> None:
    # Three pushes while the collection thread is held mid-batch at a gate: the batch under way keeps the weights
    # that began it, and the next one acts with the last push's weights (each push's action is its version), never
    # an older push's.
    steps = 10
    with Gate(tmp_path) as gate:
        env = gate.env(hold_at_step=steps + steps // 2, num_envs=2, n_actions=8)  # mid-way through the second batch
        async with Collector(env, WeightProbe(0.0, high=7), frames_per_batch=2 * steps) as c:
            batches = [await anext(c)]

            async def take() -> None:
                batches.append(await anext(c))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(take)
                    await gate.wait_held()
                    for version in (1, 2, 3):
                        assert await c.update_policy_weights_(WeightProbe(float(version))) == version
                    gate.open()
                batches.append(await anext(c))
    for batch in batches:
        assert torch.equal(batch["action"], batch["collector", "policy_version"]), "a frame acted with other weights"
    assert [batch["collector", "policy_version"].unique().tolist() for batch in batches] == [[0], [0], [3]]


class NestedArgmax(torch.nn.Module):
    """:class:`LinearArgmax` one level down (``head.logits``), so its state dict has dotted keys."""

    def __init__(self, logits: tuple[float, float] = (1.0, 0.0)) -> None:
        super().__init__()
        self.head = LinearArgmax()
        with torch.no_grad():
            self.head.logits.copy_(torch.tensor(logits))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(obs)


def version_and_action(batch: TensorDict) -> tuple[list[int], list[int]]:
    return batch["collector", "policy_version"].unique().tolist(), batch["action"].unique().tolist()


@pytest.mark.parametrize("use_factory", [False, True], ids=["policy", "policy_factory"])
async def test_a_state_dict_push_means_the_module_and_returns_the_version(use_factory: bool) -> None:
    policy = {"policy_factory": NestedArgmax} if use_factory else {"policy": NestedArgmax()}
    c = Collector(lambda: CountingEnv(num_envs=2), frames_per_batch=8, **policy)
    # before the first batch too (with policy_factory the policy is built to learn what the weights must fit)
    assert await c.update_policy_weights_(NestedArgmax((0.0, 1.0)).state_dict()) == 1
    async with c:
        assert version_and_action(await anext(c)) == ([1], [1])
        flat = TensorDict(dict(NestedArgmax((1.0, 0.0)).state_dict()), batch_size=[])  # dotted keys in a TensorDict
        assert await c.update_policy_weights_(weights=flat) == 2
        assert version_and_action(await anext(c)) == ([2], [0])
        assert await c.update_policy_weights_(NestedArgmax((0.0, 1.0))) == 3
        assert version_and_action(await anext(c)) == ([3], [1])


@pytest.mark.parametrize(
    ("weights", "named"),
    [
        ({"head.logits": torch.ones(3)}, ["head.logits", "float32 [2]", "float32 [3]"]),
        ({"head.logits": torch.ones(2, dtype=torch.float16)}, ["head.logits", "float32 [2]", "float16 [2]"]),
        ({"head.bias": torch.ones(2)}, ["missing keys ['head.logits']", "unexpected keys ['head.bias']"]),
    ],
    ids=["shape", "dtype", "key"],
)
async def test_a_push_that_does_not_fit_is_refused_at_once(weights: dict[str, torch.Tensor], named: list[str]) -> None:
    async with Collector(lambda: CountingEnv(num_envs=2), policy_factory=NestedArgmax, frames_per_batch=8) as c:
        await anext(c)
        with pytest.raises(ConfigurationError) as info:
            await c.update_policy_weights_(weights)
        for part in named:
            assert part in str(info.value)
        assert c.policy_version == 0
        assert version_and_action(await anext(c)) == ([0], [0])
        assert await c.update_policy_weights_({"head.logits": torch.tensor([0.0, 1.0])}) == 1
        assert version_and_action(await anext(c)) == ([1], [1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": {"head.logits": torch.ones(2)}, "policy": NestedArgmax()}, r"got policy= and weights="),
        ({"worker_ids": [0]}, r"worker_ids.*in-process collector"),
        ({"model_id": "policy.head"}, r"model_id.*'policy' only"),
        ({"weights_dict": {"policy.head": {"logits": torch.ones(2)}}}, r"weights_dict.*'policy' only"),
        ({"timeout": 0}, r"timeout"),
    ],
    ids=["two-sources", "worker_ids", "model_id", "weights_dict", "timeout"],
)
async def test_a_push_the_in_process_collector_cannot_honour_is_refused(kwargs: dict, match: str) -> None:
    async with Collector(lambda: CountingEnv(num_envs=2), policy_factory=NestedArgmax, frames_per_batch=8) as c:
        await anext(c)
        with pytest.raises(ConfigurationError, match=match):
            await c.update_policy_weights_(**kwargs)
        assert c.policy_version == 0
        assert await c.update_policy_weights_(weights={"head.logits": torch.tensor([0.0, 1.0])}, timeout=5) == 1


async def test_weights_of_a_tensordict_modules_inner_module_are_mapped() -> None:
    policy = TensorDictModule(NestedArgmax(), in_keys=["observation"], out_keys=["action"])
    async with Collector(lambda: CountingEnv(num_envs=2), policy, frames_per_batch=8) as c:
        assert await c.update_policy_weights_(NestedArgmax((0.0, 1.0)).state_dict()) == 1  # no "module." prefix
        assert version_and_action(await anext(c)) == ([1], [1])
        # and the other way round: one prefix too many, as a DistributedDataParallel copy's state dict has
        ddp_like = {"module.module.head.logits": torch.tensor([1.0, 0.0])}
        assert [f"module.{k}" for k in policy.state_dict()] == list(ddp_like)
        assert await c.update_policy_weights_(ddp_like) == 2
        assert version_and_action(await anext(c)) == ([2], [0])
        with pytest.raises(ConfigurationError, match=r"missing keys \['module.head.logits'\]"):
            await c.update_policy_weights_({"module.tail.logits": torch.ones(2)})


async def test_a_policy_without_weights_refuses_weights() -> None:
    async with Collector(lambda: CountingEnv(num_envs=2), AlwaysZero(), frames_per_batch=8) as c:
        with pytest.raises(ConfigurationError, match="holds no weights"):
            await c.update_policy_weights_({"w": torch.ones(1)})
        assert version_and_action(await anext(c)) == ([0], [0])


async def test_same_seed_same_batches() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Softmax(-1))

    class Sample(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.multinomial(self.net(obs), 1).squeeze(-1)

    async def run(seed: int) -> list[TensorDict]:
        async with Collector(
            lambda: GymEnv("CartPole-v1", num_envs=3), Sample(), frames_per_batch=60, total_frames=180
        ) as c:
            c.set_seed(seed)
            return [b async for b in c]

    a, b, other = await run(7), await run(7), await run(8)
    for x, y in zip(a, b, strict=True):
        assert (x == y).all()
    assert not torch.equal(a[0]["observation"], other[0]["observation"])


async def test_state_dict_resumes_counts_and_weights() -> None:
    async with Collector(
        lambda: CountingEnv(num_envs=2), policy_factory=LinearArgmax, frames_per_batch=8, total_frames=32
    ) as c:
        await anext(c)
        await c.update_policy_weights_(LinearArgmax())
        await anext(c)
        state = c.state_dict()
    assert state["frames"] == 16
    assert state["policy_version"] == 1
    resumed = Collector(
        lambda: CountingEnv(num_envs=2), policy_factory=LinearArgmax, frames_per_batch=8, total_frames=32
    )
    resumed.load_state_dict(state)
    async with resumed:
        rest = [b async for b in resumed]
    assert len(rest) == 2
    ids = rest[0]["collector", "traj_ids"]
    assert int(ids.min()) >= state["next_traj_counter"]
    assert rest[0]["collector", "policy_version"].unique().tolist() == [1]
    with pytest.raises(ConfigurationError, match="state_dict"):
        resumed.load_state_dict({"frames": 3})


async def test_max_frames_per_traj_truncates_and_resets() -> None:
    async with Collector(
        lambda: CountingEnv(num_envs=2, episode_length=100), None, frames_per_batch=40, max_frames_per_traj=7
    ) as c:
        batch = await anext(c)
    truncated = batch["next", "truncated"].squeeze(-1)
    assert truncated[:, 6].all()
    assert truncated[:, 13].all()
    assert not batch["next", "terminated"].any()
    assert torch.equal(batch["next", "done"], batch["next", "truncated"])
    ids = batch["collector", "traj_ids"][0]
    assert len(ids.unique()) == 3
    # the env really was reset: the root observation after a truncation is the reset one
    obs, nxt = batch["observation"][0].squeeze(-1), batch["next", "observation"][0].squeeze(-1)
    assert obs[7] == nxt[6] + RESET_JUMP
    assert (batch["collector", "traj_ids"][:, 7] != batch["collector", "traj_ids"][:, 6]).all()


async def test_init_random_frames_then_policy() -> None:
    async with Collector(
        lambda: CountingEnv(num_envs=4), AlwaysZero(), frames_per_batch=400, init_random_frames=400
    ) as c:
        random_batch = await anext(c)
        policy_batch = await anext(c)
    assert random_batch["action"].sum() > 0
    assert policy_batch["action"].sum() == 0


async def test_reset_at_each_iter_postproc_and_split_trajs() -> None:
    async with Collector(
        lambda: CountingEnv(num_envs=2, episode_length=100), None, frames_per_batch=8, reset_at_each_iter=True
    ) as c:
        a, b = await anext(c), await anext(c)
    assert not set(a["collector", "traj_ids"].flatten().tolist()) & set(b["collector", "traj_ids"].flatten().tolist())

    def add_flag(batch: TensorDict) -> TensorDict:
        return batch.set("seen", torch.ones(batch.shape, dtype=torch.bool))

    async with Collector(CountingEnv, None, frames_per_batch=4, postproc=add_flag) as c:
        assert (await anext(c))["seen"].all()

    async with Collector(
        lambda: CountingEnv(num_envs=2, episode_length=[3, 5]), None, frames_per_batch=20, split_trajs=True
    ) as c:
        split = await anext(c)
    mask = split["collector", "mask"]
    assert split.names == [None, "time"]
    assert mask.sum() == 20
    lengths = mask.sum(-1).tolist()
    assert max(lengths) <= 5
    ids = split["collector", "traj_ids"]
    for row in range(split.shape[0]):
        assert len(ids[row][mask[row]].unique()) == 1


async def test_exploration_type_is_per_collector_and_does_not_leak() -> None:
    from tensordict.nn import ProbabilisticTensorDictModule, TensorDictSequential

    logits = TensorDictModule(torch.nn.Linear(1, 2), in_keys=["observation"], out_keys=["logits"])
    sample = ProbabilisticTensorDictModule(
        in_keys=["logits"],
        out_keys=["action"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    policy = TensorDictSequential(logits, sample)
    with torch.no_grad():
        policy[0].module.weight.zero_()
        policy[0].module.bias.copy_(torch.tensor([0.0, 0.1]))  # mode: action 1; random: both
    async with (
        Collector(lambda: CountingEnv(num_envs=8), policy, frames_per_batch=400, exploration_type="mode") as det,
        Collector(
            lambda: CountingEnv(num_envs=8), policy, frames_per_batch=400, exploration_type=InteractionType.RANDOM
        ) as rnd,
    ):
        d_batch, r_batch = await anext(det), await anext(rnd)
    assert d_batch["action"].unique().tolist() == [1]
    assert r_batch["action"].unique().tolist() == [0, 1]
    assert "action_log_prob" in r_batch.keys() or "sample_log_prob" in r_batch.keys()
    assert interaction_type() is None


async def test_policy_kinds_callable_and_tensordict_module() -> None:
    def policy_fn(td: TensorDict) -> TensorDict:
        return td.set("action", torch.ones(td.shape[0], dtype=torch.int64)).set("extra", torch.ones(td.shape[0], 3))

    async with Collector(lambda: CountingEnv(num_envs=2), policy_fn, frames_per_batch=4) as c:
        batch = await anext(c)
    assert batch["action"].unique().tolist() == [1]
    assert batch["extra"].shape == (2, 2, 3)

    module = TensorDictModule(AlwaysZero(), in_keys=["observation"], out_keys=["action"])
    async with Collector(CountingEnv, module, frames_per_batch=4) as c:
        assert (await anext(c))["action"].unique().tolist() == [0]


async def test_iterating_after_exhaustion_stops_again() -> None:
    async with Collector(CountingEnv, None, frames_per_batch=4, total_frames=8) as c:
        assert len([b async for b in c]) == 2
        assert [b async for b in c] == []


async def test_a_cancelled_batch_is_finished_by_the_next_call_no_step_is_lost() -> None:
    # The steps a cancelled call had taken are kept: the next batch continues them, contiguous with the
    # batch before, and nothing is counted as discarded.
    env = functools.partial(SlowEnv, 0.005, num_envs=2, episode_length=10**6)
    async with Collector(env, frames_per_batch=80) as collector:  # 40 steps a batch: 0.2 s
        first = await anext(collector)
        with anyio.move_on_after(0.08) as scope:
            await anext(collector)
        assert scope.cancelled_caught
        second = await anext(collector)
        stats = collector.stats()
    assert torch.equal(second["observation"][:, 0], first["next", "observation"][:, -1])
    assert (second["observation"][:, 1:] - second["observation"][:, :-1]).eq(1).all()
    assert stats.discarded_frames == 0
