"""The inference server on its own: batching, answers to the right caller, weights between passes, failures."""

from __future__ import annotations

import anyio
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import ConfigurationError, InferenceServer
from acollect.errors import CollectorStateError, InferencePolicyError
from acollect.inference._batching import Batcher, InferenceRequest
from acollect.testing import wait_until


class Doubler(torch.nn.Module):
    """action = 2 * observation + bias: each caller can check it got the answer to its own observations."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(()))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return 2 * observation + self.bias


def obs(values: list[float]) -> TensorDict:
    return TensorDict({"observation": torch.tensor(values).unsqueeze(-1)}, batch_size=[len(values)])


def request(rows: int, source: bytes | None = None, arrived: float = 0.0) -> InferenceRequest:
    return InferenceRequest({("observation",): torch.zeros(rows, 1)}, rows, source=source, arrived=arrived)


def test_a_batch_runs_when_full_when_every_source_waits_or_after_max_wait() -> None:
    batcher = Batcher(max_batch_size=8, max_wait=0.5, sources=2)
    batcher.add(request(3, b"a", arrived=10.0))
    assert not batcher.ready(10.1)  # one source of two, not full, not waited long
    assert batcher.ready(10.5)  # waited max_wait
    batcher.add(request(3, b"a", arrived=10.2))
    assert not batcher.ready(10.3)  # still only source a
    batcher.add(request(2, b"b", arrived=10.3))
    assert batcher.ready(10.3)  # every source waits (and 8 rows: full)
    taken = batcher.take()
    assert [r.rows for r in taken] == [3, 3, 2]
    batcher.add(request(5, arrived=11.0))
    batcher.add(request(5, arrived=11.0))
    assert [r.rows for r in batcher.take()] == [5]  # never more than max_batch_size rows...
    batcher.add(request(20, arrived=11.0))
    assert [r.rows for r in batcher.take()] == [5]
    assert [r.rows for r in batcher.take()] == [20]  # ...but a request bigger than that runs alone


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_concurrent_callers_share_passes_and_each_gets_its_own_answer(backend: str) -> None:
    async def main() -> None:
        policy = TensorDictModule(Doubler(), in_keys=["observation"], out_keys=["action"])
        answers: dict[int, torch.Tensor] = {}
        with anyio.fail_after(30):
            async with InferenceServer(policy, max_batch_size=64, max_wait=0.05) as server:

                async def ask(i: int) -> None:
                    answers[i] = (await server.infer(obs([i, i + 0.5])))["action"]

                async with anyio.create_task_group() as tg:
                    for i in range(12):
                        tg.start_soon(ask, i)
                single = await server.infer(TensorDict({"observation": torch.tensor([3.0])}, []))
                stats = server.stats()
        for i, action in answers.items():
            assert action.squeeze(-1).tolist() == [2 * i, 2 * i + 1]
        assert single["action"].tolist() == [6.0]  # an unbatched observation gets an unbatched answer
        assert (stats.requests, stats.rows) == (13, 25)
        assert stats.passes < 13, "concurrent requests must share forward passes"
        assert stats.latency_ms_p99 is not None
        assert stats.latency_ms_p50 is not None
        assert 0 <= stats.latency_ms_p50 <= stats.latency_ms_p99
        assert stats.mean_batch_size > 1

    anyio.run(main, backend=backend)


async def test_a_weight_update_reaches_the_next_pass_and_the_callers_policy_is_left_alone() -> None:
    trained = Doubler()
    async with InferenceServer(trained, max_wait=0.0) as server:
        assert (await server.infer(obs([1.0])))["action"].item() == 2.0
        with torch.no_grad():
            trained.bias.fill_(10.0)  # training changes the caller's module, not the server's copy...
        assert (await server.infer(obs([1.0])))["action"].item() == 2.0
        assert await server.update_policy_weights_(trained) == 1  # ...until the weights are pushed
        assert (await server.infer(obs([1.0])))["action"].item() == 12.0
        assert await server.update_policy_weights_(weights={"bias": torch.tensor(-1.0)}) == 2
        assert (await server.infer(obs([1.0])))["action"].item() == 1.0
        with pytest.raises(ConfigurationError, match="weight"):
            await server.update_policy_weights_(weights={"nope": torch.zeros(3)})
        with pytest.raises(ConfigurationError, match="one source of weights, got policy_or_weights and weights="):
            await server.update_policy_weights_(trained, weights={"bias": torch.tensor(0.0)})  # as every collector
        assert (server.version, server.stats().policy_version) == (2, 2)


class Broken(torch.nn.Module):
    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad policy")


async def test_a_policy_that_raises_fails_its_callers_with_the_traceback_and_later_calls() -> None:
    with anyio.fail_after(30):
        async with InferenceServer(Broken(), max_wait=0.0, mode="thread") as server:
            with pytest.raises(ValueError, match="bad policy") as info:
                await server.infer(obs([1.0]))
            assert any(frame.name == "forward" for frame in info.traceback)  # the policy's own frame
            await anyio.sleep(0.05)
            with pytest.raises(CollectorStateError, match="failed"):
                await server.infer(obs([1.0]))


async def test_a_policy_that_raises_in_the_server_process_fails_its_callers_with_the_remote_traceback() -> None:
    with anyio.fail_after(30):
        async with InferenceServer(Broken(), max_wait=0.0) as server:
            with pytest.raises(InferencePolicyError, match="bad policy") as info:  # a PolicyError
                await server.infer(obs([1.0]))
            assert info.value.pid == server.pid
            # The process's own report follows the answer: its type and traceback, the policy's frame in it.
            await wait_until(lambda: not server.running, timeout=5)
            with pytest.raises(CollectorStateError, match="failed") as later:
                await server.infer(obs([1.0]))
            cause = later.value.__cause__
            assert isinstance(cause, InferencePolicyError)
            assert cause.type_name == "builtins.ValueError"
            assert "in forward" in cause.remote_traceback


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_the_server_says_where_its_policy_copy_is(mode: str) -> None:
    net = TensorDictModule(Doubler(), in_keys=["observation"], out_keys=["action"])
    server = InferenceServer(net, max_wait=0.0, mode=mode)
    assert server.policy_device is None  # nothing is built before the start
    with anyio.fail_after(60):
        async with server:
            assert server.policy_device == torch.device("cpu")  # in process mode, as the server process's hello said
            await server.infer(obs([1.0]))
    assert server.device is None  # what was asked for stays as it was given


async def test_closing_answers_a_waiting_caller() -> None:
    server = InferenceServer(Doubler(), max_batch_size=100, max_wait=30.0)  # would wait 30 s for company
    await server.start()
    outcome: list[BaseException] = []

    async def ask() -> None:
        try:
            await server.infer(obs([1.0]))
        except CollectorStateError as exc:
            outcome.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await anyio.sleep(0.1)
            await server.async_shutdown()
    assert len(outcome) == 1
    assert "closed" in str(outcome[0])
    await server.async_shutdown()  # idempotent
    await server.aclose()  # the alias, as idempotent


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_wait": -1.0}, "max_wait"),
        ({"device": "nowhere"}, "device"),
        ({"address": "udp://x"}, "address"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        InferenceServer(Doubler(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="policy"):
        InferenceServer(None)
