"""Writes what is generated from the option declarations: the ``TypedDict`` s and each collector's option docs.

Each option is declared once, with :func:`~acollect.collectors.options.option`, in
:mod:`acollect.collectors.options` (the options collectors share) and
:mod:`acollect.collectors.collector_settings` (each collector's own). Two things are generated from them
and checked in, so that they never disagree with the declarations (``tests/test_options.py`` fails when
either is stale):

* :mod:`acollect.collectors.option_types`: the ``TypedDict`` s mypy checks each constructor's
  ``**options`` against (:func:`typed_options_source`);
* the "Keyword Args" section of each collector's docstring, which ``help(MultiSyncCollector)`` and the
  API page show (:func:`keyword_args_section`): every keyword the collector takes, with its type, its
  doc and its default, as the collector's settings class declares them.

After changing a declaration, regenerate both:
``python -c "from acollect.collectors.option_codegen import write_all; write_all()"``.

Examples:
    >>> "frames_per_batch: Required[int]" in typed_options_source()
    True
    >>> from acollect import MultiSyncCollector
    >>> print(keyword_args_section(MultiSyncCollector).splitlines()[0])
    frames_per_batch (int): frames in each batch handed out: from every worker together where a batch holds a part...
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
import textwrap
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any

import acollect.collectors as public
from acollect.collectors.base import CollectorBase
from acollect.collectors.collector_settings import (
    AsyncSettings,
    BatchedSettings,
    DistributedSettings,
    DistributedSyncSettings,
    ModeSettings,
    MultiAsyncSettings,
    MultiSyncSettings,
    RaySettings,
)
from acollect.collectors.options import (
    InProcessSettings,
    ProcessSettings,
    RolloutSettings,
    WorkerSettings,
    accepted,
    default_of,
)

__all__ = [
    "collectors",
    "docstring_keyword_args",
    "keyword_args_section",
    "typed_options_source",
    "write_all",
    "write_keyword_args",
    "write_option_types",
]

#: The width of a generated line, its indent included (ruff's line length).
LINE = 120

# -- the TypedDicts -------------------------------------------------------------------------------------------

#: The generated ``TypedDict`` s, in order: (name, settings class, doc). Each inherits the ``TypedDict`` s of its
#: settings class's bases, unless the class refuses a keyword one of them takes: then it lists every keyword.
_TYPED: tuple[tuple[str, type[RolloutSettings], str], ...] = (
    ("RolloutOptions", RolloutSettings, "The keyword options every collector takes."),
    ("InProcessOptions", InProcessSettings, "The options of the in-process ``Collector``."),
    ("ProcessOptions", ProcessSettings,
     "The options of collectors whose envs run in worker processes, but for ``num_workers``."),
    ("WorkerOptions", WorkerSettings, "The options of the multi-process collectors."),
    ("MultiSyncOptions", MultiSyncSettings, "The options of ``MultiSyncCollector``."),
    ("MultiAsyncOptions", MultiAsyncSettings, "The options of ``MultiAsyncCollector``."),
    ("AsyncOptions", AsyncSettings, "The options of ``AsyncCollector``."),
    ("BatchedOptions", BatchedSettings, "The options of ``AsyncBatchedCollector``."),
    ("ModeOptions", ModeSettings, "The options of a collector that takes its mode (``sync``) as an argument."),
    ("DistributedOptions", DistributedSettings, "The options of ``DistributedCollector``."),
    ("DistributedSyncOptions", DistributedSyncSettings, "The options of ``DistributedSyncCollector``."),
    ("RayOptions", RaySettings, "The options of ``RayCollector``."),
)  # fmt: skip

_TYPED_HEADER = '''"""The collectors' ``**options`` as ``TypedDict`` s, for mypy, generated from their declarations.

Do not edit: each option is declared once, in :mod:`acollect.collectors.options` or
:mod:`acollect.collectors.collector_settings`. After changing a declaration, regenerate this module (and
the collectors' docstrings):
``python -c "from acollect.collectors.option_codegen import write_all; write_all()"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType
from typing_extensions import Required, TypedDict

from acollect.devices import DeviceLike
from acollect.policy import PolicyLike
from acollect.transport.auth import ServerKeys
from acollect.transport.weight_sync import WeightSyncScheme

__all__ = [
{names}
]

Devices = DeviceLike | Sequence[DeviceLike]
"""One device, or (multi-process collectors) a list with one per worker."""
'''


def typed_options_source() -> str:
    """The source of :mod:`acollect.collectors.option_types`, generated from the declarations."""
    names = {settings: name for name, settings, _ in _TYPED}
    listed = "\n".join(f'    "{name}",' for name in sorted([*names.values(), "Devices"]))
    parts = [_TYPED_HEADER.replace("{names}", listed)]
    for name, settings, doc in _TYPED:
        takes = [f.name for f in accepted(settings)]
        bases = [b for b in settings.__bases__ if b in names]
        inherited = {f.name for base in bases for f in accepted(base)}
        if not inherited <= set(takes):
            bases, inherited = [], set()  # it refuses a keyword a base takes: every keyword is listed here
        lines = [f"\n\nclass {name}({', '.join(names[b] for b in bases) or 'TypedDict'}, total=False):",
                 f'    """{doc}"""']  # fmt: skip
        for f in accepted(settings):
            if f.name in inherited:
                continue
            kind = f.metadata.get("accepts") or str(f.type)
            if default_of(settings, f) is MISSING:
                kind = f"Required[{kind}]"
            comment = textwrap.wrap(f.metadata["doc"], LINE - 7, break_long_words=False, break_on_hyphens=False)
            lines += ["", *(f"    #: {line}" for line in comment), f"    {f.name}: {kind}"]
        parts.append("\n".join(lines) + "\n")
    return "".join(parts)


def write_option_types() -> None:
    """Regenerates :mod:`acollect.collectors.option_types` from the declarations (after changing one)."""
    Path(__file__).with_name("option_types.py").write_text(typed_options_source())


# -- each collector's Keyword Args -------------------------------------------------------------------------------


def collectors() -> list[type[CollectorBase]]:
    """The public collector classes (those :mod:`acollect.collectors` exports), each with its ``settings_class``."""
    found = [getattr(public, name) for name in dir(public) if not name.startswith("_")]
    return [c for c in found if isinstance(c, type) and issubclass(c, CollectorBase) and c is not CollectorBase]


def _default(value: Any) -> str:
    if value is MISSING:
        return "Required."
    if isinstance(value, enum.Enum):
        value = f"{type(value).__name__}.{value.name}"
    else:
        value = repr(value)
    return f"Defaults to ``{value}``."


def _entry(settings: type[RolloutSettings], f: Field[Any]) -> str | None:
    """One keyword's text (``None``: the collector's class fixes another option so that it is never taken)."""
    override = settings.OVERRIDES.get(f.name)
    doc = override.doc if override is not None and override.doc is not None else f.metadata["doc"]
    sentences = [doc]
    condition = f.metadata.get("only_with")
    if condition is not None:
        key, wanted = condition
        mode = {g.name: g for g in fields(settings)}.get(key)
        if mode is not None and mode.name in {g.name for g in accepted(settings)}:
            sentences.append(f"Only with ``{key}={wanted!r}``.")
        elif mode is not None and default_of(settings, mode) != wanted:
            return None
    if override is not None and override.note is not None:
        sentences.append(override.note)
    sentences.append(_default(default_of(settings, f)))
    kind = f.metadata.get("accepts") or str(f.type)
    return f"{f.name} ({kind}): {' '.join(sentences)}"


#: Declared for several collectors (in :mod:`acollect.collectors.options`): listed after a collector's own.
_SHARED = (RolloutSettings, ProcessSettings, WorkerSettings)
#: What every reader looks for first.
_FIRST = ("frames_per_batch", "total_frames")


def _in_order(settings: type[RolloutSettings]) -> list[Field[Any]]:
    """The keywords ``settings`` takes, as its docs list them: the first ones, then the collector's own (its most
    derived class's first), then the shared ones, each class's in the order it declares them."""

    def rank(f: Field[Any]) -> tuple[int, int]:
        if f.name in _FIRST:
            return 0, _FIRST.index(f.name)
        owner = next(c for c in settings.__mro__ if f.name in vars(c).get("__annotations__", {}))
        return (2, 0) if owner in _SHARED else (1, settings.__mro__.index(owner))

    return sorted(accepted(settings), key=rank)  # (stable: each class's keywords keep their order)


def keyword_args_section(collector: type[CollectorBase]) -> str:
    """The body of ``collector``'s "Keyword Args" docstring section, from its settings class (not indented).

    Every keyword the collector takes (``frames_per_batch`` and ``total_frames``, then its own, then those it
    shares with other collectors): ``name (type): doc``, where the collector means something of its own by it,
    what it means there, then the mode it needs, and its default.
    """
    settings = collector.settings_class
    lines: list[str] = []
    for f in _in_order(settings):
        text = _entry(settings, f)
        if text is None:
            continue
        # Indented as in a top-level class's docstring: 4 for the class body, 4 for the section's entries.
        lines += textwrap.wrap(
            text, LINE, initial_indent="    " * 2, subsequent_indent="    " * 3, break_long_words=False,
            break_on_hyphens=False,
        )  # fmt: skip
    return textwrap.dedent("\n".join(lines))  # (the class body's indent: the writer puts it back)


_HEADER = "Keyword Args:"
_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:$")  # a Google-style section header, such as "Raises:"


def _section_bounds(lines: list[str], indent: str, owner: str) -> tuple[int, int]:
    """Where the "Keyword Args" section's body starts and ends among the lines of ``owner``'s docstring."""
    starts = [i for i, line in enumerate(lines) if line == indent + _HEADER]
    if len(starts) != 1:
        raise ValueError(f"expected one {_HEADER!r} line in {owner}'s docstring, found {len(starts)}")
    end = starts[0] + 1
    while end < len(lines) and not (
        (lines[end].startswith(indent) and _SECTION.match(lines[end][len(indent) :])) or lines[end].strip() == '"""'
    ):
        end += 1
    return starts[0] + 1, end


def docstring_keyword_args(collector: type[CollectorBase]) -> str:
    """The body of the "Keyword Args" section of ``collector``'s docstring, as users read it (not indented)."""
    lines = inspect.cleandoc(collector.__doc__ or "").splitlines()
    start, end = _section_bounds(lines, "", collector.__name__)
    return textwrap.dedent("\n".join(lines[start:end])).strip("\n")


def write_keyword_args(collector: type[CollectorBase]) -> None:
    """Rewrites the "Keyword Args" section of ``collector``'s docstring in its source file from the declarations."""
    path = Path(inspect.getsourcefile(collector) or "")
    source = path.read_text()
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == collector.__name__)
    docstring = node.body[0]
    if not isinstance(docstring, ast.Expr) or docstring.end_lineno is None:
        raise ValueError(f"{collector.__name__} has no docstring to write its Keyword Args into")
    lines = source.splitlines()
    first, last = docstring.lineno - 1, docstring.end_lineno
    doc = lines[first:last]
    indent = " " * (docstring.col_offset)
    start, end = _section_bounds(doc, indent, collector.__name__)
    body = [indent + "    " + line if line else line for line in keyword_args_section(collector).splitlines()]
    doc[start:end] = [*body, ""] if doc[end].strip() != '"""' else body
    lines[first:last] = doc
    path.write_text("\n".join(lines) + "\n")


def write_all() -> None:
    """Regenerates everything generated from the declarations: the ``TypedDict`` s and the collectors' docs."""
    write_option_types()
    for collector in collectors():
        write_keyword_args(collector)
