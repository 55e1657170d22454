"""Whose turn it is, in the coroutine-env engine: envs waiting for an action, actions handed out, steps in flight.

The policy task (:class:`~acollect._rollout.policy_passes.PolicyPasses`) takes the envs waiting for an action
(:meth:`EnvTurns.waiting`, the batching rule's wait) and hands each its action (:meth:`EnvTurns.give`); the task of
each env (:class:`~acollect._rollout.env_steps.EnvSteps`) waits for its own (:meth:`EnvTurns.action_for`), steps,
and says
its step ended (:meth:`EnvTurns.stepped`). A pause stops the handing out; :meth:`EnvTurns.settle` waits for the
steps in flight to end.

Examples:
    >>> import anyio
    >>> async def main():
    ...     turns = EnvTurns(2)
    ...     turns.start()  # at first, every env waits for an action
    ...     waiting = await turns.waiting()
    ...     turns.give(waiting, ["left", "right"])
    ...     action = await turns.action_for(1)
    ...     turns.stepped(1, goes_on=True)  # env 1 stepped, and waits for its next action
    ...     return waiting, action, await turns.waiting()
    >>> anyio.run(main)
    ([0, 1], 'right', [1])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel

__all__ = ["EnvTurns"]


class EnvTurns:
    """The hand-over between the policy task and the env tasks of ``n_envs`` coroutine envs.

    Args:
        n_envs: how many envs take turns.

    Attributes:
        ready: the envs waiting for an action, in the order their steps ended.
    """

    def __init__(self, n_envs: int) -> None:
        self.n_envs = n_envs
        self.ready: list[int] = []
        self._actions: list[Any] = [None] * n_envs
        self._go = [anyio.Event() for _ in range(n_envs)]  # set once env i's action is there
        self._wake = anyio.Event()  # set once an env waits (or a pause ends): the policy task looks again
        self._in_flight = 0  # envs given an action whose step has not ended
        # While paused (and only then), the event set once the last step in flight ended.
        self._settled: anyio.Event | None = None

    @property
    def paused(self) -> bool:
        """Whether actions are held back (a pause of the collector)."""
        return self._settled is not None

    def start(self) -> None:
        """Starts afresh (the env tasks are new): every env waits for an action, and no step is in flight."""
        self.ready = list(range(self.n_envs))
        self._go = [anyio.Event() for _ in range(self.n_envs)]
        self._wake, self._in_flight = anyio.Event(), 0
        self._wake.set()

    # -- the policy task's side -----------------------------------------------------------------
    async def waiting(self) -> list[int]:
        """The envs waiting for an action, once at least one waits and no pause holds.

        After one yield to the loop: envs whose steps ended in the same loop turn join.
        """
        while True:
            if not self.ready or self.paused:
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            await anyio.lowlevel.checkpoint()
            if self.paused:
                continue
            envs, self.ready = self.ready, []
            return envs

    def give(self, envs: Sequence[int], actions: Sequence[Any]) -> None:
        """Hands env ``envs[j]`` its action ``actions[j]``; each steps at once."""
        self._in_flight += len(envs)
        for i, action in zip(envs, actions, strict=True):
            self._actions[i] = action
            self._go[i].set()

    def release(self, envs: Sequence[int]) -> None:
        """Envs parked at a full row wait for an action again (the batch was handed out, their next row is free)."""
        self.ready.extend(envs)
        self._wake.set()

    # -- an env task's side ------------------------------------------------------------------------
    async def action_for(self, i: int) -> Any:
        """Env ``i``'s next action, once the policy task gave it."""
        await self._go[i].wait()
        return self._actions[i]

    def stepped(self, i: int, goes_on: bool) -> None:
        """Env ``i``'s step ended: it waits for its next action (``goes_on``), or is parked until :meth:`release`."""
        self._go[i] = anyio.Event()  # a parked env waits on it too, until the batch is handed out
        if goes_on:
            self.ready.append(i)
            self._wake.set()
        self._in_flight -= 1
        if self._in_flight == 0 and self._settled is not None:
            self._settled.set()

    # -- pausing -------------------------------------------------------------------------------------
    def pause(self) -> None:
        """Holds actions back from now on (the steps in flight go on: :meth:`settle` waits for them)."""
        self._settled = anyio.Event()

    def resume(self) -> None:
        """Hands actions out again."""
        self._settled = None
        self._wake.set()

    async def settle(self, timeout: float) -> None:
        """Waits until no step is in flight, for at most ``timeout`` seconds (call it paused)."""
        settled = self._settled
        if self._in_flight and settled is not None:
            with anyio.move_on_after(timeout):
                await settled.wait()
