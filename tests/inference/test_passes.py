"""Passes in flight: several forward passes at once, weights applied only between them, answers to their callers."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from acollect.inference._batching import InferenceRequest, Lane
from acollect.inference._passes import PassRunner


def test_two_passes_run_at_once() -> None:
    # Each pass waits until the other started: only passes that overlap get past the barrier.
    barrier = threading.Barrier(2, timeout=10.0)
    woken = threading.Event()

    def forward(requests: Sequence[InferenceRequest], version: int, lane: Lane) -> None:
        barrier.wait()
        for request in requests:
            request.outputs, request.version = {}, version

    runner = PassRunner(forward, in_flight=2, on_done=woken.set)
    try:
        runner.submit([InferenceRequest({}, 1)], version=1)
        runner.submit([InferenceRequest({}, 1)], version=1)
        assert not runner.free
        assert runner.wait_idle(timeout=10.0)
        done = runner.finished()
        assert [d.error for d in done] == [None, None]
        assert woken.is_set()
    finally:
        runner.close(timeout=5.0)


def test_a_slot_answer_comes_from_the_pass_and_the_rest_back_to_the_loop_with_outputs_of_their_own() -> None:
    answered: list[InferenceRequest] = []
    recorded: list[int] = []
    import torch

    def forward(requests: Sequence[InferenceRequest], version: int, lane: Lane) -> None:
        shared = torch.arange(4)  # a lane's buffer, rewritten by its next pass
        for i, request in enumerate(requests):
            request.outputs, request.version = {("action",): shared[i : i + 1]}, version

    def answer(request: InferenceRequest) -> bool:
        if request.route == b"slot":
            answered.append(request)
            return True
        return False

    runner = PassRunner(forward, in_flight=1, on_done=lambda: None, answer=answer,
                        record=lambda requests, started, ended: recorded.append(len(requests)))  # fmt: skip
    try:
        slot, message = InferenceRequest({}, 1, route=b"slot"), InferenceRequest({}, 1, route=b"peer")
        runner.submit([slot, message], version=7)
        assert runner.wait_idle(timeout=10.0)
        (done,) = runner.finished()
        assert answered == [slot]
        assert done.requests == [message]
        assert recorded == [2], "counted before anyone was answered"
        assert message.outputs is not None
        assert slot.outputs is not None
        own = message.outputs[("action",)].untyped_storage().data_ptr()
        assert own != slot.outputs[("action",)].untyped_storage().data_ptr(), "its outputs outlive the lane's buffer"
    finally:
        runner.close(timeout=5.0)


def test_a_failing_pass_goes_back_to_the_loop_with_every_request() -> None:
    def forward(requests: Sequence[InferenceRequest], version: int, lane: Lane) -> None:
        raise ValueError("the policy broke")

    runner = PassRunner(forward, in_flight=2, on_done=lambda: None, answer=lambda request: True)
    try:
        requests = [InferenceRequest({}, 1), InferenceRequest({}, 2)]
        runner.submit(requests, version=1)
        assert runner.wait_idle(timeout=10.0)
        (done,) = runner.finished()
        assert isinstance(done.error, ValueError)
        assert done.requests == requests, "a failed pass's callers are told by the loop, with the error"
    finally:
        runner.close(timeout=5.0)


def test_the_oldest_running_pass_is_what_a_hang_check_sees() -> None:
    started = threading.Event()
    release = threading.Event()
    seen: list[float | None] = []

    def forward(requests: Sequence[InferenceRequest], version: int, lane: Lane) -> None:
        started.set()
        release.wait(10.0)

    runner = PassRunner(forward, in_flight=2, on_done=lambda: None, running=seen.append)
    try:
        runner.submit([InferenceRequest({}, 1)], version=1)
        assert started.wait(10.0)
        assert runner.oldest_start is not None
        release.set()
        assert runner.wait_idle(timeout=10.0)
        assert runner.oldest_start is None
        assert seen[0] is not None
        assert seen[-1] is None
    finally:
        runner.close(timeout=5.0)


@pytest.mark.gpu
def test_a_cuda_lane_gathers_through_page_locked_buffers_it_reuses() -> None:
    import torch

    lane = Lane(torch.device("cuda"))
    parts = [torch.full((2, 3), float(i)) for i in range(3)]
    with lane.context():
        first = lane.gather(("obs",), parts)
        host = lane.to_host({"x": first * 2})
    assert first.device.type == "cuda"
    assert torch.equal(host["x"], torch.cat(parts) * 2)
    assert host["x"].is_pinned()
    with lane.context():
        again = lane.to_host({"x": lane.gather(("obs",), parts) + 1})
    assert again["x"].data_ptr() == host["x"].data_ptr(), "the page-locked output buffer is reused"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_a_cuda_server_with_passes_in_flight_answers_every_caller_with_its_own_rows(mode: str) -> None:
    import anyio
    import torch
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule

    from acollect import InferenceServer
    from acollect.testing import Doubler

    policy = TensorDictModule(Doubler(), in_keys=["observation"], out_keys=["action"])
    answers: dict[int, torch.Tensor] = {}
    async with InferenceServer(policy, device="cuda", max_batch_size=16, max_wait=0.001, passes_in_flight=2,
                               mode=mode) as server:  # fmt: skip
        assert server.device == torch.device("cuda")

        async def ask(i: int) -> None:
            obs = TensorDict({"observation": torch.full((3, 2), float(i))}, batch_size=[3])
            answers[i] = (await server.infer(obs))["action"]

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(64):
                    tg.start_soon(ask, i)
    for i, action in answers.items():
        assert action.device.type == "cpu"
        assert torch.equal(action, torch.full((3, 2), 2.0 * i))


def test_an_inline_pass_runs_in_the_submitting_thread_and_its_failure_reaches_the_loop() -> None:
    threads: list[str] = []

    def forward(requests: Sequence[InferenceRequest], version: int, lane: Lane) -> None:
        threads.append(threading.current_thread().name)
        if version == 2:
            raise RuntimeError("the policy failed")
        for request in requests:
            request.outputs, request.version = {}, version

    runner = PassRunner(forward, in_flight=1, on_done=lambda: None, inline=True)
    try:
        runner.submit([InferenceRequest({}, 1)], version=1)
        assert runner.free  # done when submit returned: nothing runs
        runner.submit([InferenceRequest({}, 1)], version=2)
        done = runner.finished()
        assert threads == [threading.current_thread().name] * 2
        assert done[0].error is None
        assert done[0].requests[0].version == 1
        assert isinstance(done[1].error, RuntimeError)
    finally:
        runner.close(timeout=5.0)
    with pytest.raises(ValueError, match="in_flight must be 1"):
        PassRunner(forward, in_flight=2, on_done=lambda: None, inline=True)
