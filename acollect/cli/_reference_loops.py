"""The hand-written loops acollect is measured against, and the ceiling for worker processes.

:class:`CleanRLLoop` is the loop a user writes instead of using a collector, in the style of
cleanrl: ``gymnasium.make_vec(..., vectorization_mode="sync")`` with gymnasium's **default**
autoreset, the policy a ``TensorDictModule`` called on a TensorDict of the observation, and
observations, actions, rewards and dones copied into preallocated ``[n_envs, T]`` buffers,
cloned into a batch of its own at the end of each batch (as a collector hands out batches the
caller keeps).

:class:`LoopPool` (and :func:`run_independent_loops`, once) is the ceiling for worker processes:
``n`` such loops in ``n`` processes started together, with no communication between them. Each
process imports, builds its env and policy and collects warm-up batches first, then all wait on
one barrier and time the same number of batches: start-up and imports are not in the figure.

Examples:
    >>> loop = CleanRLLoop(num_envs=4, frames_per_batch=32)
    >>> loop.collect_batch()
    32
    >>> loop.batch["observation"].shape, loop.batch["done"].dtype
    (torch.Size([4, 8, 4]), torch.bool)
    >>> loop.close()
"""

from __future__ import annotations

import multiprocessing
import queue
import statistics
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "ENV_ID",
    "CategoricalMLPPolicy",
    "CleanRLLoop",
    "IndependentLoops",
    "LoopMeasurement",
    "LoopPool",
    "make_policy",
    "run_independent_loops",
]

ENV_ID = "CartPole-v1"


class CategoricalMLPPolicy(torch.nn.Module):
    """Observation in, sampled action out: ``4 -> 64 -> 64 -> 2`` with Tanh, ``torch.multinomial`` on the softmax.

    Examples:
        >>> CategoricalMLPPolicy()(torch.zeros(8, 4)).shape
        torch.Size([8])
    """

    def __init__(self, obs_dim: int = 4, n_actions: int = 2, hidden: int = 64) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(obs_dim, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, n_actions),
        )

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.net(observation), dim=-1)
        return torch.multinomial(probs, 1).squeeze(-1)


def make_policy() -> Any:
    """The MLP in a ``TensorDictModule`` reading ``"observation"`` and writing ``"action"``: one for every contender.

    Examples:
        >>> from tensordict import TensorDict
        >>> make_policy()(TensorDict({"observation": torch.zeros(2, 4)}, batch_size=[2]))["action"].shape
        torch.Size([2])
    """
    from tensordict.nn import TensorDictModule

    return TensorDictModule(CategoricalMLPPolicy(), in_keys=["observation"], out_keys=["action"])


class CleanRLLoop:
    """The loop a user writes instead: a default-autoreset sync vector env, the policy, ``[E, T]`` buffers.

    Args:
        num_envs: sub-envs of the vector env.
        frames_per_batch: frames per batch; ``T = frames_per_batch // num_envs``.
        policy: a ``TensorDictModule`` (default: a fresh :func:`make_policy`).
        seed: seed of the first reset.
        env_id: the gymnasium id.
    """

    def __init__(
        self, num_envs: int, frames_per_batch: int, *, policy: Any = None, seed: int = 0, env_id: str = ENV_ID
    ) -> None:
        import gymnasium as gym

        self.envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
        self.policy = make_policy() if policy is None else policy
        self.num_envs = num_envs
        self.steps = frames_per_batch // num_envs
        obs, _ = self.envs.reset(seed=seed)
        self._obs = obs
        shape = (num_envs, self.steps)
        self.buffers = {
            "observation": torch.empty(*shape, *obs.shape[1:], dtype=torch.from_numpy(obs).dtype),
            "action": torch.empty(shape, dtype=torch.int64),
            "reward": torch.empty(shape, dtype=torch.float32),
            "done": torch.empty(shape, dtype=torch.bool),
        }
        self.batch: dict[str, torch.Tensor] = {}

    def collect_batch(self) -> int:
        """Steps every env ``T`` times, then clones the buffers into :attr:`batch`; returns the frame count."""
        from tensordict import TensorDict

        envs, policy, b, n = self.envs, self.policy, self.buffers, self.num_envs
        obs = self._obs
        with torch.inference_mode():
            for t in range(self.steps):
                observation = torch.from_numpy(obs)
                action = policy(TensorDict({"observation": observation}, batch_size=[n]))["action"]
                b["observation"][:, t] = observation
                b["action"][:, t] = action
                obs, reward, terminated, truncated, _ = envs.step(action.numpy())
                b["reward"][:, t] = torch.from_numpy(reward)
                b["done"][:, t] = torch.from_numpy(terminated | truncated)
            self.batch = {key: buffer.clone() for key, buffer in b.items()}
        self._obs = obs
        return self.steps * n

    def close(self) -> None:
        self.envs.close()


@dataclass
class LoopMeasurement:
    """What one independent loop process measured, on clocks every process shares (``time.monotonic``)."""

    frames: int
    started: float
    finished: float
    cpu_s: float

    @property
    def frames_per_s(self) -> float:
        return self.frames / (self.finished - self.started)


@dataclass
class IndependentLoops:
    """The ceiling: ``n`` loop processes timed together."""

    processes: list[LoopMeasurement]

    @property
    def frames(self) -> int:
        return sum(p.frames for p in self.processes)

    @property
    def frames_per_s(self) -> float:
        """The ceiling: the sum of every process's frames/s."""
        return sum(p.frames_per_s for p in self.processes)

    @property
    def span_frames_per_s(self) -> float:
        """All frames over the time from the first start to the last finish (at most :attr:`frames_per_s`)."""
        span = max(p.finished for p in self.processes) - min(p.started for p in self.processes)
        return self.frames / span

    def as_dict(self) -> dict[str, Any]:
        return {
            "frames_per_s": self.frames_per_s,
            "span_frames_per_s": self.span_frames_per_s,
            "per_process_frames_per_s": [p.frames_per_s for p in self.processes],
            "start_skew_s": max(p.started for p in self.processes) - min(p.started for p in self.processes),
            "median_process_frames_per_s": statistics.median(p.frames_per_s for p in self.processes),
        }


def _loop_process(
    index: int, sizes: tuple[int, int, int], turn: Any, batches: Any, results: Any, seed: int
) -> None:  # pragma: no cover - runs in the child processes
    num_envs, frames_per_batch, warmup = sizes
    try:
        torch.set_num_threads(1)  # as in a collector's workers
        loop = CleanRLLoop(num_envs, frames_per_batch, seed=seed)
        for _ in range(warmup):
            loop.collect_batch()
        results.put((index, None))  # ready
        while True:
            turn.wait()  # everyone starts together; a broken or timed-out barrier ends the process
            if batches.value <= 0:
                break
            started, cpu = time.monotonic(), time.process_time()
            frames = sum(loop.collect_batch() for _ in range(batches.value))
            finished, cpu = time.monotonic(), time.process_time() - cpu
            results.put((index, LoopMeasurement(frames, started, finished, cpu)))
        loop.close()
    except threading.BrokenBarrierError:
        pass  # the pool closed (or its owner is gone): nothing to report to
    except BaseException:
        turn.abort()  # no one waits for a process that will never arrive
        results.put((index, traceback.format_exc()))


class LoopPool:
    """``n`` :class:`CleanRLLoop` processes kept alive, timed together as often as asked: the ceiling.

    Each process (``spawn``) imports, builds its loop and collects ``warmup`` batches; the pool is
    ready once every one has. Each :meth:`run` then releases all of them at once (a barrier) to
    collect the same number of batches, and returns what each measured. Between runs they wait,
    using no CPU, so the ceiling can take turns with other contenders.

    Args:
        n_processes: how many processes.
        num_envs: envs of each process's vector env.
        frames_per_batch: frames of each process's batches.
        warmup: untimed batches per process before the first run.
        seed: the first process's seed; the others take the next ones.
        timeout: seconds that start-up, and then each run, may take.

    Raises:
        RuntimeError: a process failed (its traceback is in the message), died, or took over ``timeout``.
    """

    def __init__(
        self,
        n_processes: int,
        num_envs: int,
        frames_per_batch: int,
        *,
        warmup: int = 1,
        seed: int = 0,
        timeout: float = 600.0,
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.timeout = timeout
        self._turn = ctx.Barrier(n_processes + 1, timeout=timeout)
        self._batches = ctx.Value("i", 0)
        self._results = ctx.Queue()
        sizes = (num_envs, frames_per_batch, warmup)
        self._procs = [
            ctx.Process(
                target=_loop_process, args=(i, sizes, self._turn, self._batches, self._results, seed + i), daemon=True
            )
            for i in range(n_processes)
        ]
        try:
            for proc in self._procs:
                proc.start()
            self._collect()  # every process is ready
        except BaseException:
            self.close()
            raise

    def _collect(self) -> dict[int, Any]:
        deadline = time.monotonic() + self.timeout
        found: dict[int, Any] = {}
        while len(found) < len(self._procs):
            try:
                index, outcome = self._results.get(timeout=1.0)
            except queue.Empty:
                # A process killed outright (out of memory, a signal) never says so: look at the exit codes.
                dead = [i for i, p in enumerate(self._procs) if i not in found and p.exitcode is not None]
                if dead:
                    codes = ", ".join(f"{i}: exit code {self._procs[i].exitcode}" for i in dead)
                    raise RuntimeError(f"independent loop processes died without a result ({codes})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the independent loops took over {self.timeout:g} s") from None
                continue
            if isinstance(outcome, str):
                raise RuntimeError(f"independent loop process {index} failed:\n{outcome}")
            found[index] = outcome
        return found

    def run(self, batches: int) -> IndependentLoops:
        """Every process collects ``batches`` batches, all starting together; returns what each measured."""
        if batches < 1:
            raise ValueError(f"batches must be a positive int, got {batches!r}")
        if not self._procs:
            raise RuntimeError("the loop processes were closed")
        self._batches.value = batches
        self._turn.wait()
        found = self._collect()
        return IndependentLoops([found[i] for i in range(len(self._procs))])

    def close(self) -> None:
        """Ends the processes (killing any that does not end within a few seconds). Calling it twice is fine."""
        procs, self._procs = self._procs, []  # closed: no process left to end (there is one at least until then)
        if not procs:
            return
        self._batches.value = 0
        try:
            self._turn.wait(timeout=5.0)
        except threading.BrokenBarrierError:
            pass  # a process failed or is gone: the ones left end on the broken barrier
        for proc in procs:
            if proc.pid is None:
                continue
            proc.join(timeout=10.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
        self._results.close()

    def __enter__(self) -> LoopPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_independent_loops(
    n_processes: int,
    num_envs: int,
    frames_per_batch: int,
    batches: int,
    *,
    warmup: int = 1,
    seed: int = 0,
    timeout: float = 600.0,
) -> IndependentLoops:
    """Runs ``n_processes`` :class:`CleanRLLoop` processes together, once, with no communication, and times them.

    Each process (``spawn``) builds its loop, collects ``warmup`` batches, waits for the others on a
    barrier, then collects ``batches`` batches of ``frames_per_batch`` frames from ``num_envs`` envs.
    See :class:`LoopPool` to time them several times.

    Args:
        n_processes: how many processes.
        num_envs: envs of each process's vector env.
        frames_per_batch: frames of each process's batches.
        batches: timed batches per process.
        warmup: untimed batches per process before the barrier.
        seed: the first process's seed; the others take the next ones.
        timeout: seconds for start-up, and again for the timed part.

    Returns:
        What every process measured.

    Raises:
        RuntimeError: a process failed (its traceback is in the message) or the run took over ``timeout``.
    """
    with LoopPool(n_processes, num_envs, frames_per_batch, warmup=warmup, seed=seed, timeout=timeout) as pool:
        return pool.run(batches)
