"""Mutation testing of the modules where a wrong value is silent: one group at a time, each against its own tests.

A mutant is a copy of the code with one small deliberate bug (``<`` for ``<=``, ``+ 1``, an argument dropped, a
``return`` of ``None``); a test suite *kills* it when some test fails. A mutant that survives is either a gap in the
tests (a bug that plausible code could hold and nothing would notice) or an equivalent mutant (one that changes
nothing that can be observed). Here mutmut makes the mutants and runs the tests, over the groups of
:data:`GROUPS`: weights and their versions, the batch plan and the frame counts, trajectory ids and episodes,
lent memory, worker restarts and liveness, env restarts, one sub-env rebuilt alone.

Usage (from the repository root, in the dev environment: ``pip install -e '.[dev]'``)::

    python tools/mutation.py                      # every group
    python tools/mutation.py weights liveness     # some groups
    python tools/mutation.py --list               # the groups, their modules and their tests
    python tools/mutation.py lending --survivors  # and the diff of every mutant that survived

Each group runs in a copy of the working tree (tracked files and untracked ones git does not ignore) in a
temporary directory, never in the tree itself: mutmut writes its mutants under ``mutants/`` there, mutating only
the group's modules, and runs only the group's tests (a table below), each mutant against the tests that ran its
function. Worker processes (forked from multiprocessing's fork server, which each mutant's test run starts anew)
import the same mutated copy, and get the mutant to run from the environment. The jobs run at low priority
(``nice``), two mutants at a time by default. The table printed at the end says, per group and per module of a
group of several, how many mutants were killed, timed out (a hang that only a deadline ends: caught too),
survived or ran no test, and the kill rate (killed and timed out over all). The exit status is 1 when a group's
kill rate is under ``--fail-under``.

The common mutmut settings are in ``pyproject.toml`` (``[tool.mutmut]``); this script adds the group's modules
(``only_mutate``) and tests (``pytest_add_cli_args_test_selection``) in the copy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Group:
    """Modules mutated together, and the tests that cover them: fast ones (unit tests, a worker loop in a thread, the
    liveness loop over ``sleep`` processes), since each mutant runs every test that ran its function until one
    fails; a collector's worker processes take seconds to start, the suite tests them."""

    modules: tuple[str, ...]
    tests: tuple[str, ...]
    about: str


#: group name -> what it mutates and the tests it runs. A module path among the tests runs its doctests.
GROUPS: dict[str, Group] = {
    "weights": Group(
        modules=(
            "acollect/_weights/updates.py",
            "acollect/_workers/weight_push.py",
            "acollect/_weights/sync.py",
            "acollect/_workers/staging.py",
        ),
        tests=(
            "acollect/_weights/updates.py",
            "acollect/_weights/sync.py",
            "tests/transport/test_wire.py::test_weights_roundtrip_between_two_mlps",
            "tests/transport/test_wire.py::test_weights_from_tensordict_into_tensordict_with_preallocated_out",
            "tests/transport/test_wire.py::test_unflatten_rejects_mismatches_before_touching_the_target",
            "tests/transport/test_wire.py::test_flatten_rejects_bad_input",
            "tests/test_worker_loop.py::test_weights_are_acknowledged_and_collect_the_next_batch",
            "tests/test_worker_loop.py::test_weights_pushed_mid_batch_land_at_the_next_batch_asked_for_after_them",
            "tests/test_worker_loop.py::test_weights_for_no_model_are_refused_and_the_worker_keeps_collecting",
            "tests/test_collector.py::test_weight_updates_apply_between_batches_and_bump_version",
            "tests/test_collector.py::test_a_push_that_does_not_fit_is_refused_at_once",
            "tests/test_collector.py::test_weights_of_a_tensordict_modules_inner_module_are_mapped",
            "tests/mutation/test_weights.py",
        ),
        about="versions, staging, the order queued pushes apply in, the structure check",
    ),
    "batch_plan": Group(
        modules=("acollect/_batches/plan.py", "acollect/_batches/counts.py"),
        tests=(
            "acollect/_batches/plan.py",
            "acollect/_batches/counts.py",
            "tests/test_rollout.py",
            "tests/mutation/test_batch_plan.py",
        ),
        about="frames per batch, each worker's share, the frames and batches counted",
    ),
    "trajectories": Group(
        modules=("acollect/_batches/trajectories.py", "acollect/_batches/trajectory_batches.py"),
        tests=(
            "acollect/_batches/trajectories.py",
            "acollect/_batches/trajectory_batches.py",
            "tests/test_trajs_per_batch.py::test_in_process_collector_hands_out_whole_episodes",
            "tests/test_trajs_per_batch.py::test_an_episode_longer_than_total_frames_reaches_the_caller_cut",
            "tests/test_trajs_per_batch.py::test_episodes_given_up_by_a_reset_at_each_batch_are_handed_out_truncated",
            "tests/test_trajs_per_batch.py::test_the_assembler_keeps_the_pieces_of_one_episode_from_several_workers_"
            "apart",
            "tests/test_collector.py::test_reset_at_each_iter_postproc_and_split_trajs",
            "tests/mutation/test_trajectories.py",
        ),
        about="trajectory ids, split trajectories, batches of whole episodes",
    ),
    "lending": Group(
        modules=("acollect/_batches/lending.py",),
        tests=(
            "acollect/_batches/lending.py",
            "tests/transport/test_lender.py",
            "tests/mutation/test_lending.py",
        ),
        about="shared memory lent to the caller, given back when its last tensor is gone; the budget",
    ),
    "liveness": Group(
        modules=(
            "acollect/_workers/liveness.py",
            "acollect/_workers/handles.py",
            "acollect/_workers/heartbeats.py",
            "acollect/_workers/batch_sequence.py",
            "acollect/_workers/lockstep_requests.py",
            "acollect/_workers/worker_memory.py",
            "acollect/_workers/worker_commands.py",
            "acollect/_workers/worker_hello.py",
        ),
        tests=(
            "acollect/_workers/handles.py",
            "acollect/_workers/heartbeats.py",
            "acollect/_workers/batch_sequence.py",
            "acollect/_workers/lockstep_requests.py",
            "acollect/_workers/worker_memory.py",
            "acollect/_workers/worker_commands.py",
            "acollect/_workers/worker_hello.py",
            "tests/test_state_tables.py::test_a_worker_slot_lives_through_a_restart_and_a_stop",
            "tests/test_state_tables.py::test_moves_the_tables_do_not_list_raise",
            "tests/test_state_tables.py::test_docs_show_every_table_as_it_is",
            "tests/mutation/test_liveness.py",
        ),
        about="worker restarts, batches dropped with a dead worker, heartbeats and deadlines",
    ),
    "env_faults": Group(
        modules=("acollect/_rollout/env_faults.py",),
        tests=(
            "acollect/_rollout/env_faults.py",
            "tests/test_env_faults.py",
            "tests/mutation/test_env_restarts.py",
        ),
        about="envs rebuilt after an exception, counted, given up on after a few in a row",
    ),
    "sub_env_faults": Group(
        modules=("acollect/_rollout/sub_env_faults.py", "acollect/envs/_gym_faults.py", "acollect/_rollout/keys.py"),
        tests=(
            "acollect/_rollout/keys.py",
            "acollect/envs/_gym_faults.py",
            "tests/test_sub_env_faults.py",
            "tests/test_multi_agent.py",
        ),
        about="one sub-env rebuilt alone, the batch mended around it; a multi-agent env's keys and truncations",
    ),
}

#: mutmut's verdicts by exit code (mutmut.stats.status_by_exit_code), in the columns printed.
_KILLED = {1, 3}
_TIMEOUT = {-24, 24, 152, 255, 36}
_SURVIVED = {0}
_NO_TESTS = {5, 33}


class GroupFailed(Exception):
    """mutmut could not run a group (its tests fail without a mutant, or none of them ran a mutated function)."""


def copy_tree(destination: Path) -> None:
    """Copies the working tree (tracked files, and untracked ones git does not ignore) to ``destination``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if not source.is_file():  # deleted in the tree, not yet in git
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def configure(tree: Path, group: Group) -> None:
    """Adds the group's modules and tests to the copy's ``[tool.mutmut]`` table."""
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text()
    header = "[tool.mutmut]\n"
    if header not in text:
        raise SystemExit(f"{pyproject} has no [tool.mutmut] table: expected the project's mutmut settings there")
    missing = [path for path in (*group.modules, *group.tests) if not (tree / path.split("::")[0]).exists()]
    if missing:
        raise SystemExit(f"the group names files that do not exist: {missing}")
    lines = f"only_mutate = {json.dumps(list(group.modules))}\n"
    lines += f"pytest_add_cli_args_test_selection = {json.dumps(list(group.tests))}\n"
    pyproject.write_text(text.replace(header, header + lines, 1))


def counts(tree: Path, group: Group) -> dict[str, list[str]]:
    """Mutant names by verdict (killed, timeout, survived, no tests, other), from mutmut's result files."""
    out: dict[str, list[str]] = {"killed": [], "timeout": [], "survived": [], "no tests": [], "other": []}
    for module in group.modules:
        meta = tree / "mutants" / f"{module}.meta"
        if not meta.exists():
            continue
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if code in _KILLED:
                out["killed"].append(name)
            elif code in _TIMEOUT:
                out["timeout"].append(name)
            elif code in _SURVIVED:
                out["survived"].append(name)
            elif code in _NO_TESTS:
                out["no tests"].append(name)
            else:
                out["other"].append(name)
    return out


def run_group(name: str, group: Group, work: Path, *, max_children: int, survivors: bool) -> dict[str, list[str]]:
    """Runs mutmut over one group in a fresh copy under ``work``; returns the verdicts."""
    tree = work / name
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    copy_tree(tree)
    configure(tree, group)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUTANT_UNDER_TEST")}
    log = tree / "mutmut.log"
    print(f"{name}: mutating {', '.join(group.modules)} (log: {log})", flush=True)
    command = ["nice", "-n", "15", sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    with log.open("w") as out:
        done = subprocess.run(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    verdicts = counts(tree, group)
    if done.returncode != 0 or not any(verdicts.values()):
        tail = log.read_text(errors="replace").replace("\r", "\n").splitlines()[-40:]
        print("\n".join(line for line in tail if line.strip()))
        raise GroupFailed(f"{name}: mutmut failed (exit status {done.returncode}); its log: {log}")
    if survivors:
        for mutant in sorted(verdicts["survived"] + verdicts["no tests"]):
            shown = subprocess.run([sys.executable, "-m", "mutmut", "show", mutant], cwd=tree, env=env,
                                   capture_output=True, text=True, check=False)  # fmt: skip
            print(shown.stdout)
    return verdicts


def per_module(verdicts: dict[str, list[str]], group: Group) -> dict[str, dict[str, list[str]]]:
    """The verdicts split by module: mutmut names each mutant after its module's dotted path
    (``acollect._workers.liveness.x_f__mutmut_3``)."""
    dotted = {module: module.removesuffix(".py").replace("/", ".") + "." for module in group.modules}
    out: dict[str, dict[str, list[str]]] = {module: {kind: [] for kind in verdicts} for module in group.modules}
    for kind, names in verdicts.items():
        for name in names:
            module = max((m for m, prefix in dotted.items() if name.startswith(prefix)), key=len, default=None)
            if module is not None:
                out[module][kind].append(name)
    return out


def rate(verdicts: dict[str, list[str]]) -> float:
    """Killed and timed out, over every mutant."""
    total = sum(len(v) for v in verdicts.values())
    return 100.0 * (len(verdicts["killed"]) + len(verdicts["timeout"])) / total if total else 100.0


def print_row(label: str, verdicts: dict[str, list[str]], tail: str) -> None:
    """One line of the table: the mutants by verdict and the kill rate, then ``tail`` (the minutes, or nothing)."""
    total = sum(len(v) for v in verdicts.values())
    counts = [len(verdicts[k]) for k in ("killed", "timeout", "survived", "no tests", "other")]
    print(f"{label:<18}{total:>8}{counts[0]:>8}{counts[1]:>8}{counts[2]:>9}{counts[3]:>9}{counts[4]:>6}"
          f"{rate(verdicts):>9.1f}%{tail}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", metavar="GROUP", help=f"groups to run (default: all): {', '.join(GROUPS)}")
    parser.add_argument("--list", action="store_true", help="list the groups, their modules and tests, and exit")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default: 2)")
    parser.add_argument("--fail-under", type=float, default=85.0, help="the lowest kill rate that passes (percent)")
    parser.add_argument("--survivors", action="store_true", help="print the diff of every mutant that survived")
    parser.add_argument("--workdir", type=Path, help="where the copies go, kept after the run (default: a temp dir)")
    args = parser.parse_args(argv)
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown groups {unknown}: expected some of {list(GROUPS)}")
    if args.list:
        for name, group in GROUPS.items():
            print(f"{name}: {group.about}\n  mutates: {' '.join(group.modules)}\n  tests:   {' '.join(group.tests)}")
        return 0
    names = args.groups or list(GROUPS)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="acollect-mutation-"))
    results: dict[str, tuple[dict[str, list[str]], float]] = {}
    failed = []
    try:
        for name in names:
            start = time.monotonic()
            try:
                verdicts = run_group(name, GROUPS[name], work, max_children=args.max_children, survivors=args.survivors)
            except GroupFailed as exc:
                print(exc)
                failed.append(name)
                continue
            results[name] = (verdicts, time.monotonic() - start)
            if not args.survivors and verdicts["survived"]:
                print(f"{name}: survived: {', '.join(sorted(verdicts['survived']))}")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'group':<18}{'mutants':>8}{'killed':>8}{'timeout':>8}{'survived':>9}{'no tests':>9}"
          f"{'other':>6}{'kill rate':>10}{'minutes':>8}")  # fmt: skip
    for name, (verdicts, seconds) in results.items():
        print_row(name, verdicts, f"{seconds / 60:>8.1f}")
        modules = per_module(verdicts, GROUPS[name])
        if len(modules) > 1:  # each module's own rate: a well tested one can hide a poorly tested one
            for module, counts in modules.items():
                print_row(f"  {Path(module).name}", counts, "")
        if rate(verdicts) < args.fail_under:
            failed.append(name)
    if failed:
        print(f"failed to run, or kill rate under {args.fail_under}%: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
