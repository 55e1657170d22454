"""Pickling user code for another process: cloudpickle, keeping the file names of functions pickled by value.

cloudpickle (3.x) pickles a function that cannot be imported by name (a lambda, a function of ``__main__``
or of a test file) by value, code object and all, and swaps the code's ``co_filename`` for
``"<dynamic-code>"`` (its payloads then do not depend on where a function was defined). A traceback
from such a function in a worker then reads ``File "<dynamic-code>", line 7, in <lambda>``: the line is
right and the file is lost. :func:`cloudpickle_dumps` is ``cloudpickle.dumps`` with the file name kept,
and every place acollect sends user code to another process calls it.

Examples:
    >>> import pickle
    >>> make = lambda: 1
    >>> pickle.loads(cloudpickle_dumps(make)).__code__.co_filename == make.__code__.co_filename
    True
"""

from __future__ import annotations

import io
import types
from collections import ChainMap
from typing import Any, ClassVar

import cloudpickle

__all__ = ["FileNamePickler", "cloudpickle_dumps"]

#: What cloudpickle writes in place of a code object's file name.
_DYNAMIC_CODE = "<dynamic-code>"

# cloudpickle's own reducer for code objects: its result is changed, never rebuilt, so that every other
# field (which differs across Python versions) stays exactly as cloudpickle writes it.
_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_reduce_keeping_filename(code: types.CodeType) -> Any:
    constructor, args = _cloudpickle_code_reduce(code)
    # The file name's place among CodeType's arguments differs across Python versions (3.10: 11th of 16,
    # 3.11+: 11th of 18, and may move again): find it by the placeholder cloudpickle put there.
    slots = [i for i, arg in enumerate(args) if isinstance(arg, str) and arg == _DYNAMIC_CODE]
    if len(slots) != 1:  # not the layout this was written for: cloudpickle's behaviour, a placeholder name
        return constructor, args
    (i,) = slots
    return constructor, (*args[:i], code.co_filename, *args[i + 1 :])


class FileNamePickler(cloudpickle.Pickler):
    """A ``cloudpickle.Pickler`` whose code objects keep their ``co_filename``.

    Examples:
        >>> import io, pickle
        >>> make = lambda: 1
        >>> out = io.BytesIO()
        >>> FileNamePickler(out).dump(make)
        >>> pickle.loads(out.getvalue()).__code__.co_filename == make.__code__.co_filename != "<dynamic-code>"
        True
    """

    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap(
        {types.CodeType: _code_reduce_keeping_filename}, cloudpickle.Pickler.dispatch_table
    )


def cloudpickle_dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, keeping the file names of the functions and classes it pickles by value.

    Raises:
        Exception: whatever pickling ``obj`` raises (``pickle.PicklingError``, ``TypeError``...): callers
            say which of the user's objects could not be sent.
    """
    with io.BytesIO() as out:
        FileNamePickler(out).dump(obj)
        return out.getvalue()
