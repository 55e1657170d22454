"""Every collector's keyword options: checked once, a misspelt one named with the closest, a bad value named."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

from acollect import (
    AsyncCollector,
    Collector,
    ConfigurationError,
    DistributedCollector,
    DistributedSyncCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
    RayCollector,
)
from acollect.collectors.options import WorkerSettings, parse
from acollect.testing import CountingEnv

# Each builds a collector (nothing starts) from keyword options; the Ray and distributed ones need no Ray
# nor process group until they start.
BUILDERS: dict[str, Callable[..., Any]] = {
    "Collector": lambda **kw: Collector(CountingEnv, **kw),
    "MultiSyncCollector": lambda **kw: MultiSyncCollector([CountingEnv] * 2, **kw),
    "MultiAsyncCollector": lambda **kw: MultiAsyncCollector([CountingEnv] * 2, **kw),
    "AsyncCollector": lambda **kw: AsyncCollector(CountingEnv, **kw),
    "DistributedSyncCollector": lambda **kw: DistributedSyncCollector([CountingEnv] * 2, **kw),
    "DistributedCollector": lambda **kw: DistributedCollector([CountingEnv] * 2, **kw),
    "RayCollector(sync=True)": lambda **kw: RayCollector([CountingEnv] * 2, sync=True, **kw),
    "RayCollector(sync=False)": lambda **kw: RayCollector([CountingEnv] * 2, **kw),
}
MULTI = [name for name in BUILDERS if name != "Collector"]
# Each multi-process collector's mode: its class fixes it, or its sync argument picks it.
SYNC = {
    "MultiSyncCollector": True,
    "MultiAsyncCollector": False,
    "AsyncCollector": False,
    "DistributedSyncCollector": True,
    "DistributedCollector": False,
    "RayCollector(sync=True)": True,
    "RayCollector(sync=False)": False,
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_misspelt_option_is_named_with_the_closest(name: str) -> None:
    build = BUILDERS[name]
    with pytest.raises(ConfigurationError, match=r"unexpected keyword argument 'framse_per_batch'; did you mean "
                                                 r"'frames_per_batch'\?"):  # fmt: skip
        build(framse_per_batch=8)
    with pytest.raises(ConfigurationError, match=r"unexpected keyword argument 'max_frames_per_trajectory'; did "
                                                 r"you mean 'max_frames_per_traj'\?"):  # fmt: skip
        build(frames_per_batch=8, max_frames_per_trajectory=10)


@pytest.mark.parametrize(
    ("name", "typo", "meant"),
    [
        ("MultiSyncCollector", "cat_result", "cat_results"),
        ("MultiAsyncCollector", "credit", "credits"),
        ("DistributedSyncCollector", "backnd", "backend"),
        ("RayCollector(sync=True)", "num_collector", "num_collectors"),
        ("MultiSyncCollector", "filter_warnings", "filter_worker_warnings"),
    ],
)
def test_a_misspelt_keyword_of_the_class_itself_is_suggested(name: str, typo: str, meant: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"'{typo}'; did you mean '{meant}'\?"):
        BUILDERS[name](frames_per_batch=8, **{typo: 1})


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_missing_frames_per_batch_is_named(name: str) -> None:
    with pytest.raises(ConfigurationError, match="missing keyword argument 'frames_per_batch'"):
        BUILDERS[name]()


ROLLOUT_BAD = [
    ("max_frames_per_traj", 0),
    ("init_random_frames", "ten"),  # (RayCollector takes TorchRL's -1 for none)
    ("split_trajs", "yes"),
    ("reset_at_each_iter", 1),
    ("postproc", 3),
    ("env_kwargs", 3),
    ("device", "gpu"),
    ("policy_factory", 3),
]
WORKER_BAD = [
    ("heartbeat_timeout", -1),
    ("startup_timeout", float("inf")),
    ("num_threads", 0),
    ("max_weight_update_interval", 0),
    ("start_method", "fork"),
    ("use_shared_memory", "yes"),
    ("copy_batches", None),
    ("filter_worker_warnings", 1),
    ("weight_sync_schemes", {"policy": "zmq"}),
    ("collector_kwargs", {"num_threads": True}),
]


@pytest.mark.parametrize(("option", "value"), ROLLOUT_BAD)
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_bad_rollout_option_is_named(name: str, option: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{option}\b"):
        BUILDERS[name](frames_per_batch=8, **{option: value})


@pytest.mark.parametrize(("option", "value"), WORKER_BAD)
@pytest.mark.parametrize("name", sorted(MULTI))
def test_a_bad_worker_option_is_named(name: str, option: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{option}\b"):
        BUILDERS[name](frames_per_batch=8, **{option: value})


def test_the_in_process_collector_takes_no_worker_option() -> None:
    with pytest.raises(ConfigurationError, match="unexpected keyword argument 'num_workers'"):
        Collector(CountingEnv, frames_per_batch=8, num_workers=2)  # type: ignore[call-arg]


def test_settings_hold_the_checked_values_with_their_defaults() -> None:
    settings = parse({"frames_per_batch": 8, "heartbeat_timeout": 5, "env_kwargs": None}, WorkerSettings)
    assert settings.heartbeat_timeout == 5.0
    assert isinstance(settings.heartbeat_timeout, float)
    assert settings.env_kwargs == {}
    assert settings.filter_worker_warnings is True
    assert settings.exploration_type is not None
    assert settings.exploration_type.name == "RANDOM"
    with pytest.raises(AttributeError):
        settings.heartbeat_timeout = 1.0  # type: ignore[misc]


_WORKER_WARNING = "a warning raised while a worker builds its env"


def warn_then_count() -> CountingEnv:
    """An env factory that warns (in the worker, where it runs)."""
    warnings.warn(_WORKER_WARNING, UserWarning, stacklevel=1)
    return CountingEnv()


@pytest.mark.parametrize("filter_worker_warnings", [True, False])
async def test_filter_worker_warnings_false_lets_a_worker_warning_through(
    capfd: pytest.CaptureFixture[str], filter_worker_warnings: bool
) -> None:
    async with MultiSyncCollector(
        [warn_then_count], frames_per_batch=4, total_frames=4, filter_worker_warnings=filter_worker_warnings
    ) as collector:
        async for _ in collector:
            pass
    err = capfd.readouterr().err  # the workers write to this process's stderr
    assert (_WORKER_WARNING in err) is (not filter_worker_warnings)


@pytest.mark.parametrize("name", MULTI)
def test_every_multi_process_collector_has_one_mode(name: str) -> None:
    collector = BUILDERS[name](frames_per_batch=8)
    assert collector.sync is SYNC[name]
    frames = [c.frames_per_batch for c in collector.worker_configs]
    assert frames == ([8 // len(frames)] * len(frames) if SYNC[name] else [8] * len(frames))


def test_the_typed_options_are_generated_from_the_declarations() -> None:
    # Each option is declared once (options.py); the TypedDicts mypy checks **options against are generated.
    from pathlib import Path

    import acollect.collectors.option_types as generated
    from acollect.collectors.option_codegen import typed_options_source

    assert Path(generated.__file__).read_text() == typed_options_source(), (
        "acollect/collectors/option_types.py is stale: run "
        "python -c 'from acollect.collectors.option_codegen import write_option_types; write_option_types()'"
    )


def test_every_option_has_a_doc_and_a_check_or_says_who_checks_it() -> None:
    from dataclasses import fields

    from acollect.collectors.options import WorkerSettings

    for f in fields(WorkerSettings):
        assert f.metadata.get("doc"), f"{f.name} has no doc"
        assert f.metadata.get("check") is not None or "checked" in f.metadata["doc"], f"{f.name}: who checks it?"
