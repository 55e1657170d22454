"""MkDocs hook: renders the options reference (``docs/options.md``) from the option declarations.

Each option is declared once, with its type, default, check and doc, in ``acollect.collectors._options`` and
``acollect.collectors._collector_settings``; each collector's signature names the keywords it takes. This hook
writes, where ``options.md`` holds the marker ``<!-- options -->``, one entry per option (in the class that
declares it): its type as callers pass it, its doc, its default, and the collectors whose signature takes it
(with their own default where it differs). Nothing is written to disk: the page is built with the site.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import MISSING, Field, fields
from typing import Any

MARKER = "<!-- options -->"


def _default(f: Field[Any]) -> Any:
    if f.default_factory is not MISSING:
        return None  # (a mutable default: None in the signatures, made empty by the check)
    return f.default


def _show(value: Any) -> str:
    return f"`{type(value).__name__}.{value.name}`" if isinstance(value, enum.Enum) else f"`{value!r}`"


def render() -> str:
    """The options reference, as Markdown."""
    import acollect
    from acollect.collectors._base import CollectorBase
    from acollect.collectors._collector_settings import (
        BatchedSettings,
        DistributedSettings,
        ModeSettings,
        MultiAsyncSettings,
        MultiSyncSettings,
        RaySettings,
    )
    from acollect.collectors._options import InProcessSettings, ProcessSettings, RolloutSettings, WorkerSettings

    collectors = sorted(
        (c for c in (getattr(acollect, n) for n in acollect.__all__) if isinstance(c, type)
         and issubclass(c, CollectorBase) and c is not CollectorBase),
        key=lambda c: c.__name__,
    )  # fmt: skip
    signatures = {c.__name__: inspect.signature(c).parameters for c in collectors}
    groups = [
        (RolloutSettings, "Every collector"),
        (InProcessSettings, "`Collector` (in this process)"),
        (ProcessSettings, "Every collector with worker processes"),
        (WorkerSettings, "The collectors that start their own workers"),
        (MultiSyncSettings, "Lockstep batches (`sync=True`)"),
        (MultiAsyncSettings, "First ready, first served (`sync=False`)"),
        (BatchedSettings, "`AsyncBatchedCollector`: the inference server"),
        (ModeSettings, "A collector with a mode (`DistributedCollector`, `RayCollector`)"),
        (DistributedSettings, "`DistributedCollector` and `DistributedSyncCollector`: torch.distributed"),
        (RaySettings, "`RayCollector`: Ray actors, TorchRL's arguments"),
    ]
    lines: list[str] = []
    seen: set[str] = set()  # (a class may take an inherited option anew, with another default: said once)
    for settings, title in groups:
        own = [
            f for f in fields(settings) if f.name in vars(settings).get("__annotations__", {}) and f.name not in seen
        ]
        seen |= {f.name for f in own}
        if not own:
            continue
        lines += [f"## {title}", ""]
        for f in own:
            accepts = f.metadata.get("accepts") or f.type
            default = _default(f)
            takers = [name for name, params in signatures.items() if f.name in params]
            own_defaults = [
                f"{name}: {_show(signatures[name][f.name].default)}"
                for name in takers
                if f.name != "frames_per_batch" and signatures[name][f.name].default != default
            ]
            said = "required" if default is MISSING else f"default {_show(default)}"
            if own_defaults:
                said += f" ({'; '.join(own_defaults)})"
            who = "every collector" if len(takers) == len(signatures) else ", ".join(f"`{n}`" for n in takers)
            lines += [f"### `{f.name}`", "", f"`{accepts}`, {said}; taken by {who}.", "", f.metadata["doc"], ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs' hook: the page with the marker gets the reference in its place."""
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown
