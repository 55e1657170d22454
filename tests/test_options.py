"""Every collector's keyword options: checked once, a misspelt one named with the closest, a bad value named."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import acollect
from acollect import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    ConfigurationError,
    DistributedCollector,
    DistributedSyncCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
    RayCollector,
)
from acollect.collectors._options import WorkerSettings
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
    settings = WorkerSettings(frames_per_batch=8, heartbeat_timeout=5, env_kwargs=None)
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
    frames = [c.rollout.frames_per_batch for c in collector.worker_configs]
    assert frames == ([8 // len(frames)] * len(frames) if SYNC[name] else [8] * len(frames))


def test_every_option_has_a_doc_and_a_check_or_says_who_checks_it() -> None:
    from dataclasses import fields

    from acollect.collectors._options import WorkerSettings

    for f in fields(WorkerSettings):
        assert f.metadata.get("doc"), f"{f.name} has no doc"
        assert f.metadata.get("check") is not None or "checked" in f.metadata["doc"], f"{f.name}: who checks it?"


# -- every option declared once: the docs users read are generated from the declarations ---------------------
def _public_collectors() -> set[type]:
    import acollect
    from acollect.collectors._base import CollectorBase

    found = {getattr(acollect, name) for name in acollect.__all__}
    return {c for c in found if isinstance(c, type) and issubclass(c, CollectorBase) and c is not CollectorBase}


# Where a collector's signature default differs from what its settings class declares, and why.
OWN_DEFAULTS = {
    # the workers' envs make the batches, not the inference device
    ("AsyncBatchedCollector", "storing_device"): "cpu",
}
# Keywords a collector's settings class holds that its signature does not take (fixed by its class, or refused).
NOT_TAKEN = {
    "Collector": set(),
    "MultiSyncCollector": set(),
    "MultiAsyncCollector": set(),
    "AsyncCollector": {"num_workers", "on_worker_loss"},
    "AsyncBatchedCollector": set(),
    "DistributedCollector": {"worker_affinity", "on_worker_loss"},
    "DistributedSyncCollector": {"worker_affinity", "on_worker_loss", "sync", "credits"},
    "RayCollector": {"launcher", "num_workers", "worker_affinity"},
}


@pytest.mark.parametrize("collector", sorted(_public_collectors(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_each_signature_takes_what_its_settings_declare_with_their_defaults_and_types(collector: type) -> None:
    # The signature is what IDEs, help() and mypy read; the settings class declares each option's check and doc.
    # They name the same keywords, with the same defaults and the types callers may pass.
    from dataclasses import MISSING, fields

    from acollect.collectors._options import RolloutSettings

    settings = collector.settings_class
    params = dict(inspect.signature(collector).parameters)
    assert list(params)[:2] in (["create_env_fn", "policy"], ["create_env_fn_list", "policy"])
    keywords = {name: p for name, p in params.items() if p.kind is p.KEYWORD_ONLY}
    declared = {f.name: f for f in fields(settings)}
    assert set(keywords) == set(declared) - NOT_TAKEN[collector.__name__]
    assert keywords["frames_per_batch"].default is inspect.Parameter.empty
    for name, p in keywords.items():
        f = declared[name]
        default = f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]
        expected = OWN_DEFAULTS.get((collector.__name__, name), default)
        if f.default_factory is not MISSING:
            expected = None  # (a mutable default is None in a signature; the check makes it {})
        if name != "frames_per_batch":
            assert p.default == expected, f"{collector.__name__}({name}=...): {p.default!r} != {expected!r}"
        accepts = f.metadata.get("accepts") or f.type
        assert p.annotation in (accepts, f"{accepts} | None"), f"{collector.__name__}({name}: {p.annotation})"
    assert issubclass(settings, RolloutSettings)


def test_help_shows_every_keyword_of_the_signature() -> None:
    import pydoc

    text = pydoc.render_doc(acollect.MultiSyncCollector, renderer=pydoc.plaintext)
    for keyword in ("frames_per_batch: 'int'", "cat_results: 'str | int | None' = None", "heartbeat_timeout"):
        assert keyword in text


SETTINGS_CLASSES = sorted({c.settings_class for c in _public_collectors()} | {WorkerSettings}, key=lambda s: s.__name__)


@pytest.mark.parametrize("settings", SETTINGS_CLASSES, ids=lambda s: s.__name__)
def test_every_declared_option_says_what_it_does_and_who_checks_it(settings: type) -> None:
    from dataclasses import fields

    for f in fields(settings):
        doc = f.metadata.get("doc") or ""
        assert doc.endswith("."), f"{settings.__name__}.{f.name}: its doc is what users read, a sentence"
        checked = f.metadata.get("check") is not None or "checked" in doc or "ignored" in doc
        assert checked, f"{settings.__name__}.{f.name}: who checks it?"


@pytest.mark.parametrize(
    ("build", "keyword", "why"),
    [
        (lambda **kw: AsyncCollector(CountingEnv, **kw), "num_workers", "an AsyncCollector has one worker"),
        (lambda **kw: RayCollector([CountingEnv] * 2, **kw), "launcher", "workers are Ray actors"),
        (lambda **kw: RayCollector([CountingEnv] * 2, **kw), "num_workers", "workers are Ray actors"),
        (lambda **kw: DistributedSyncCollector([CountingEnv] * 2, **kw), "sync", "is sync=True"),
    ],
)
def test_a_refused_keyword_is_named_with_the_reason_and_left_out_of_the_signature(
    build: Callable[..., Any], keyword: str, why: str
) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{keyword}=2 is invalid: expected no value: .*{why}"):
        build(frames_per_batch=8, **{keyword: 2})
    collector = build(frames_per_batch=8)
    assert keyword not in inspect.signature(type(collector)).parameters


def test_a_collector_own_default_applies_where_the_keyword_is_not_given() -> None:
    from acollect.collectors._collector_settings import BatchedSettings

    assert (
        AsyncBatchedCollector(CountingEnv, policy=torch.nn.Linear(1, 1), frames_per_batch=8).settings.storing_device
        == "cpu"
    )
    given = AsyncBatchedCollector(CountingEnv, policy=torch.nn.Linear(1, 1), frames_per_batch=8, storing_device=None)
    assert given.settings.storing_device is None
    assert BatchedSettings(frames_per_batch=8).storing_device is None  # the collector's own default is its signature's


@pytest.mark.parametrize(("keyword", "value", "sync"), [("cat_results", 0, False), ("credits", 3, True)])
def test_a_mode_option_is_refused_in_the_other_mode(keyword: str, value: object, sync: bool) -> None:
    from acollect.collectors._collector_settings import ModeSettings

    with pytest.raises(ConfigurationError, match=rf"^{keyword}={value} is invalid: expected no value with sync={sync}"):
        ModeSettings(frames_per_batch=8, sync=sync, **{keyword: value})
    assert getattr(ModeSettings(frames_per_batch=8, sync=not sync, **{keyword: value}), keyword) == value
    with pytest.raises(ConfigurationError, match=rf"^{keyword}={value} is invalid: expected no value with sync={sync}"):
        DistributedCollector([CountingEnv] * 2, frames_per_batch=8, sync=sync, **{keyword: value})
    assert DistributedCollector([CountingEnv] * 2, frames_per_batch=8).settings.credits == 2


def test_frames_per_batch_says_what_each_batch_holds_and_cannot_be_set() -> None:
    collector = Collector(lambda: CountingEnv(num_envs=3), frames_per_batch=10)
    assert (collector.requested_frames_per_batch, collector.frames_per_batch) == (10, 10)  # envs unknown yet
    with pytest.raises(AttributeError):
        collector.frames_per_batch = 12  # type: ignore[misc]
