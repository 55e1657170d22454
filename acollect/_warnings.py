"""acollect's own warnings, attributed to the line of user code that led to them.

A fixed ``stacklevel`` is wrong as soon as the same check is reached through a
different number of acollect frames (``Collector`` and ``MultiSyncCollector``
call the shared checks from different depths), and a warning raised in a
collection thread has no user frame above it at all. :func:`warn` therefore
walks the stack to the first frame outside the acollect package. In a thread
started by :func:`acollect._runtime.threads.run_in_thread` it does not warn there: it
keeps the warning, and the awaiting task emits it when the thread is done, so
that it points at the ``async with`` / ``async for`` line that waited for it.
(``warnings.catch_warnings`` cannot do this: it swaps process-wide state, and
would capture or lose the warnings of every other thread meanwhile.)
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
import types
import warnings

__all__ = ["ActionSpaceWarning", "KeptWarnings", "emit", "warn", "warn_unclosed"]


class ActionSpaceWarning(UserWarning):
    """A policy's continuous actions left the env's action space (said once per env; what is stored is unchanged).

    A discrete action outside its space is an error (:class:`~acollect.errors.PolicyError`): gymnasium refuses it.
    A continuous one is the env's to clip or not, and a Gaussian policy's samples leave their bounds by design, so
    it is stored as the policy wrote it and said once, as this warning.
    """


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_local = threading.local()


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside acollect, as seen from :func:`warn`'s caller's call."""
    frame = sys._getframe(2)  # the caller of warn() or emit()
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Warns, pointing at the user's line (or keeps it for the awaiting task, in a collection thread)."""
    kept: list[tuple[str, type[Warning]]] | None = getattr(_local, "kept", None)
    if kept is not None:
        kept.append((message, category))
        return
    warnings.warn(message, category, stacklevel=_user_stacklevel())


def emit(kept: list[tuple[str, type[Warning]]]) -> None:
    """Emits warnings kept in a thread, from the task that awaited it (pointing at the user's line)."""
    for message, category in kept:
        warnings.warn(message, category, stacklevel=_user_stacklevel())


class KeptWarnings:
    """In the current thread, keeps what :func:`warn` is given in ``self.kept`` instead of warning."""

    def __init__(self) -> None:
        self.kept: list[tuple[str, type[Warning]]] = []

    def __enter__(self) -> list[tuple[str, type[Warning]]]:
        _local.kept = self.kept
        return self.kept

    def __exit__(self, *exc_info: object) -> None:
        _local.kept = None


def warn_unclosed(source: object, message: str) -> None:
    """A :class:`ResourceWarning` that ``source`` was left open, as asyncio gives for an unclosed transport.

    Never raises: where the warnings filter turns it into an error, the error goes to
    :func:`sys.unraisablehook`, as one raised in a finalizer does (it is called from finalizers and from a task
    the event loop is cancelling, where an exception would replace what must happen next).
    """
    try:
        warnings.warn(message, ResourceWarning, stacklevel=2, source=source)
    except Warning as exc:
        if sys.unraisablehook is sys.__unraisablehook__:
            # Python's own hook takes only its UnraisableHookArgs, which Python code cannot make: say what it says.
            lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
            sys.stderr.write(f"Exception ignored in: {source!r}\n{''.join(lines)}")
            return
        sys.unraisablehook(
            types.SimpleNamespace(
                exc_type=type(exc), exc_value=exc, exc_traceback=exc.__traceback__, err_msg=None, object=source
            )
        )
