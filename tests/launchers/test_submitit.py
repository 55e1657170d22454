"""Workers as submitit jobs with submitit's local executor (real job processes), and the delayed launcher."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from acollect import (
    ConfigurationError,
    MultiAsyncCollector,
    MultiSyncCollector,
    WorkerCrashedError,
    submitit_delayed_launcher,
)
from acollect.launchers import SubmititLauncher
from acollect.testing import CountingEnv, WeightProbe

pytest.importorskip("submitit")

pytestmark = pytest.mark.timeout(300)


async def _drain(collector: MultiAsyncCollector | MultiSyncCollector) -> None:
    """Iterates until the collector raises, for up to a minute (a count of batches would be a race: tiny batches
    from the live workers can outrun the news of a job's end)."""
    with anyio.fail_after(60):
        while True:
            await anext(collector)


async def test_jobs_collect_take_weights_and_leave_nothing_behind() -> None:
    launcher = SubmititLauncher(cluster="local", executor_options={"timeout_min": 10})
    async with MultiSyncCollector(
        [CountingEnv] * 2, WeightProbe(0.0), frames_per_batch=8, total_frames=24, launcher=launcher
    ) as collector:
        batch = await anext(collector)
        assert batch.shape == (2, 1, 4)
        assert batch["action"].eq(0).all()
        await collector.update_policy_weights_(WeightProbe(1.0))
        batch = await anext(collector)
        assert batch["action"].eq(1).all()
        pool = collector.pool
        assert pool is not None
        assert all(h.where.startswith("submitit job ") for h in pool.handles)
        folder = launcher.job_folder
        assert folder is not None
        assert folder.is_dir()
        jobs = [h.process for h in pool.handles]
    assert all(job is not None and job.exitcode == 0 for job in jobs), "each job ended on the collector's stop"
    assert not folder.exists(), "the temporary job folder is removed at shutdown"
    assert launcher.job_folder is None


def test_a_given_folder_is_the_job_folder_and_outlives_the_launcher(tmp_path: Path) -> None:
    launcher = SubmititLauncher(tmp_path, cluster="local")
    assert launcher.job_folder == tmp_path
    launcher.prepare()
    launcher.close()
    assert launcher.job_folder == tmp_path
    assert tmp_path.is_dir(), "a folder the caller gave is the caller's: only a temporary one is removed"


async def test_cancelled_job_is_reported() -> None:
    launcher = SubmititLauncher(cluster="local")
    async with MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, launcher=launcher) as collector:
        await anext(collector)
        pool = collector.pool
        assert pool is not None
        pool.handles[0].process.job.cancel(check=False)  # type: ignore[union-attr]
        with pytest.raises(WorkerCrashedError, match=r"worker 0 \(submitit job \d+ \(ended: job state"):
            await _drain(collector)


@submitit_delayed_launcher(num_jobs=2, cluster="local", submitit_main_conf={"timeout_min": 10})
async def _trainer(frames: int, *, launcher: SubmititLauncher) -> list[int]:
    async with MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, total_frames=frames, launcher=launcher) as c:
        return [batch.numel() async for batch in c]


def test_delayed_launcher_runs_the_trainer_as_a_job_and_its_workers_as_jobs() -> None:
    assert _trainer(16) == [8, 8]


def test_delayed_launcher_caps_worker_jobs() -> None:
    @submitit_delayed_launcher(num_jobs=1, cluster="local")
    async def too_many(*, launcher: SubmititLauncher) -> None:
        async with MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, launcher=launcher):
            pass

    with pytest.raises(Exception, match="max_jobs"):
        too_many()


async def test_an_unpicklable_env_factory_is_named_before_any_job_starts() -> None:
    import threading

    lock = threading.Lock()
    launcher = SubmititLauncher(cluster="local")
    collector = MultiSyncCollector([lambda: (lock, CountingEnv())[1]], frames_per_batch=4, launcher=launcher)
    with pytest.raises(ConfigurationError, match=r"cannot send the env factory or policy to worker 0.*cloudpickle"):
        await collector.__aenter__()
    assert launcher.job_folder is None, "the launcher released its job folder"


async def test_central_inference_serves_workers_running_as_jobs_over_tcp() -> None:
    # Jobs are not on the collector's host as far as it knows: the inference server binds tcp, not ipc.
    from acollect import AsyncBatchedCollector
    from acollect.testing import assert_counting_batch

    launcher = SubmititLauncher(cluster="local", executor_options={"timeout_min": 10})
    async with AsyncBatchedCollector(
        [CountingEnv] * 2, WeightProbe(0.0), frames_per_batch=8, total_frames=48, launcher=launcher
    ) as collector:
        assert str(collector.server.address).startswith("tcp://")
        version = await collector.update_policy_weights_(WeightProbe(1.0))
        async for batch in collector:
            assert_counting_batch(batch)
            assert (batch["action"] == batch["collector", "policy_version"].clamp(max=1)).all()
        assert collector.policy_version == version == 1
        assert batch["action"].eq(1).all()
