"""Workers as submitit jobs with submitit's local executor (real job processes), and the delayed launcher."""

from __future__ import annotations

import os

import pytest

from acollect import MultiSyncCollector, WorkerCrashedError, submitit_delayed_launcher
from acollect.launchers import SubmititLauncher
from acollect.testing import CountingEnv

from launcher_helpers import WeightProbe

pytest.importorskip("submitit")

pytestmark = pytest.mark.timeout(300)


async def test_jobs_collect_take_weights_and_leave_nothing_behind() -> None:
    launcher = SubmititLauncher(cluster="local", executor_options={"timeout_min": 10})
    async with MultiSyncCollector(
        [CountingEnv] * 2, WeightProbe(0.0), frames_per_batch=8, total_frames=24, launcher=launcher
    ) as collector:
        batch = await anext(collector)
        assert batch.shape == (2, 1, 4) and batch["action"].eq(0).all()
        await collector.update_policy_weights_(WeightProbe(1.0))
        batch = await anext(collector)
        assert batch["action"].eq(1).all()
        pool = collector._pool
        assert pool is not None
        assert all(h.where.startswith("submitit job ") for h in pool.handles)
        folder = launcher._tmp_folder
        assert folder is not None and os.path.isdir(folder)
        jobs = [h.process for h in pool.handles]
    assert all(job is not None and job.exitcode == 0 for job in jobs), "each job ended on the collector's stop"
    assert not os.path.exists(folder), "the temporary job folder is removed at shutdown"


async def test_cancelled_job_is_reported() -> None:
    launcher = SubmititLauncher(cluster="local")
    async with MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, launcher=launcher) as collector:
        await anext(collector)
        pool = collector._pool
        assert pool is not None
        pool.handles[0].process.job.cancel(check=False)  # type: ignore[union-attr]
        with pytest.raises(WorkerCrashedError, match=r"worker 0 \(submitit job \d+ \(ended: job state"):
            for _ in range(1000):
                await anext(collector)


@submitit_delayed_launcher(num_jobs=2, cluster="local", submitit_main_conf={"timeout_min": 10})
async def _trainer(frames: int, *, launcher: SubmititLauncher) -> list[int]:
    seen = []
    async with MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, total_frames=frames, launcher=launcher) as c:
        async for batch in c:
            seen.append(batch.numel())
    return seen


def test_delayed_launcher_runs_the_trainer_as_a_job_and_its_workers_as_jobs() -> None:
    assert _trainer(16) == [8, 8]


def test_delayed_launcher_caps_worker_jobs() -> None:
    @submitit_delayed_launcher(num_jobs=1, cluster="local")
    async def too_many(*, launcher: SubmititLauncher) -> None:
        async with MultiSyncCollector([CountingEnv] * 2, frames_per_batch=8, launcher=launcher):
            pass

    with pytest.raises(Exception, match="max_jobs"):
        too_many()
