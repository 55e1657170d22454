"""The in-process collector: one env (batched), one policy, one rollout engine.

Env stepping runs in a thread owned by the collector for the length of each
batch, so the event loop stays responsive while frames are collected. A pool of
coroutine envs (:class:`~acollect.envs.AsyncEnvPool`) is stepped on the event
loop itself instead, each env as a task (:mod:`acollect._rollout.coroutines`).

Examples:
    >>> import anyio
    >>> from acollect import Collector
    >>> from acollect.testing import CountingEnv
    >>> async def main():
    ...     async with Collector(lambda: CountingEnv(num_envs=2), None,
    ...                          frames_per_batch=8, total_frames=16) as collector:
    ...         return [tuple(batch.shape) async for batch in collector]
    >>> anyio.run(main)
    [(2, 4), (2, 4)]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType

from acollect._batches.plan import BatchPlan
from acollect._episodes import EpisodeSummary, EpisodeTracker
from acollect._policy import PolicyLike
from acollect._rollout.blocking import RolloutEngine
from acollect._rollout.build import build_engine
from acollect._rollout.coroutines import AsyncRollout
from acollect._rollout.engine import Engine
from acollect._rollout.env_faults import check_env_errors
from acollect._runtime.threads import run_in_thread
from acollect._validate import check_int
from acollect._weights.updates import PolicyWeights, WeightUpdate, structure_of, weights_of
from acollect.collectors._base import CollectorBase
from acollect.collectors._drivers import Driver, LoopDriver, ThreadDriver
from acollect.collectors._keywords import keyword_errors, settings_from
from acollect.collectors._option_checks import check_policy_args
from acollect.collectors._options import Devices, InProcessSettings
from acollect.envs._envpool import reseed_error
from acollect.envs._factory import check_env_arg, known_num_envs
from acollect.errors import ConfigurationError

__all__ = ["Collector"]


class Collector(CollectorBase):
    """Collects batches from an env in this process, off the event loop.

    Args:
        create_env_fn: an env, a gymnasium id (``"CartPole-v1"``), or a zero-argument callable returning an
            env (acollect ``EnvBase``, gymnasium ``Env``/``VectorEnv``, or torchrl env).
        policy: a ``TensorDictModule``, a plain ``nn.Module`` (observation in, action out), a callable on
            TensorDicts, or ``None`` for random actions.

    Keyword Args:
        frames_per_batch: frames in each batch handed out (required). The signature lists every other
            keyword with its default; each is described once, in the options reference (``docs/options.md``),
            as :class:`~acollect.collectors._options.InProcessSettings` declares it.

    Examples:
        >>> import anyio, torch
        >>> from acollect import Collector
        >>> policy = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Softmax(-1))
        >>> class Sample(torch.nn.Module):
        ...     def forward(self, obs):
        ...         return torch.multinomial(policy(obs), 1).squeeze(-1)
        >>> async def main():
        ...     async with Collector("CartPole-v1", Sample(), frames_per_batch=64, total_frames=128,
        ...                          env_kwargs={"num_envs": 4}) as collector:
        ...         async for batch in collector:
        ...             print(batch.shape, batch["next", "reward"].shape)
        >>> anyio.run(main)
        torch.Size([4, 16]) torch.Size([4, 16, 1])
        torch.Size([4, 16]) torch.Size([4, 16, 1])
    """

    settings_class: ClassVar[type[InProcessSettings]] = InProcessSettings
    settings: InProcessSettings

    @keyword_errors()
    def __init__(
        self,
        create_env_fn: Any,
        policy: PolicyLike = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        policy_factory: Callable[[], PolicyLike] | str | None = None,
        device: Devices | None = None,
        env_device: Devices | None = None,
        policy_device: Devices | None = None,
        storing_device: Devices | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = 0,
        reset_at_each_iter: bool = False,
        env_errors: str = "raise",
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool = False,
        trajs_per_batch: int | None = None,
        exploration_type: InteractionType | str | None = InteractionType.RANDOM,
        env_kwargs: Mapping[str, Any] | None = None,
        progress: bool | str = False,
        gil_handover_interval: float | None = 0.002,
    ) -> None:
        settings = settings_from(InProcessSettings, locals())
        check_policy_args(policy, settings.policy_factory)
        if create_env_fn is None:
            raise ConfigurationError.bad_value(
                "create_env_fn", None, "an env, a gymnasium id, or a callable returning an env"
            )
        check_env_arg(create_env_fn)  # an unregistered gymnasium id is known now, not when the env is built
        check_env_errors(create_env_fn, settings.env_errors)  # an env given built cannot be rebuilt
        batch = BatchPlan(settings.frames_per_batch)
        batch.settle([known_num_envs(create_env_fn, settings.env_kwargs)])  # where the arguments say it
        super().__init__(batch=batch, total_frames=settings.total_frames, progress=settings.progress)
        self.settings = settings
        self.create_env_fn = create_env_fn
        self._policy_arg = policy
        # What the engine is built from: made once, here, and carried whole to the one engine builder.
        self._rollout = settings.rollout_spec(create_env_fn, policy, frames_per_batch=batch.per_worker)
        # split_trajs and postproc, settled once: the settings never change.
        self._reshape = settings.reshaper()
        # How the engine runs (a thread per batch, or coroutine envs on the loop): picked once, when it is built.
        self._driver: Driver | None = None
        self._weights = PolicyWeights()
        self._seed: int | None = None
        self._pending_state: dict[str, Any] | None = None
        self._engine_busy = threading.Lock()
        self._episodes = EpisodeTracker()  # used by the collection thread only
        # What engines closed already counted: stats() stays whole after a shutdown.
        self._closed_counts: dict[str, Any] = {}

    @property
    def _engine(self) -> Engine | None:
        """The engine, once built (read through the protocol every engine shares)."""
        return self._driver.engine if self._driver is not None else None

    # -- building --------------------------------------------------------------------
    def _build_engine(self) -> RolloutEngine | AsyncRollout:
        # Coroutine envs step on the event loop (see _setup), applying staged weights between policy passes.
        return build_engine(self._rollout, blocking=False, weights=self._weights)

    def _build_and_keep(self, torch_threads: int) -> None:
        torch.set_num_threads(torch_threads)  # the policy's probe call runs here (see _collect_in_thread)
        # Kept from the thread itself: a set-up cancelled while the env is built still leaves an engine
        # that _teardown closes, never an env nobody knows of.
        engine = self._build_engine()
        self._driver = (
            LoopDriver(engine, self._tasks.spawn)
            if isinstance(engine, AsyncRollout)
            else ThreadDriver(engine, self._weights, self._engine_busy, self.settings.gil_handover_interval)
        )

    async def _setup(self) -> None:
        threads = torch.get_num_threads()
        await run_in_thread(lambda _stop: self._build_and_keep(threads), name="build-env")
        assert self._driver is not None
        assert self._engine is not None
        if self._seed is not None:  # staged before the env was known
            try:
                self._refuse_seed_of_built_env(self._seed)
            except ConfigurationError:
                self._seed = None  # refused: entering again starts without it
                raise
        await self._driver.start(self._tasks.spawn)
        # Here, on the event loop, the warning points at the user's `async with` / `async for` line.
        self._settle_batch([self._engine.n_envs])
        if self._pending_state is not None:
            self._load_engine_state(self._pending_state)
            self._pending_state = None

    def _keep_counts(self) -> None:
        if self._driver is not None:
            self._closed_counts = self._counters()

    async def _teardown(self) -> None:
        self._keep_counts()
        driver, self._driver = self._driver, None
        if driver is not None:
            await driver.aclose()

    def _release_now(self) -> None:
        self._keep_counts()
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.release_now()

    # -- collecting ----------------------------------------------------------------------
    def _made(self, batch: TensorDictBase) -> tuple[TensorDictBase, EpisodeSummary, int, int]:
        """Where a batch was made (off the event loop where it was made off it): its episodes counted before
        postproc can change the layout, the batch as it is handed out, and the version and size that made it."""
        engine = self._engine
        assert engine is not None
        episodes = self._episodes.update(batch)
        batch = self._reshape(batch) if self._reshape is not None else batch
        return batch, episodes, engine.policy_version, engine.frames_per_batch

    async def _collect_batch(self) -> TensorDictBase:
        driver = self._driver
        assert driver is not None
        seed, self._seed = self._seed, None
        (batch, episodes, version, frames), spent = await driver.collect(seed, self._made)
        self._counts.stats.record_worker(0, frames, version, episodes, time_spent=spent)
        return batch

    async def _apply_pause(self, paused: bool) -> None:
        if self._driver is not None:
            await self._driver.set_paused(paused)

    def _counters(self) -> dict[str, Any]:
        counts = dict(self._closed_counts)
        engine = self._engine
        if engine is not None:
            counts["discarded_frames"] = counts.get("discarded_frames", 0) + engine.discarded_frames
            counts["env_restarts"] = counts.get("env_restarts", 0) + engine.env_restarts
            if engine.env_restarts_by_sub_env:
                counts["env_restarts_by_sub_env"] = {0: engine.env_restarts_by_sub_env}
        return counts

    # -- weights ----------------------------------------------------------------------------
    @property
    def policy(self) -> torch.nn.Module | Any:
        """The policy the collector runs (after its env was built), else the policy it was given."""
        if self._engine is not None:
            return self._engine.policy.module
        return self._policy_arg

    @property
    def policy_version(self) -> int:
        """Version of the weights the next batch is collected with."""
        return self._weights.version

    async def _update_policy_weights(self, update: WeightUpdate) -> int:
        """Stages the weights; the rollout thread applies them before its next batch, or at once if it is idle.

        Examples:
            >>> import anyio, torch
            >>> from acollect import Collector
            >>> from acollect.testing import CountingEnv
            >>> net = torch.nn.Sequential(torch.nn.Linear(1, 2), torch.nn.Softmax(-1))
            >>> class Pick(torch.nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.net = net
            ...     def forward(self, obs):
            ...         return self.net(obs).argmax(-1)
            >>> async def main():
            ...     async with Collector(CountingEnv, policy_factory=Pick, frames_per_batch=4) as c:
            ...         await c.update_policy_weights_(Pick())
            ...         batch = await anext(c)
            ...         return batch["collector", "policy_version"].unique().tolist()
            >>> anyio.run(main)
            [1]
        """
        self._calls.check_usable("update_policy_weights_()")
        source = update.policy_only(self._policy_arg, "an in-process collector runs one policy, in no worker process")
        if self._engine is None and self.settings.policy_factory is not None:
            with self._calls.call("update_policy_weights_()"):
                await self._ensure_setup()  # only the factory's policy says what the weights must fit
        target = self._engine.policy.weights_module if self._engine is not None else None
        staged = weights_of(source, target, structure_of(target if self._engine is not None else self._policy_arg))
        # The engine applies staged weights at its next batch boundary; if it is idle, apply now.
        version = self._weights.stage(staged)
        if self._engine is not None and self._engine_busy.acquire(blocking=False):
            try:
                self._weights.apply_pending(self._engine)
            finally:
                self._engine_busy.release()
        return version

    # -- seeding and state --------------------------------------------------------------------
    def set_seed(self, seed: int) -> int:
        """Seeds the envs (env ``i`` gets ``seed + i``), the random policy and torch's RNG.

        Applied at the start of the next batch, which starts from a fresh reset. Same seed and same
        weights give identical batches.

        Returns:
            The next free seed (``seed + n_envs`` once the env is known, else ``seed + 1``).

        Raises:
            ConfigurationError: the env can only be seeded when built (EnvPool): here once it is built, else when
                it is (entering the collector, or its first batch).
        """
        check_int("seed", seed)
        self._calls.check_usable("set_seed()")
        self._refuse_seed_of_built_env(seed)
        self._seed = seed
        n_envs = self._engine.n_envs if self._engine is not None else 1
        return seed + n_envs

    def _refuse_seed_of_built_env(self, seed: int) -> None:
        """Raises where the env was seeded when built (EnvPool): now, not from the rollout thread at the next batch."""
        engine = self._engine
        if engine is not None and engine.env.build_seed is not None:
            raise reseed_error(seed, [engine.env.build_seed])

    def state_dict(self) -> dict[str, Any]:
        """Counters, trajectory ids, policy weights and version, so a resumed collector continues.

        Examples:
            >>> from acollect import Collector
            >>> sorted(Collector("CartPole-v1", frames_per_batch=8).state_dict())
            ['batches', 'frames', 'next_traj_counter', 'policy_state_dict', 'policy_version']
        """
        engine = self._engine
        module = (
            engine.policy.weights_module
            if engine is not None
            else (self._policy_arg if isinstance(self._policy_arg, torch.nn.Module) else None)
        )
        return {
            "frames": self._counts.frames,
            "batches": self._counts.batches,
            "next_traj_counter": engine.next_traj_counter if engine is not None else 0,
            "policy_version": self._weights.version,
            "policy_state_dict": TensorDict.from_module(module).clone() if module is not None else None,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` saved."""
        missing = {"frames", "batches", "next_traj_counter", "policy_version"} - set(state_dict)
        if missing:
            raise ConfigurationError.bad_value(
                "state_dict", sorted(state_dict), f"a collector state dict (missing keys: {sorted(missing)})"
            )
        self._counts.restore(int(state_dict["frames"]), int(state_dict["batches"]))
        self._weights.version = int(state_dict["policy_version"])
        weights = state_dict.get("policy_state_dict")
        if weights is not None:
            self._weights.stage(weights, bump=False)
        if self._engine is not None:
            self._load_engine_state(state_dict)
        else:
            self._pending_state = dict(state_dict)

    def _load_engine_state(self, state_dict: Mapping[str, Any]) -> None:
        assert self._engine is not None
        self._engine.next_traj_counter = int(state_dict["next_traj_counter"])
        self._engine.frames = int(state_dict["frames"])
        self._engine.restart()  # fresh trajectories get ids from the restored counter
