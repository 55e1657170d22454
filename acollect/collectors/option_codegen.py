"""Generates :mod:`acollect.collectors.option_types` (the ``TypedDict`` s of ``**options``) from the declarations.

Each option is declared once, in :mod:`acollect.collectors.options`; mypy needs ``TypedDict`` s to check
the keywords a constructor is given, and this module writes them from the declared fields, so that the
two never disagree (``tests/test_options.py`` fails when the checked-in module is stale).

Examples:
    >>> "frames_per_batch: Required[int]" in typed_options_source()
    True
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

from acollect.collectors.options import InProcessSettings, ProcessSettings, RolloutSettings, WorkerSettings

__all__ = ["typed_options_source", "write_option_types"]


#: The generated ``TypedDict`` s, in order: (name, settings class, base TypedDict or None).
_TYPED: tuple[tuple[str, type[RolloutSettings], str | None, str], ...] = (
    ("RolloutOptions", RolloutSettings, None, "The keyword options every collector takes."),
    ("InProcessOptions", InProcessSettings, "RolloutOptions", "The options of the in-process ``Collector``."),
    ("ProcessOptions", ProcessSettings, "RolloutOptions",
     "The options of collectors whose envs run in worker processes, but for ``num_workers``."),
    ("WorkerOptions", WorkerSettings, "ProcessOptions", "The options of the multi-process collectors."),
)  # fmt: skip

_TYPED_HEADER = '''"""The collectors' ``**options`` as ``TypedDict`` s, for mypy, generated from their declarations.

Do not edit: each option is declared once, in :mod:`acollect.collectors.options`. After changing a
declaration, regenerate this module:
``python -c "from acollect.collectors.option_codegen import write_option_types; write_option_types()"``.
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

__all__ = ["Devices", "InProcessOptions", "ProcessOptions", "RolloutOptions", "WorkerOptions"]

Devices = DeviceLike | Sequence[DeviceLike]
"""One device, or (multi-process collectors) a list with one per worker."""
'''


def typed_options_source() -> str:
    """The source of :mod:`acollect.collectors.option_types`, generated from the declarations above."""
    parts = [_TYPED_HEADER]
    for name, settings, base, doc in _TYPED:
        own = {f.name for f in fields(settings)}
        inherited = {f.name for f in fields(settings.__mro__[1])} if base is not None else set()
        lines = [f"\n\nclass {name}({base or 'TypedDict'}, total=False):", f'    """{doc}"""']
        for f in fields(settings):
            if f.name not in own - inherited:
                continue
            kind = f.metadata.get("accepts") or str(f.type)
            if f.default is MISSING and f.default_factory is MISSING:
                kind = f"Required[{kind}]"
            lines += ["", f"    #: {f.metadata['doc']}", f"    {f.name}: {kind}"]
        parts.append("\n".join(lines) + "\n")
    return "".join(parts)


def write_option_types() -> None:
    """Regenerates :mod:`acollect.collectors.option_types` from the declarations (after changing one)."""
    Path(__file__).with_name("option_types.py").write_text(typed_options_source())
