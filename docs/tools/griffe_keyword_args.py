"""A Griffe extension: the API page shows each collector's "Keyword Args" as ``help()`` shows them.

A collector's source holds, under "Keyword Args:", only a pointer to its settings class; importing
``acollect.collectors`` puts the section generated from its option declarations in the pointer's place
(``acollect.collectors._option_codegen.add_keyword_args``). Griffe reads the source, not the imported class, so
for each class whose docstring has that section this reads the docstring as Python holds it after import.
mkdocs.yml loads it (``extensions`` of the python handler).
"""

from __future__ import annotations

import inspect
from typing import Any

import griffe

_HEADER = "Keyword Args:"


class KeywordArgsAsImported(griffe.Extension):
    """Gives a class whose docstring has a "Keyword Args" section the docstring its imported class holds."""

    def on_class_instance(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        if cls.docstring is None or _HEADER not in cls.docstring.value.splitlines():
            return
        imported = griffe.dynamic_import(cls.path)
        cls.docstring.value = inspect.cleandoc(imported.__doc__ or "")
