"""Every collector's keyword options: checked once, a misspelt one named with the closest, a bad value named."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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
from acollect.collectors._options import WorkerSettings, parse
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


def test_the_generated_modules_are_current() -> None:
    # Each option is declared once (_options.py, _collector_settings.py); the TypedDicts mypy checks **options against
    # and each collector's Keyword Args are generated from the declarations into _generated_*.py, checked in.
    from acollect.collectors._option_codegen import REGENERATE, stale

    assert not stale(), f"stale in acollect/collectors: {stale()}; run {REGENERATE}"


def test_the_staleness_check_sees_a_changed_declaration_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What makes the test above able to fail: a declaration changed after the last regeneration, a generated file
    # edited by hand, or one missing.
    from acollect.collectors._collector_settings import MultiSyncSettings
    from acollect.collectors._option_codegen import stale, write_all
    from acollect.collectors._options import Override

    write_all(tmp_path)
    assert stale(tmp_path) == []
    overrides = {**MultiSyncSettings.OVERRIDES, "cat_results": Override(note="A note added since.")}
    monkeypatch.setattr(MultiSyncSettings, "OVERRIDES", overrides)
    assert stale(tmp_path) == ["_generated_keyword_args.py"]
    monkeypatch.undo()
    edited = tmp_path / "_generated_options.py"
    edited.write_text(edited.read_text().replace("total_frames: int", "total_frames: float"))
    assert stale(tmp_path) == ["_generated_options.py"]
    (tmp_path / "_generated_keyword_args.py").unlink()
    assert stale(tmp_path) == ["_generated_options.py", "_generated_keyword_args.py"]


def test_the_generated_modules_say_so() -> None:
    from acollect.collectors import _generated_keyword_args, _generated_options
    from acollect.collectors._option_codegen import BANNER

    for module in (_generated_options, _generated_keyword_args):
        assert Path(str(module.__file__)).name.startswith("_generated_")
        assert Path(str(module.__file__)).read_text().startswith(BANNER)
    assert "do not edit" in BANNER
    assert "Regenerate with: python" in BANNER


def test_each_collector_typed_dict_holds_its_keywords_each_declared_once() -> None:
    # The TypedDicts share fields by inheritance: each keyword is declared in one class body only, and each
    # collector's TypedDict (its constructor's **options) still holds exactly the keywords the collector takes.
    import ast

    from acollect.collectors import _generated_options
    from acollect.collectors._option_codegen import collectors
    from acollect.collectors._options import accepted

    tree = ast.parse(Path(str(_generated_options.__file__)).read_text())
    declared = [
        node.target.id
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    ]
    assert len(declared) == len(set(declared)), sorted({k for k in declared if declared.count(k) > 1})
    for collector in collectors():
        typed = inspect.signature(collector.__init__).parameters["options"].annotation
        name = typed.removeprefix("Unpack[").removesuffix("]")
        keys = getattr(_generated_options, name)
        assert keys.__required_keys__ == {"frames_per_batch"}, name
        assert keys.__required_keys__ | keys.__optional_keys__ == {f.name for f in accepted(collector.settings_class)}


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


def test_every_public_collector_has_its_keyword_args_generated() -> None:
    from acollect.collectors._option_codegen import collectors

    assert set(collectors()) == _public_collectors()
    assert len(collectors()) == 8


@pytest.mark.parametrize("collector", sorted(_public_collectors(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_the_docstring_lists_each_option_as_declared(collector: type) -> None:
    # What help(collector) and the API page show is what the declarations say: each keyword the collector takes,
    # its type, doc and default.
    from acollect.collectors._option_codegen import docstring_keyword_args, keyword_args_section

    assert docstring_keyword_args(collector.__doc__, collector.__name__) == keyword_args_section(collector)
    assert collector.__doc__.count("Keyword Args:") == 1


@pytest.mark.parametrize("collector", sorted(_public_collectors(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_the_source_docstring_holds_a_pointer_not_the_generated_text(collector: type) -> None:
    # No generated line inside a hand-written class: its source says where its keywords are declared.
    import ast
    import textwrap

    from acollect.collectors._option_codegen import docstring_keyword_args, keyword_args_pointer

    source = ast.parse(textwrap.dedent(inspect.getsource(collector)))
    node = source.body[0]
    assert isinstance(node, ast.ClassDef)
    written = docstring_keyword_args(ast.get_docstring(node, clean=False) or "", collector.__name__)
    assert " ".join(written.split()) == keyword_args_pointer(collector)
    assert collector.settings_class.__name__ in written


def test_add_keyword_args_puts_the_section_in_place_of_what_the_source_says() -> None:
    # Between the sections around it, as often as it is called; a docstring without the section is refused.
    from acollect.collectors import _generated_keyword_args
    from acollect.collectors._option_codegen import add_keyword_args, keyword_args_section

    class MultiAsyncCollector(acollect.MultiAsyncCollector):
        """A collector documented with a pointer.

        Args:
            create_env_fn_list: the envs.

        Keyword Args:
            Declared elsewhere.

        Raises:
            ConfigurationError: a bad argument.
        """

    add_keyword_args(MultiAsyncCollector)
    first = MultiAsyncCollector.__doc__
    add_keyword_args(MultiAsyncCollector)
    assert MultiAsyncCollector.__doc__ == first
    assert "Declared elsewhere" not in first
    section = _generated_keyword_args.KEYWORD_ARGS["MultiAsyncCollector"]
    assert section == keyword_args_section(acollect.MultiAsyncCollector) + "\n"
    body = "\n".join(f"            {line}" if line else "" for line in section.splitlines())
    assert f"create_env_fn_list: the envs.\n\n        Keyword Args:\n{body}\n\n        Raises:\n" in first
    assert first.rstrip().endswith("ConfigurationError: a bad argument.")

    undocumented = type("MultiAsyncCollector", (acollect.MultiAsyncCollector,), {"__doc__": "No section."})
    with pytest.raises(ValueError, match="one 'Keyword Args:' line in MultiAsyncCollector's docstring, found 0"):
        add_keyword_args(undocumented)
    unknown = type("NewCollector", (acollect.MultiAsyncCollector,), {"__doc__": "Keyword Args:\n    Not yet."})
    add_keyword_args(unknown)  # not generated yet (the staleness test says so): it keeps what its source says
    assert unknown.__doc__ == "Keyword Args:\n    Not yet."


SETTINGS_CLASSES = sorted({c.settings_class for c in _public_collectors()} | {WorkerSettings}, key=lambda s: s.__name__)


@pytest.mark.parametrize("settings", SETTINGS_CLASSES, ids=lambda s: s.__name__)
def test_every_declared_option_says_what_it_does_and_who_checks_it(settings: type) -> None:
    from dataclasses import fields

    for f in fields(settings):
        doc = f.metadata.get("doc") or ""
        assert doc.endswith("."), f"{settings.__name__}.{f.name}: its doc is what users read, a sentence"
        checked = f.metadata.get("check") is not None or "checked" in doc or "ignored" in doc
        assert checked, f"{settings.__name__}.{f.name}: who checks it?"
    for name, override in settings.OVERRIDES.items():
        assert name in {f.name for f in fields(settings)} or override.refused, f"{settings.__name__}: {name}?"


@pytest.mark.parametrize(
    ("build", "keyword", "why"),
    [
        (lambda **kw: AsyncCollector(CountingEnv, **kw), "num_workers", "an AsyncCollector has one worker"),
        (lambda **kw: RayCollector([CountingEnv] * 2, **kw), "launcher", "workers are Ray actors"),
        (lambda **kw: RayCollector([CountingEnv] * 2, **kw), "num_workers", "workers are Ray actors"),
        (lambda **kw: DistributedSyncCollector([CountingEnv] * 2, **kw), "sync", "is sync=True"),
    ],
)
def test_a_refused_keyword_is_named_with_the_reason_and_left_out_of_the_docs(
    build: Callable[..., Any], keyword: str, why: str
) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{keyword}=2 is invalid: expected no value: .*{why}"):
        build(frames_per_batch=8, **{keyword: 2})
    collector = build(frames_per_batch=8)
    assert f"\n{keyword} (" not in "\n" + type(collector).__doc__


def test_a_collector_own_default_applies_where_the_keyword_is_not_given() -> None:
    from acollect.collectors._collector_settings import BatchedSettings

    assert parse({"frames_per_batch": 8}, BatchedSettings).storing_device == "cpu"
    assert parse({"frames_per_batch": 8, "storing_device": None}, BatchedSettings).storing_device is None
    assert "storing_device (Devices): where batches land (the workers' envs make them" in AsyncBatchedCollector.__doc__
    assert "Defaults to ``'cpu'``." in AsyncBatchedCollector.__doc__


@pytest.mark.parametrize(("keyword", "value", "sync"), [("cat_results", 0, False), ("credits", 3, True)])
def test_a_mode_option_is_refused_in_the_other_mode_and_documented_with_its_mode(
    keyword: str, value: object, sync: bool
) -> None:
    from acollect.collectors._collector_settings import ModeSettings

    with pytest.raises(ConfigurationError, match=rf"^{keyword}={value} is invalid: expected no value with sync={sync}"):
        parse({"frames_per_batch": 8, "sync": sync, keyword: value}, ModeSettings)
    assert getattr(parse({"frames_per_batch": 8, "sync": not sync, keyword: value}, ModeSettings), keyword) == value
    assert f"Only with ``sync={not sync}``." in DistributedCollector.__doc__
    assert "Only with" not in MultiSyncCollector.__doc__  # its class fixes the mode


def test_frames_per_batch_says_what_each_batch_holds_and_cannot_be_set() -> None:
    collector = Collector(lambda: CountingEnv(num_envs=3), frames_per_batch=10)
    assert (collector.requested_frames_per_batch, collector.frames_per_batch) == (10, 10)  # envs unknown yet
    with pytest.raises(AttributeError):
        collector.frames_per_batch = 12  # type: ignore[misc]
