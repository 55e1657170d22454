"""The CUDA paths, each asserted against a CPU reference.

Every test runs on ``"cpu"`` here (the reference, and a check that the test itself holds) and on ``"cuda"`` where a
GPU is (``pytest -m gpu``). Each one would catch a fault of a CUDA path that values do not show without a GPU: an env
stepping with an action whose device-to-host copy has not landed, a pass reading half-copied weights, host memory
registered with CUDA and never unregistered (or freed while a copy reads it), a server killed by CUDA inputs.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Iterator

import anyio
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from acollect import Collector, InferenceServer, MultiAsyncCollector, MultiSyncCollector
from acollect.envs import GymEnv
from acollect.testing import ENV_STRIDE, CountingEnv, EchoGymEnv, PixelEnv, assert_counting_batch

START_METHOD = "forkserver"  # workers forked from one process that imported everything once: quick to start
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
N_ACTIONS = 997  # prime: counter % N_ACTIONS gives every step of a batch its own action


class SlowCounterPolicy(torch.nn.Module):
    """Acts ``counter % N_ACTIONS``; on a GPU only after a busy wait of about a millisecond of GPU time, so that a
    copy of its action to the host that is not waited for is read long before it lands."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("zero", torch.zeros(()))  # where it lives is where it runs

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if observation.is_cuda:
            torch.cuda._sleep(2_000_000)
        return (observation[..., 0] + self.zero).long() % N_ACTIONS


@pytest.mark.parametrize("policy_device", DEVICES)
async def test_the_env_steps_with_the_action_the_batch_records(policy_device: str) -> None:
    # The fault it catches: an env stepping with an action whose device-to-host copy had not landed (the
    # policy's GPU work takes a millisecond a step): the echoed action would differ from the recorded one.
    policy = TensorDictModule(SlowCounterPolicy().to(policy_device), in_keys=["observation"], out_keys=["action"])
    env = functools.partial(GymEnv, functools.partial(EchoGymEnv, N_ACTIONS), num_envs=4)
    async with Collector(env, policy, frames_per_batch=64, total_frames=64 * 20, env_device="cpu") as collector:
        with anyio.fail_after(120):
            batches = [batch.cpu() async for batch in collector]
    assert len(batches) == 20
    for batch in batches:
        action, obs, echoed = batch["action"], batch["observation"], batch["next", "observation"]
        assert torch.equal(action, obs[..., 0].long() % N_ACTIONS), "the batch records the policy's own action"
        # What the env received, echoed into its next observation: the very action the batch records.
        assert torch.equal(echoed[..., 1].long(), action)


def _slow_echo(batch: TensorDict) -> TensorDict:
    """A postproc whose output is written behind tens of milliseconds of GPU work on the stream it runs on: a consumer
    whose stream is not ordered after that stream reads ``echo`` before it is written."""
    if batch.device is not None and batch.device.type == "cuda":
        torch.cuda._sleep(50_000_000)
    batch.set("echo", batch["observation"] * 1)
    return batch


@pytest.mark.parametrize("postproc", [None, _slow_echo])
@pytest.mark.parametrize("kind", [Collector, MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize("device", DEVICES)
async def test_a_consumer_iterating_on_a_side_stream_reads_whole_batches(
    kind: type, postproc: object, device: str
) -> None:
    # The fault it catches: a batch stored on the GPU, read on the consumer's stream before the stream that wrote it
    # (the copy to the device, or the postproc) finished. Before each batch the legacy default stream is kept busy
    # for tens of milliseconds, so a copy queued there (not on the consumer's stream) lands long after the read; the
    # postproc writes behind GPU work of its own on its thread's stream, which only an event orders the read after.
    # The consumer iterates inside its stream, as docs/concepts.md says to: batches are ordered on the stream current
    # while __anext__ runs.
    env = functools.partial(CountingEnv, num_envs=4, episode_length=7)
    side = torch.cuda.Stream() if device == "cuda" else None
    options = {} if kind is Collector else {"num_workers": 2, "start_method": START_METHOD}
    async with kind(env, None, frames_per_batch=64, total_frames=64 * 20, storing_device=device, postproc=postproc,
                    **options) as collector:  # fmt: skip
        with anyio.fail_after(120):
            for _ in range(20):
                if side is not None:
                    torch.cuda._sleep(50_000_000)  # the legacy default stream, busy
                with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                    batch = await anext(collector)
                    host = batch.clone()  # read on the consumer's stream, then waited for below
                if side is not None:
                    side.synchronize()
                assert host["observation"].device.type == device
                host = host.cpu()
                assert_counting_batch(host)
                if postproc is not None:
                    assert torch.equal(host["echo"], host["observation"]), "read before the postproc wrote it"


class WideConstant(torch.nn.Module):
    """Acts its last weight on every observation; its weights are large, so that copying them takes a while."""

    def __init__(self, value: float = 0.0, size: int = 1 << 22) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((size,), float(value)))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation[..., 0] * 0 + self.w[-1]


@pytest.mark.parametrize("device", DEVICES)
async def test_a_pass_right_after_a_weight_push_answers_with_the_new_weights(device: str) -> None:
    # The fault it catches: a pass on a lane's stream reading weights whose copy (queued behind the
    # caller's busy stream) had not all landed.
    policy = TensorDictModule(WideConstant(0.0), in_keys=["observation"], out_keys=["action"])
    obs = TensorDict({"observation": torch.zeros(8, 1)}, batch_size=[8])
    async with InferenceServer(policy, device=device, mode="thread", max_wait=0.0) as server:
        with anyio.fail_after(120):
            for k in range(1, 21):
                weights = TensorDict.from_module(WideConstant(float(k)).to(device))
                if device == "cuda":
                    # The caller's stream busy for tens of milliseconds: a copy of the weights queued behind it lands
                    # long after a pass on a lane's stream (not ordered after it) would have read them.
                    torch.cuda._sleep(50_000_000)
                await server.update_policy_weights_(weights=weights)
                answer = (await server.infer(obs.clone()))["action"]
                assert answer.tolist() == [float(k)] * 8, f"push {k}: the pass read weights that had not all landed"


@contextlib.contextmanager
def _written_on_a_side_stream(module: torch.nn.Module, value: float) -> Iterator[None]:
    """As a trainer that steps its optimizer on a stream of its own: ``module``'s weight ``w`` set to ``value`` on a
    side stream, behind tens of milliseconds of GPU work, and the block run with that stream current (the weights
    pushed from it are written there). On the CPU, set at once."""
    weight = module.get_parameter("w")
    if not weight.is_cuda:
        with torch.no_grad():
            weight.fill_(value)
        yield
        return
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(50_000_000)
        with torch.no_grad():
            weight.fill_(value)  # queued on the side stream, behind the sleep
        yield


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("device", DEVICES)
async def test_weights_a_trainer_wrote_on_a_side_stream_are_read_once_written(mode: str, device: str) -> None:
    # The fault it catches: the server copying weights the trainer was still writing on a side
    # stream (its streams not ordered after the trainer's).
    # The server's copy of the weights (on its own streams) must wait for the trainer's write on its stream.
    policy = TensorDictModule(WideConstant(0.0), in_keys=["observation"], out_keys=["action"])
    obs = TensorDict({"observation": torch.zeros(8, 1)}, batch_size=[8])
    trainer = WideConstant(0.0).to(device)
    async with InferenceServer(policy, device=device, mode=mode, max_wait=0.0) as server:
        with anyio.fail_after(120):
            for k in range(1, 11):
                with _written_on_a_side_stream(trainer, float(k)):
                    await server.update_policy_weights_(trainer)
                answer = (await server.infer(obs.clone()))["action"]
                assert answer.tolist() == [float(k)] * 8, f"push {k}: read before the trainer's write"


class Constant(torch.nn.Module):
    """Acts action 0 or 1 per its last weight (a discrete action, as CountingEnv takes)."""

    def __init__(self, size: int = 1 << 20) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(size))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 0] * 0 + self.w[-1]).long() % 2


@pytest.mark.parametrize("device", DEVICES)
async def test_an_in_process_collector_reads_pushed_weights_once_written(device: str) -> None:
    # The fault it catches: the rollout thread reading weights the trainer was still writing on a
    # side stream.
    trainer = Constant().to(device)
    policy = TensorDictModule(Constant().to(device), in_keys=["observation"], out_keys=["action"])
    env = functools.partial(CountingEnv, num_envs=2)
    async with Collector(env, policy, frames_per_batch=4, total_frames=-1, env_device="cpu") as collector:
        with anyio.fail_after(120):
            for k in range(1, 11):
                with _written_on_a_side_stream(trainer, float(k)):
                    await collector.update_policy_weights_(trainer)
                batch = await anext(collector)
                while batch["collector", "policy_version"].min().item() < k:  # made before the push
                    batch = await anext(collector)
                assert batch["action"].unique().tolist() == [k % 2], f"push {k}: read before the trainer's write"


@pytest.mark.parametrize("kind", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize("device", DEVICES)
async def test_a_worker_collector_pushes_weights_once_the_trainer_wrote_them(kind: type, device: str) -> None:
    # The fault it catches: torn weights, the push copying a trainer's CUDA weights to the host (on a thread of its
    # own, whose streams nothing mode) before the trainer's write on its side stream landed: the workers would
    # then act with the previous value, k - 1.
    trainer = Constant().to(device)
    policy = TensorDictModule(Constant(), in_keys=["observation"], out_keys=["action"])  # the workers run it on CPU
    envs = [functools.partial(CountingEnv, num_envs=2)] * 2
    async with kind(envs, policy, frames_per_batch=8, total_frames=-1, start_method=START_METHOD) as collector:
        with anyio.fail_after(120):
            for k in range(1, 11):
                with _written_on_a_side_stream(trainer, float(k)):
                    version = await collector.update_policy_weights_(trainer)
                batch = await anext(collector)
                while batch["collector", "policy_version"].min().item() < version:  # made before the push
                    batch = await anext(collector)
                assert batch["action"].unique().tolist() == [k % 2], f"push {k}: read before the trainer's write"


@pytest.mark.parametrize(
    ("server_device", "input_device"),
    [
        ("cpu", "cpu"),
        pytest.param("cpu", "cuda", marks=pytest.mark.gpu),
        pytest.param("cuda", "cuda", marks=pytest.mark.gpu),
    ],
)
@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_infer_takes_observations_on_any_device_and_answers_on_theirs(
    server_device: str, input_device: str, mode: str
) -> None:
    # The fault it catches: infer() reading GPU observations made on the caller's side stream
    # before they were written, or answering on another device than theirs.
    from acollect.testing import Doubler

    policy = TensorDictModule(Doubler(), in_keys=["observation"], out_keys=["action"])
    async with InferenceServer(policy, device=server_device, mode=mode, max_wait=0.0) as server:
        with anyio.fail_after(120):
            for i in range(5):
                if input_device == "cuda":
                    # Made on a side stream behind a long sleep: the server must wait for that stream, not its own.
                    side = torch.cuda.Stream()
                    with torch.cuda.stream(side):
                        torch.cuda._sleep(50_000_000)
                        observation = torch.full((3, 2), float(i), device=input_device)
                        obs = TensorDict({"observation": observation}, batch_size=[3])
                        action = (await server.infer(obs))["action"]
                    side.synchronize()
                else:
                    obs = TensorDict({"observation": torch.full((3, 2), float(i))}, batch_size=[3])
                    action = (await server.infer(obs))["action"]
                assert action.device.type == input_device
                assert torch.equal(action.cpu(), torch.full((3, 2), 2.0 * i))
            assert server.running, "the server lives on after every call"


def _worker_of(batch: TensorDict, envs_per_worker: int) -> torch.Tensor:
    """Which worker made each frame of a counting batch whose worker ``w`` counts from ``w * envs * ENV_STRIDE``."""
    return (batch["observation"][..., 0] // (envs_per_worker * ENV_STRIDE)).long()


@pytest.mark.parametrize("kind", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize("device", DEVICES)
async def test_small_batches_stored_on_a_device_keep_their_values_and_pin_nothing(kind: type, device: str) -> None:
    # The fault it catches: heap memory (message frames, gathered parts)
    # freed or reused before its copy to the device read it, or registered with CUDA.
    # Heap memory only (frames through ZeroMQ, gathered into fresh memory): nothing may be registered with CUDA.
    envs = [functools.partial(CountingEnv, num_envs=4, episode_length=7, start=w * 4 * ENV_STRIDE,
                              dtype=torch.float64) for w in range(2)]  # fmt: skip
    n = 300 if device == "cuda" else 40
    async with kind(envs, None, frames_per_batch=64, total_frames=64 * n, storing_device=device,
                    use_shared_memory=False, start_method=START_METHOD) as collector:  # fmt: skip
        with anyio.fail_after(300):
            async for batch in collector:
                assert batch["observation"].device.type == device
                host = batch.cpu()
                assert_counting_batch(host)
                made_by = _worker_of(host, 4)
                if kind is MultiAsyncCollector:  # tagged per batch: the tag names the worker whose frames these are
                    assert torch.equal(host["collector", "worker_id"], made_by)
                else:  # stacked: row w is worker w's
                    assert torch.equal(made_by, torch.arange(2).view(2, 1, 1).expand_as(made_by))
                assert collector.pinned_bytes == 0


@pytest.mark.parametrize(
    ("device", "cuda_dma"), [("cpu", False), pytest.param("cuda", False, marks=pytest.mark.gpu),
                             pytest.param("cuda", True, marks=pytest.mark.gpu)],
)  # fmt: skip
async def test_pixel_batches_keep_their_values_on_the_storing_device(device: str, cuda_dma: bool) -> None:
    # The faults it catches: a frame of another step or another worker in a batch moved to the GPU (memory given back
    # to its worker before the copy read it); with cuda_dma, registered memory that grows with every batch or
    # outlives the pool's segments.
    envs = [functools.partial(PixelEnv, num_envs=8, shape=(16, 16, 4))] * 2
    n = 300 if device == "cuda" else 40
    pinned: list[int] = []
    async with MultiAsyncCollector(envs, None, frames_per_batch=128, total_frames=128 * n, storing_device=device,
                                   cuda_dma=cuda_dma, start_method=START_METHOD) as collector:  # fmt: skip
        with anyio.fail_after(300):
            async for batch in collector:
                assert batch["pixels"].device.type == device
                host = batch.cpu()
                pixels, after = host["pixels"].long(), host["next", "pixels"].long()
                # Every frame one value, one step on from its observation (the step count modulo 251).
                assert torch.equal(after, (pixels + 1) % 251)
                assert torch.equal(pixels[:, 1:], after[:, :-1])
                assert host["collector", "worker_id"].unique().numel() == 1
                pinned.append(collector.pinned_bytes)
                gc.collect()
    if not cuda_dma:
        assert set(pinned) == {0}, "nothing is registered with CUDA unless cuda_dma=True"
    else:
        assert pinned[-1] > 0, "the workers' slots are page-locked: the copy engine reads them directly"
        assert max(pinned) == pinned[-1] == pinned[len(pinned) // 2], "registered memory grows no more once warm"
    assert collector.pinned_bytes == 0, "unregistered before the pool unmapped its segments"


@pytest.mark.gpu
def test_the_copier_registers_only_segments_the_pool_owns_and_only_while_they_are_mapped() -> None:
    # The fault it catches: (cuda_dma) heap memory registered, or a
    # segment left registered after it was unmapped.
    from acollect._batches.cuda_dma import DeviceCopier
    from acollect._batches.shm import ShmSegment

    copier = DeviceCopier(torch.device("cuda"))
    try:
        for i in range(200):  # heap temporaries, freed as soon as the copy returns
            heap = TensorDict({"x": torch.full((64, 16), float(i))}, batch_size=[64])
            copy = copier.copy(heap)
            del heap
            out = copier.hand_over(copy)
            assert out["x"].sum().item() == 64 * 16 * i
            copier.copied(copy)
        assert copier.registered_bytes == 0, "heap memory is never registered"
        for i in range(20):  # segments come and go: each one registered while mapped, unregistered before unmapped
            segment = ShmSegment.create(1 << 20)
            view = TensorDict({"x": segment.tensor().view(torch.float32)}, batch_size=[])
            view["x"].fill_(float(i))
            copy = copier.copy(view)
            assert copier.registered_bytes == 1 << 20
            assert copier.hand_over(copy)["x"].sum().item() == (1 << 18) * i
            copier.copied(copy)
            del view
            segment.close()
            segment.unlink()
            assert copier.registered_bytes == 0
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1)  # no CUDA error was left pending by any registration
    finally:
        copier.close()


@pytest.mark.gpu
def test_a_copy_in_flight_holds_its_source_until_copied() -> None:
    # The fault it catches: (cuda_dma) the source memory given back (and written) before the DMA
    # copy queued behind GPU work read it.
    from acollect._batches.cuda_dma import DeviceCopier
    from acollect._batches.shm import ShmSegment

    copier = DeviceCopier(torch.device("cuda"))
    segment = ShmSegment.create(1 << 20)
    try:
        for i in range(10):
            view = TensorDict({"x": segment.tensor().view(torch.float32)}, batch_size=[])
            view["x"].fill_(float(i))
            with torch.cuda.stream(copier.stream):
                torch.cuda._sleep(50_000_000)  # the copy queues behind tens of milliseconds of GPU work
            copy = copier.copy(view)
            total = copier.hand_over(copy)["x"].sum()
            copier.copied(copy)  # the source may be written again only once this returns
            view["x"].fill_(-1.0)  # the worker writes its next batch
            assert total.item() == (1 << 18) * i, "the copy read memory written after it was handed over"
    finally:
        copier.close()
        segment.close()
        segment.unlink()


@pytest.mark.gpu
def test_a_refused_registration_is_a_clear_error_naming_the_default() -> None:
    # The fault it catches: a refusal carried on from silently, its CUDA error left for the next launch to report.
    from acollect._batches.cuda_dma import DeviceCopier
    from acollect._batches.shm import ShmSegment
    from acollect.errors import ConfigurationError

    copier = DeviceCopier(torch.device("cuda"))
    segment = ShmSegment.create(1 << 20)
    cudart = torch.cuda.cudart()
    address = segment.tensor().data_ptr()
    assert int(getattr(r := cudart.cudaHostRegister(address, segment.size, 0), "value", r)) == 0
    try:
        view = TensorDict({"x": segment.tensor().view(torch.float32)}, batch_size=[])
        with pytest.raises(ConfigurationError, match="cuda_dma=False"):
            copier.copy(view)  # its own registration is refused: the memory is registered already
        assert copier.registered_bytes == 0
    finally:
        copier.close()
        cudart.cudaHostUnregister(address)
        segment.close()
        segment.unlink()


def test_the_segment_map_is_safe_to_read_while_other_threads_map_and_close() -> None:
    # The fault it catches: the map from addresses to segments torn by threads
    # mapping and closing segments while the copier looks one up.
    import threading

    from acollect._batches.shm import ShmSegment

    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                with ShmSegment.create(4096) as segment:
                    segment.tensor()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        with ShmSegment.create(4096) as mine:
            address = mine.tensor().data_ptr()
            for _ in range(20_000):
                assert ShmSegment.containing(address) is mine
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not errors


def test_a_wait_for_another_threads_gpu_work_has_a_deadline() -> None:
    # The fault it catches: a thread waiting for ever on GPU work that never ends.
    from acollect._devices import wait_ready

    class Never:
        """An event whose work never ends (a hung kernel)."""

        def query(self) -> bool:
            return False

    class Done:
        def query(self) -> bool:
            return True

    wait_ready([(torch.device("cuda", 0), Done())], timeout=0.05)  # done: returns at once
    with pytest.raises(TimeoutError, match=r"cuda:0's stream .* did not finish within 0.05 s"):
        wait_ready([(torch.device("cuda", 0), Never())], timeout=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_central_inference_defaults_are_the_same_however_the_device_is_given(device: str) -> None:
    # The fault it catches: the GPU defaults (an env group and a pass in flight per group) applied only where
    # device= is passed, not where the policy's parameters are on the GPU, or a bare "cuda" read later on the pass
    # threads (whose current device may be another GPU).
    from acollect import AsyncBatchedCollector

    env = functools.partial(CountingEnv, num_envs=8)
    given = AsyncBatchedCollector([env], WideConstant(size=8), frames_per_batch=8, device=device)
    inferred = AsyncBatchedCollector([env], WideConstant(size=8).to(device), frames_per_batch=8)
    assert (inferred.env_groups, inferred.passes_in_flight) == (given.env_groups, given.passes_in_flight)
    if device == "cuda":
        from acollect.collectors._batched import GPU_ENV_GROUPS

        assert given.env_groups == given.passes_in_flight == GPU_ENV_GROUPS
    else:
        assert given.passes_in_flight == 1


def test_workers_that_would_each_make_a_cuda_context_are_told_of_the_cost() -> None:
    # The fault it catches: N workers each building a CUDA context (GPU memory apiece) without a word.
    from acollect._rollout.spec import RolloutSpec
    from acollect._workers.protocol import WorkerConfig
    from acollect.collectors._worker_configs import cuda_contexts_warning

    def configs(n: int, **devices: str) -> list[WorkerConfig]:
        spec = RolloutSpec(create_env_fn="CartPole-v1", frames_per_batch=8, devices=dict(devices))
        return [WorkerConfig(i, 0, n, "", 0, spec) for i in range(n)]

    message = cuda_contexts_warning(configs(3, policy_device="cuda:0"), None)
    assert message is not None
    assert message.startswith("3 workers would each run on CUDA (cuda:0)")
    assert "GPU memory" in message
    assert "AsyncBatchedCollector" in message
    assert cuda_contexts_warning(configs(3, env_device="cuda"), None) is not None, "an env on the GPU makes one too"
    assert cuda_contexts_warning(configs(3, device="cpu"), None) is None
    assert cuda_contexts_warning(configs(1, device="cuda"), None) is None, "one context is what any GPU user has"
    # A worker's policy runs where its parameters are unless a device says otherwise.
    assert cuda_contexts_warning(configs(2), torch.nn.Linear(1, 1)) is None
    assert cuda_contexts_warning(configs(2, policy_device="cpu"), torch.nn.Linear(1, 1, device="meta")) is None


@pytest.mark.gpu
async def test_a_worker_collector_whose_workers_each_run_a_cuda_policy_warns_at_construction() -> None:
    # The fault it catches: the warning missing where it matters, a real
    # collector whose workers would each make a CUDA context.
    policy = TensorDictModule(Constant(size=8).to("cuda"), in_keys=["observation"], out_keys=["action"])
    with pytest.warns(UserWarning, match="2 workers would each run on CUDA"):
        collector = MultiSyncCollector([functools.partial(CountingEnv, num_envs=2)] * 2, policy, frames_per_batch=8)
    await collector.async_shutdown()
