"""Collector statistics and progress: episode accounting, frame rates, stats(), progress=, no stray output."""

from __future__ import annotations

import ast
import dataclasses
import functools
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from acollect import Collector, ConfigurationError, MultiSyncCollector, ReplayBuffer
from acollect._progress import check_progress
from acollect.stats import CollectorStats, EpisodeSummary, EpisodeTracker, RateWindow, StatsRecorder
from acollect.testing import CountingEnv, wait_until

ROOT = Path(__file__).resolve().parent.parent


def _batch(reward: torch.Tensor, done: torch.Tensor, traj: torch.Tensor | None = None) -> TensorDict:
    td = TensorDict(
        {("next", "reward"): reward.unsqueeze(-1).float(), ("next", "done"): done.unsqueeze(-1)},
        batch_size=reward.shape,
    )
    if traj is not None:
        td.set(("collector", "traj_ids"), traj)
    return td


def _reference(reward: torch.Tensor, done: torch.Tensor) -> list[tuple[float, int]]:
    """Episodes of an [N, T] stream, by a plain loop over time then envs."""
    n, steps = reward.shape
    ret, length, out = [0.0] * n, [0] * n, []
    for t in range(steps):
        for e in range(n):
            ret[e] += float(reward[e, t])
            length[e] += 1
            if done[e, t]:
                out.append((ret[e], length[e]))
                ret[e], length[e] = 0.0, 0
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 4),
    steps=st.integers(1, 24),
    data=st.data(),
)
def test_tracker_matches_a_plain_loop_however_the_stream_is_cut(n: int, steps: int, data: st.DataObject) -> None:
    rewards = data.draw(st.lists(st.integers(-3, 3), min_size=n * steps, max_size=n * steps))
    dones = data.draw(st.lists(st.booleans(), min_size=n * steps, max_size=n * steps))
    reward = torch.tensor(rewards, dtype=torch.float32).reshape(n, steps)
    done = torch.tensor(dones).reshape(n, steps)
    cuts = sorted({*data.draw(st.lists(st.integers(1, steps), max_size=4)), steps})
    tracker, got, start = EpisodeTracker(), [], 0
    for end in cuts:
        summary = tracker.update(_batch(reward[:, start:end], done[:, start:end]))
        assert summary.count == len(summary.returns) == len(summary.lengths)
        got += list(zip(summary.returns, summary.lengths, strict=True))
        start = end
    assert got == _reference(reward, done)


def test_tracker_drops_a_running_episode_when_the_env_was_reset_between_batches() -> None:
    tracker = EpisodeTracker()
    ones, no = torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool)
    tracker.update(_batch(ones, no, traj=torch.tensor([[0, 0, 0], [1, 1, 1]])))
    # Env 0 continues trajectory 0; env 1 was reset (new id 2): its 3 earlier steps belong to no episode.
    done = torch.tensor([[False, True, False], [False, True, False]])
    summary = tracker.update(_batch(ones, done, traj=torch.tensor([[0, 0, 3], [2, 2, 4]])))
    assert summary.returns == [5.0, 2.0]
    assert summary.lengths == [5, 2]


def test_tracker_reports_nothing_for_batches_without_rewards_or_dones() -> None:
    tracker = EpisodeTracker()
    assert tracker.update(TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2, 3])) == EpisodeSummary()
    assert tracker.update(TensorDict({}, batch_size=[])) == EpisodeSummary()


def test_tracker_takes_stacked_worker_batches_and_multi_dim_rewards() -> None:
    # [workers=2, envs=1, T=2] with a reward per agent [.., 2]: agents' rewards are summed.
    reward = torch.ones(2, 1, 2, 2)
    done = torch.tensor([[[False, True]], [[True, False]]]).unsqueeze(-1)
    td = TensorDict({("next", "reward"): reward, ("next", "done"): done}, batch_size=[2, 1, 2])
    summary = EpisodeTracker().update(td)
    assert (summary.count, summary.returns, summary.lengths) == (2, [2.0, 4.0], [1, 2])


def test_episode_summary_header_round_trip_is_capped() -> None:
    many = EpisodeSummary(150, [float(i) for i in range(150)], list(range(150)))
    fields = many.to_header()
    assert len(fields["r"]) == len(fields["l"]) == 100
    back = EpisodeSummary.from_header(fields)
    assert back.count == 150
    assert back.returns[-1] == 149.0
    assert back.lengths[0] == 50
    assert EpisodeSummary.from_header(None) == EpisodeSummary()


def test_rate_window_forgets_old_samples() -> None:
    w = RateWindow(window_s=2.0)
    assert w.rate() == 0.0
    w.add(0, now=0.0)
    w.add(1000, now=1.0)  # 1000 frames/s
    for t in range(2, 8):
        w.add(10, now=float(t))  # then 10 frames/s
    assert w.rate() == pytest.approx(10.0)
    assert w.total == 1060


def test_recorder_snapshot_lag_per_worker_rates_and_episode_window() -> None:
    rec = StatsRecorder(episode_window=3)
    rec.start(now=0.0)
    rec.record_worker(0, 100, policy_version=2, episodes=EpisodeSummary(2, [1.0, 2.0], [10, 20]), now=1.0)
    rec.record_worker(1, 300, policy_version=3, episodes=EpisodeSummary(2, [3.0, 4.0], [30, 40]), now=1.0)
    rec.record_batch(400, now=1.0)
    counters = {"restarts": 1, "dropped_batches": 2}
    snap = rec.snapshot(frames=400, batches=1, policy_version=3, counters=counters, now=2.0)
    assert snap.elapsed_s == 2.0
    assert snap.frames_per_s == 400.0
    assert snap.worker_frames_per_s == {0: 100.0, 1: 300.0}
    assert snap.policy_lag == {0: 1, 1: 0}
    assert snap.episodes == 4
    assert snap.episode_return_mean == pytest.approx(3.0)  # the last 3 episodes: 2, 3, 4
    assert (snap.episode_return_last, snap.episode_length_last) == (4.0, 40)
    assert snap.as_dict()["restarts"] == 1
    assert "1 restarts, 2 dropped batches" in str(snap)
    assert "policy lag 1" in str(snap)


# -- the in-process collector ----------------------------------------------------------------
async def test_collector_stats_count_whole_episodes_across_batches() -> None:
    # Env 0 ends every 3 steps, env 1 every 5; batches of T=4 cut through both.
    env = lambda: CountingEnv(num_envs=2, episode_length=[3, 5])  # noqa: E731
    async with Collector(env, frames_per_batch=8, total_frames=48) as collector:
        assert collector.stats().frames == 0
        assert collector.stats().episode_return_mean is None
        async for _ in collector:
            pass
        stats = collector.stats()
    assert stats.frames == 48
    assert stats.batches == 6
    assert stats.episodes == 24 // 3 + 24 // 5
    assert sorted(set(stats.worker_frames_per_s)) == [0]
    assert stats.frames_per_s > 0
    assert stats.elapsed_s > 0
    assert stats.episode_return_last in (3.0, 5.0)
    assert stats.episode_return_mean == pytest.approx((8 * 3 + 4 * 5) / 12)
    assert stats.episode_length_mean == stats.episode_return_mean  # reward 1 per step
    assert (stats.restarts, stats.dropped_batches) == (0, 0)


class _Greedy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).argmax(-1)


async def test_collector_stats_policy_lag_until_the_next_batch() -> None:
    async with Collector(lambda: CountingEnv(num_envs=2), _Greedy(), frames_per_batch=4) as collector:
        await anext(collector)
        assert collector.stats().policy_lag == {0: 0}
        await collector.update_policy_weights_(_Greedy())
        assert collector.stats().policy_lag == {0: 1}
        await anext(collector)
        stats = collector.stats()
    assert stats.policy_lag == {0: 0}
    assert stats.policy_version == 1


async def test_collector_stats_in_background_mode() -> None:
    rb = ReplayBuffer(1000)
    async with Collector(lambda: CountingEnv(num_envs=2, episode_length=2), frames_per_batch=8) as collector:
        collector.start(replay_buffer=rb)
        await wait_until(lambda: collector.stats().batches >= 3, timeout=30)
        async with collector.pause():
            stats = collector.stats()
    assert stats.frames == 8 * stats.batches
    assert stats.episodes == stats.frames // 2
    assert stats.episode_return_mean == 2.0


# -- worker processes: episodes come in the batch headers ----------------------------------------
# The fork server imports torch once for all workers, which keeps these tests short.
async def test_worker_collectors_report_episodes_from_their_batch_headers() -> None:
    env = functools.partial(CountingEnv, num_envs=2, episode_length=[3, 5])
    async with MultiSyncCollector([env] * 2, frames_per_batch=16, total_frames=96, start_method="forkserver") as c:
        async for _ in c:
            pass
        stats = c.stats()
    # Each worker's envs step 24 times: 8 episodes of 3 steps and 4 of 5, per worker.
    assert stats.episodes == 2 * (8 + 4)
    assert stats.episode_return_mean == pytest.approx((2 * 8 * 3 + 2 * 4 * 5) / 24)
    assert set(stats.worker_frames_per_s) == {0, 1}
    assert all(rate > 0 for rate in stats.worker_frames_per_s.values())
    assert stats.policy_lag == {0: 0, 1: 0}
    assert (stats.frames, stats.restarts, stats.dropped_batches) == (96, 0, 0)


async def test_worker_restarts_show_in_stats_and_progress(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="acollect.progress")
    async with MultiSyncCollector(
        [CountingEnv] * 2, frames_per_batch=4, max_worker_restarts=1, start_method="forkserver", progress="log"
    ) as collector:
        await anext(collector)
        pid = collector.worker_pids[0]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await anext(collector)  # worker 0's part can only come from its restarted incarnation
        stats = collector.stats()
        assert stats.restarts == 1
        assert stats.dropped_batches == collector.dropped_batches
    lines = [r.getMessage() for r in caplog.records if r.name == "acollect.progress"]
    assert lines[-1].startswith("MultiSyncCollector: 8 frames, ")
    assert "1 restarts" in lines[-1]


# -- progress ------------------------------------------------------------------------------
async def test_progress_log_lines_go_to_the_acollect_progress_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="acollect.progress")
    env = lambda: CountingEnv(num_envs=2, episode_length=4)  # noqa: E731
    async with Collector(env, frames_per_batch=8, total_frames=32, progress="log") as collector:
        async for _ in collector:
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "acollect.progress"]
    # The first batch and the end (batches come far faster than the 10 s interval).
    assert lines[0].startswith("Collector: 8/32 frames, ")
    assert lines[-1].startswith("Collector: 32/32 frames, ")
    assert "return 4" in lines[-1]
    assert len(lines) == 2


def test_progress_argument_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="progress"):
        Collector("CartPole-v1", frames_per_batch=8, progress="bar")
    assert check_progress(True) in ("tqdm", "log")


def test_progress_tqdm_needs_tqdm() -> None:
    try:
        import tqdm  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigurationError, match=r"acollect\[progress\]"):
            Collector("CartPole-v1", frames_per_batch=8, progress="tqdm")
    else:
        assert check_progress("tqdm") == "tqdm"


def _run_script(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
        check=False,
    )


_SCRIPT = """
import asyncio
from acollect import Collector
from acollect.testing import CountingEnv

async def main():
    async with Collector(lambda: CountingEnv(num_envs=2), frames_per_batch=8, total_frames=64,
                         progress={progress!r}) as c:
        async for _ in c:
            pass

asyncio.run(main())
"""


def test_nothing_is_printed_unless_asked_and_progress_shows_without_logging_setup() -> None:
    quiet = _run_script(_SCRIPT.format(progress=False))
    assert quiet.returncode == 0, quiet.stderr
    assert (quiet.stdout, quiet.stderr) == ("", "")
    shown = _run_script(_SCRIPT.format(progress="log"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == ""
    assert "Collector: 64/64 frames" in shown.stderr


def test_progress_tqdm_bar_on_stderr() -> None:
    pytest.importorskip("tqdm")
    shown = _run_script(_SCRIPT.format(progress="tqdm"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == ""
    assert "64/64" in shown.stderr
    assert "frames/s" in shown.stderr


def test_the_library_has_no_print_calls() -> None:
    offenders = []
    for path in sorted((ROOT / "acollect").rglob("*.py")):
        if path.parent.name == "cli":
            continue  # the command line prints on purpose
        offenders.extend(
            f"{path.relative_to(ROOT)}:{node.lineno}"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
        )
    assert offenders == [], "the library logs (logging.getLogger('acollect')), it never prints"


def test_the_metrics_page_has_one_unbroken_table_naming_every_stats_field() -> None:
    # A blank line inside a Markdown table ends it: the rows after it render as raw "| ... |" text.
    lines = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("| field | meaning |")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    table = "\n".join(lines[start:end])
    after = next((line for line in lines[end:] if line.strip()), "")
    assert not after.startswith("| `"), f"a row cut off from docs/metrics.md's fields table: {after}"
    missing = [f.name for f in dataclasses.fields(CollectorStats) if f"`{f.name}`" not in table]
    assert missing == [], f"CollectorStats fields not in docs/metrics.md's table: {missing}"
