"""What a batch holds and what a collector counts: :class:`~acollect._batches.plan.BatchPlan` and
:class:`~acollect._batches.counts.Counts`, value by value.

Each test kills mutants that ``tools/mutation.py batch_plan`` found alive: a plan settled from half the workers, a
rounding that sums where it should take the largest, a warning that names the wrong sizes, a count restored or
reported off by one.
"""

from __future__ import annotations

import logging
import re
import warnings

import pytest

from acollect._batches.counts import Counts
from acollect._batches.plan import BatchPlan
from acollect.stats import EpisodeSummary


def settle_quietly(plan: BatchPlan, n_envs: list[int | None]) -> tuple[bool, list[str]]:
    """``plan.settle(n_envs)`` and the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        changed = plan.settle(n_envs)
    return changed, [str(w.message) for w in caught]


@pytest.mark.parametrize(
    ("requested", "n_workers", "stacked", "per_worker", "steps_of_3_envs"),
    [(100, 1, False, 100, 34), (100, 3, True, 34, 12), (100, 3, False, 100, 34), (99, 3, True, 33, 11)],
)
def test_each_workers_share_and_the_steps_of_its_envs(
    requested: int, n_workers: int, stacked: bool, per_worker: int, steps_of_3_envs: int
) -> None:
    plan = BatchPlan(requested, n_workers=n_workers, stacked=stacked)
    assert (plan.requested, plan.n_workers, plan.stacked) == (requested, n_workers, stacked)
    assert plan.per_worker == per_worker
    assert plan.time_steps(3) == steps_of_3_envs
    assert (plan.frames_per_batch, plan.settled) == (requested, False)


@pytest.mark.parametrize("n_envs", [[4, None], [None, 4], [4], [4, 4, 4]], ids=["second", "first", "fewer", "more"])
def test_nothing_settles_until_every_worker_is_known(n_envs: list[int | None]) -> None:
    plan = BatchPlan(10, n_workers=2, stacked=True)
    assert settle_quietly(plan, n_envs) == (False, [])
    assert (plan.settled, plan.frames_per_batch) == (False, 10)


def test_a_settled_plan_changes_no_more() -> None:
    plan = BatchPlan(12, n_workers=2, stacked=True)
    assert settle_quietly(plan, [3, 3]) == (False, [])  # 6 frames each: 2 steps of 3 envs
    assert (plan.settled, plan.frames_per_batch) == (True, 12)
    assert settle_quietly(plan, [5, 5]) == (False, [])
    assert plan.frames_per_batch == 12


def test_stacked_batches_hold_every_workers_rounded_share() -> None:
    plan = BatchPlan(10, n_workers=2, stacked=True)  # 5 frames each: 2 envs step 3 times, 3 envs twice
    changed, said = settle_quietly(plan, [2, 3])
    assert (changed, plan.frames_per_batch) == (True, 12)
    assert said == [
        "frames_per_batch=10 is not a multiple of the number of envs (per worker: [2, 3]): each batch holds 12 "
        "frames, rounded up so that every env steps equally often; collector.frames_per_batch is now 12."
    ]


def test_batches_of_one_worker_hold_the_largest_workers() -> None:
    plan = BatchPlan(10, n_workers=2)  # 10 frames each: 4 envs step 3 times, 3 envs 4 times: 12 frames both
    changed, said = settle_quietly(plan, [4, 3])
    assert (changed, plan.frames_per_batch) == (True, 12)
    assert said == [
        "frames_per_batch=10 is not a multiple of the number of envs (per worker: [4, 3]): each batch holds 12 "
        "frames, rounded up so that every env steps equally often; collector.frames_per_batch is now 12."
    ]
    plan = BatchPlan(10, n_workers=2)  # 2 envs: 10 frames; 4 envs: 12
    changed, said = settle_quietly(plan, [2, 4])
    assert (changed, plan.frames_per_batch) == (True, 12)
    assert said == [
        "frames_per_batch=10 is not a multiple of the number of envs (per worker: [2, 4]): a batch holds one "
        "worker's [10, 12] frames (collector.frames_per_batch says the largest), rounded up so that every env "
        "steps equally often; collector.frames_per_batch is now 12."
    ]


@pytest.mark.parametrize(
    ("n_workers", "stacked", "n_envs", "envs", "holds"),
    [
        (1, False, [3], "3", 12),
        (2, True, [3, 3], "2 workers x 3 envs", 12),
        (2, False, [3, 3], "3 per worker", 12),
    ],
)
def test_the_warning_names_the_envs_as_they_are(
    n_workers: int, stacked: bool, n_envs: list[int], envs: str, holds: int
) -> None:
    plan = BatchPlan(10 if not stacked else 20, n_workers=n_workers, stacked=stacked)
    changed, said = settle_quietly(plan, list(n_envs))
    expected = holds * (2 if stacked else 1)
    assert (changed, plan.frames_per_batch) == (True, expected)
    assert said == [
        f"frames_per_batch={plan.requested} is not a multiple of the number of envs ({envs}): each batch holds "
        f"{expected} frames, rounded up so that every env steps equally often; collector.frames_per_batch is now "
        f"{expected}."
    ]


def test_the_tally_counts_frames_and_batches_and_restores_them() -> None:
    counts = Counts(total_frames=100, progress=False, name="mine")
    assert (counts.total_frames, counts.frames, counts.batches, counts.shows_progress) == (100, 0, 0, False)
    counts.stats.start()
    counts.count_frames(8)
    counts.count_frames(5)
    counts.count_batch()
    counts.count_batch()
    counts.count_batch()
    assert (counts.frames, counts.batches) == (13, 3)
    stats = counts.snapshot(policy_version=4, counters={"restarts": 2, "dropped_batches": 1})
    assert (stats.frames, stats.batches, stats.policy_version) == (13, 3, 4)
    assert (stats.restarts, stats.dropped_batches) == (2, 1)
    counts.restore(frames=64, batches=7)
    assert (counts.frames, counts.batches) == (64, 7)
    counts.count_frames(1)
    assert counts.snapshot(policy_version=0, counters={}).frames == 65


def test_the_tally_reports_each_workers_episodes_and_version() -> None:
    counts = Counts(total_frames=-1, progress=False)
    counts.stats.start()
    counts.stats.record_worker(0, 10, 3, EpisodeSummary(2, [1.0, 3.0], [4, 6]))
    counts.stats.record_worker(1, 10, 2, EpisodeSummary(1, [5.0], [8]), time_spent=None)
    counts.stats.record_worker(1, 10, 5)
    stats = counts.snapshot(policy_version=5, counters={})
    assert stats.episodes == 3
    assert (stats.episode_return_mean, stats.episode_return_last) == (3.0, 5.0)
    assert (stats.episode_length_mean, stats.episode_length_last) == (6.0, 8)
    assert stats.policy_lag == {0: 2, 1: 0}
    assert set(stats.worker_frames_per_s) == {0, 1}


def test_a_pause_shows_in_the_stats_until_it_is_lifted() -> None:
    counts = Counts(total_frames=-1, progress=False)
    counts.stats.start()
    counts.set_paused(True)
    assert counts.snapshot(policy_version=0, counters={}).paused
    counts.set_paused(False)
    assert not counts.snapshot(policy_version=0, counters={}).paused


def test_the_log_progress_line_names_the_collector_and_ends_with_the_last_figures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="acollect.progress")
    counts = Counts(total_frames=32, progress="log", name="my collector")
    assert counts.shows_progress
    counts.stats.start()
    counts.count_frames(16)
    counts.count_batch()
    counts.show(counts.snapshot(policy_version=0, counters={}))
    counts.count_frames(16)
    counts.count_batch()
    counts.close_progress(counts.snapshot(policy_version=0, counters={}))
    counts.close_progress(counts.snapshot(policy_version=0, counters={}))  # once only
    lines = [r.getMessage() for r in caplog.records if r.name == "acollect.progress"]
    assert len(lines) == 2
    assert re.match(r"^my collector: 16/32 frames", lines[0]), lines
    assert re.match(r"^my collector: 32/32 frames", lines[1]), lines


def test_no_progress_shows_nothing_and_closes_quietly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="acollect.progress")
    counts = Counts(total_frames=32, progress=None)
    counts.count_frames(16)
    counts.show(counts.snapshot(policy_version=0, counters={}))
    counts.close_progress(counts.snapshot(policy_version=0, counters={}))
    assert [r for r in caplog.records if r.name == "acollect.progress"] == []


def test_the_tally_splits_each_workers_time_and_forgets_a_lost_worker() -> None:
    counts = Counts(total_frames=-1, progress=False)
    counts.stats.start()
    counts.stats.record_worker(0, 10, 1, time_spent=[3.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    counts.stats.record_worker(1, 10, 1, time_spent=[0.0, 4.0, 0.0, 0.0, 0.0, 0.0])
    split = counts.snapshot(policy_version=1, counters={}).worker_time_split
    assert set(split) == {0, 1}
    assert (split[0]["env"], split[0]["policy"], split[1]["policy"]) == (0.75, 0.25, 1.0)
    counts.stats.time.forget(0)
    assert set(counts.snapshot(policy_version=1, counters={}).worker_time_split) == {1}


def test_by_default_a_plan_is_one_workers_and_a_tally_is_called_collector(caplog: pytest.LogCaptureFixture) -> None:
    plan = BatchPlan(10)
    assert (plan.n_workers, plan.stacked) == (1, False)
    assert settle_quietly(plan, [5]) == (False, [])
    assert plan.settled
    caplog.set_level(logging.INFO, logger="acollect.progress")
    counts = Counts(total_frames=8, progress="log")
    counts.count_frames(8)
    counts.count_batch()
    counts.show(counts.snapshot(policy_version=0, counters={}))
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.name == "acollect.progress"] == ["collector"]
