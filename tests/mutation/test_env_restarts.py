"""Env restarts (``env_errors="restart"``, :mod:`acollect._rollout.env_faults`): exact counts, the exception that
ends the rebuilds, and what the errors and the log say.

Each test kills mutants that ``tools/mutation.py env_faults`` found alive: a rebuild counted twice, a failed
restart taken for a success, the wrong exception raised once the rebuilds are spent, a message that names the
wrong thing.
"""

from __future__ import annotations

import logging
import re

import anyio
import pytest
import torch

from acollect._rollout.env_faults import MAX_REBUILDS_IN_A_ROW, EnvFaults, check_env_errors, env_faults_for
from acollect.envs import EnvBase
from acollect.errors import ConfigurationError, EnvError
from acollect.testing import CountingEnv, CrashingEnv


class CallableEnv(CountingEnv):
    """An env instance that happens to be callable: still an env given built, which cannot be rebuilt."""

    def __call__(self) -> CallableEnv:
        return self


def crash(env: EnvBase) -> Exception:
    """What ``env`` raises at its first step (a :class:`CrashingEnv` made to crash there)."""
    root = env.reset()
    with pytest.raises(RuntimeError) as info:
        env.step(root.set("action", torch.zeros(env.num_envs, dtype=torch.int64)))
    return info.value


def test_a_bad_value_names_the_argument_it_was_given_as_and_what_it_takes() -> None:
    expected = "worker_env_errors='retry' is invalid: expected 'raise' or 'restart'."
    with pytest.raises(ConfigurationError, match=f"^{re.escape(expected)}$"):
        check_env_errors(CountingEnv, "retry", name="worker_env_errors")


@pytest.mark.parametrize(
    "factory", ["CartPole-v1", CountingEnv, lambda: CountingEnv(2)], ids=["id", "class", "function"]
)
def test_a_gymnasium_id_a_class_and_a_function_can_be_rebuilt(factory: object) -> None:
    check_env_errors(factory, "restart")
    check_env_errors(factory, "raise")


@pytest.mark.parametrize("built", [42, CountingEnv(), CallableEnv()], ids=["not-callable", "instance", "callable"])
def test_anything_else_cannot_be_rebuilt(built: object) -> None:
    with pytest.raises(ConfigurationError, match=r"^env_errors='restart' is invalid: expected 'raise' where the env"):
        check_env_errors(built, "restart")
    check_env_errors(built, "raise")  # what it raises breaks the collector: nothing to rebuild


def test_env_faults_for_builds_from_the_factory_with_its_kwargs_and_none_without_restarts() -> None:
    assert env_faults_for(CountingEnv, {"num_envs": 3}, "raise") is None
    faults = env_faults_for(CrashingEnv, {"crash_at_step": 1, "num_envs": 3}, "restart")
    assert faults is not None
    env = CrashingEnv(1, 3)
    new = faults.recover(env, crash(env), steps=0, start=lambda new: None)
    assert isinstance(new, CrashingEnv)
    assert new.num_envs == 3


def test_each_rebuild_is_counted_once_and_the_env_that_raised_is_closed(caplog: pytest.LogCaptureFixture) -> None:
    built: list[EnvBase] = []

    def make() -> EnvBase:
        built.append(CountingEnv(2))
        return built[-1]

    faults = EnvFaults(make)
    env = CrashingEnv(1, 2)
    started: list[EnvBase] = []
    new = faults.recover(env, crash(env), steps=0, start=started.append)
    assert (new, started, faults.restarts) == (built[0], built, 1)
    assert env.is_closed
    assert not new.is_closed
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("the env raised RuntimeError: CrashingEnv crashed at step 1")
    assert "(env_errors='restart', rebuild 1 in a row of at most 3)" in warnings[0]


def test_a_factory_that_fails_is_retried_without_closing_anything_twice(caplog: pytest.LogCaptureFixture) -> None:
    failures = [OSError("licence server away"), OSError("licence server still away")]

    def make() -> EnvBase:
        if failures:
            raise failures.pop(0)
        return CountingEnv(2)

    faults = EnvFaults(make)
    env = CrashingEnv(1, 2)
    new = faults.recover(env, crash(env), steps=0, start=lambda new: None)
    assert new.num_envs == 2
    assert faults.restarts == 1
    messages = [r.getMessage() for r in caplog.records]
    assert not any("closing the env that raised failed" in m for m in messages), messages
    assert [m.split(":")[0] for m in messages] == ["the env raised RuntimeError", "the env raised OSError",
                                                   "the env raised OSError"]  # fmt: skip


def test_a_rebuilt_env_with_other_sub_envs_is_refused_by_name_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    faults = EnvFaults(lambda: CountingEnv(3))
    env = CrashingEnv(1, 2)
    with pytest.raises(EnvError, match=r"^the rebuilt env has 3 envs where the first had 2$"):
        faults.recover(env, crash(env), steps=0, start=lambda new: None)
    assert faults.restarts == 0
    assert sum("giving up" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR) == 1


def test_the_rebuilds_in_a_row_start_again_once_a_step_was_taken() -> None:
    faults = EnvFaults(lambda: CountingEnv(1), max_in_a_row=2)
    env = CrashingEnv(1, 1)
    error = crash(env)
    for steps in (0, 5, 9):  # a step between each fault: never two in a row
        env = faults.recover(env, error, steps=steps, start=lambda new: None)
    assert faults.restarts == 3
    env = faults.recover(env, error, steps=9, start=lambda new: None)  # no step since the last fault: 2 in a row
    with pytest.raises(RuntimeError, match="CrashingEnv crashed at step 1"):
        faults.recover(env, error, steps=9, start=lambda new: None)
    assert faults.restarts == 4


async def test_a_coroutine_env_is_restarted_until_its_restart_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    outcomes: list[Exception | None] = [OSError("pool busy"), None]
    calls = 0

    async def restart() -> None:
        nonlocal calls
        calls += 1
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    faults = EnvFaults()
    await faults.arecover(3, RuntimeError("socket closed"), steps=0, restart=restart)
    assert (calls, faults.restarts) == (2, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(":")[0] for w in warnings] == ["sub-env 3 raised RuntimeError", "sub-env 3 raised OSError"]


async def test_a_coroutine_env_whose_restarts_keep_failing_raises_the_last_failure() -> None:
    count = 0

    async def restart() -> None:
        nonlocal count
        count += 1
        raise OSError(f"restart {count} failed")

    faults = EnvFaults()
    with anyio.fail_after(10), pytest.raises(OSError, match=f"^restart {MAX_REBUILDS_IN_A_ROW} failed$"):
        await faults.arecover(0, RuntimeError("socket closed"), steps=4, restart=restart)
    assert (count, faults.restarts) == (MAX_REBUILDS_IN_A_ROW, 0)


def test_recover_is_for_batched_envs_only() -> None:
    env = CrashingEnv(1, 1)
    with pytest.raises(AssertionError, match=r"^an EnvFaults without make_env recovers coroutine envs only"):
        EnvFaults().recover(env, crash(env), steps=0, start=lambda new: None)
