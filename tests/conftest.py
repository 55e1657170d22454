"""Shared pytest configuration: one torch thread per test process and GPU auto-skip."""

from __future__ import annotations

import pytest
import torch

# Tests run many small envs and policies side by side on few cores; intra-op threads only
# add contention there, and workers default to one thread too, so tests see what users see.
torch.set_num_threads(1)


# The longest scenarios of a plain `pytest` (`pytest --durations=60` on 2 cores: 6-17 s each, most of it fresh
# interpreters importing torch), marked `slow` here so the README's `pytest` stays near the 7 minutes it states
# for CI's 2 cores; CI runs them with `pytest -m slow`. Each capability keeps a faster test in the plain run.
SLOW_SCENARIOS = {
    # examples end to end (quickstart runs as the README does, in test_quickstart_as_the_readme_runs_it...)
    "tests/test_examples.py::test_example_runs[central_inference.py]",
    "tests/test_examples.py::test_example_runs[ppo_cartpole.py]",
    "tests/test_examples.py::test_example_runs[dqn_cartpole.py]",
    "tests/test_examples.py::test_example_runs[async_envs.py]",
    "tests/test_examples.py::test_example_runs[background_buffer.py]",
    "tests/test_examples.py::test_example_runs[quickstart.py]",
    "tests/test_examples.py::test_example_runs[reinforce_episodes.py]",
    "tests/test_docs.py::test_doc_block_runs[docs/central-inference.md:0]",
    "tests/test_docs.py::test_doc_block_runs[docs/guides/multi-async.md:0]",
    "tests/test_docs.py::test_doc_block_runs[docs/guides/multi-sync.md:0]",
    "tests/test_docs.py::test_doc_block_runs[docs/concepts.md:3]",
    "tests/test_docs.py::test_doc_block_runs[docs/migrating-from-torchrl.md:1]",
    # chaos: each also has a soak and faster tests of the same rule
    "tests/chaos/test_chaos_kill.py::test_random_kills_with_restarts_lose_only_the_batches_in_flight",
    "tests/chaos/test_chaos_cancel.py::test_cancelling_the_consumer_anywhere_leaves_nothing_behind",
    "tests/chaos/test_chaos_trainer.py::test_killing_the_trainer_ends_its_workers_and_frees_its_shared_memory",
    # lifecycle rules: the same rule runs for the other collector kinds
    "tests/test_lifecycle.py::test_cancelled_first_batch_leaves_nothing_and_the_collector_usable[Batched-asyncio]",
    "tests/test_lifecycle.py::test_pauses_from_two_tasks_overlap[Batched-asyncio]",
    "tests/test_lifecycle.py::test_pauses_from_two_tasks_overlap[Distributed-asyncio]",
    "tests/test_lifecycle.py::test_pauses_from_two_tasks_overlap[AsyncEnvs-asyncio]",
    "tests/test_lifecycle.py::test_pauses_from_two_tasks_overlap[AsyncCollector-asyncio]",
    # launchers and remote workers (each keeps its basic test in the plain run)
    "tests/launchers/test_submitit.py::test_delayed_launcher_runs_the_trainer_as_a_job_and_its_workers_as_jobs",
    "tests/launchers/test_submitit.py::test_central_inference_serves_workers_running_as_jobs_over_tcp",
    "tests/launchers/test_submitit.py::test_delayed_launcher_caps_worker_jobs",
    "tests/launchers/test_ray.py::test_sync_ray_collector_stacks_batches_pushes_weights_and_restarts_a_killed_actor",
    "tests/launchers/test_ray.py::test_one_ray_collector_class_in_both_modes[True-8-shape0]",
    "tests/launchers/test_ray.py::test_one_ray_collector_class_in_both_modes[False-4-shape1]",
    "tests/launchers/test_ray.py::test_async_ray_collector_fills_its_replay_buffer_in_the_background",
    "tests/remote/test_remote_workers.py::test_a_dead_remote_worker_is_replaced_by_the_next_to_join",
    "tests/remote/test_remote_heartbeat.py::test_a_stalled_trainer_keeps_its_worker",
    "tests/remote/test_remote_heartbeat.py::test_a_frozen_trainer_ends_its_worker_after_heartbeat_timeout",
    "tests/remote/test_remote_heartbeat.py::test_a_killed_trainer_ends_its_hand_started_worker",
    # workers and the inference server: trainer deaths and fallbacks, each with a faster sibling
    "tests/multi/test_multi_failures.py::test_workers_exit_when_the_trainer_is_killed[spawn]",
    "tests/inference/test_slots.py::test_no_slots_without_a_same_host_address_or_when_asked_for_none",
    "tests/inference/test_batched_collector.py::test_state_dict_carries_the_servers_weights_and_version_to_a_new_collector",
    "tests/inference/test_server_process.py::test_a_killed_trainer_leaves_no_server_process_and_nothing_it_bound",
    "tests/test_stats.py::test_nothing_is_printed_unless_asked_and_progress_shows_without_logging_setup",
    # Ctrl-C: the server process starts as spawned workers do, which the plain run interrupts
    "tests/test_ctrl_c.py::test_ctrl_c_while_collecting_ends_the_program_with_the_trainers_traceback_only[Batched-spawn]",
    "tests/test_async_envs.py::test_worker_collectors_run_each_pool_on_the_workers_own_loop",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the scenarios of ``SLOW_SCENARIOS`` slow, and skips tests marked ``gpu`` when CUDA is not available."""
    found = set()
    for item in items:
        if item.nodeid in SLOW_SCENARIOS:
            item.add_marker(pytest.mark.slow)
            found.add(item.nodeid)
    # A renamed test would silently join the plain run again: name it (only when the whole suite is collected).
    if len(items) > 1000 and found != SLOW_SCENARIOS:
        raise pytest.UsageError(f"SLOW_SCENARIOS names tests that do not exist: {sorted(SLOW_SCENARIOS - found)}")
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# ``--doctest-modules`` would also collect the conftest files under tests/ as doctest modules, and
# several of them share the module name "conftest"; they hold no doctests, so none is collected.
collect_ignore_glob = ["conftest.py", "*/conftest.py"]
