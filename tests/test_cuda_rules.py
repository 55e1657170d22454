"""The CUDA rules of docs/architecture.md, checked on the source (no GPU needed).

Every ``non_blocking`` copy, every ``cudaHostRegister`` and every in-place copy of weights into a module (``update_``)
in the package is listed below with what makes it safe:
its synchronisation partner, which must appear in the same function. A new site fails this test until it is
listed with its partner; a listed site that is gone fails it too, so the list stays the truth.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "acollect"

#: (module, function) -> (what the copy or call is, the text of its partner in the same function, why that is enough)
SITES: dict[tuple[str, str], tuple[str, str, str]] = {
    ("_devices.py", "move_to"): (
        "non_blocking only to a device that is not the host",
        'device.type != "cpu"',
        "a copy to an accelerator is ordered before the kernels that read it on the same stream; a copy to the "
        "host is waited for, since the host reads it next",
    ),
    ("inference/_batching.py", "Lane.gather"): (
        "host to device, from this lane's page-locked staging buffer, on the lane's stream",
        "copied.synchronize()",
        "the host writes a staging buffer again only after the event of the last copy out of it completed",
    ),
    ("inference/_batching.py", "Lane.to_host"): (
        "device to host, into page-locked buffers",
        "wait_for_stream(self.stream)",
        "the lane's stream is synchronised before the function returns the host buffers",
    ),
    ("_batches/cuda_dma.py", "DeviceCopier.copy"): (
        "host to device by DMA, from the pool's registered shared memory only",
        "event.record(self.stream)",
        "the consumer's stream waits for the event (hand_over) and the memory goes back to its worker only after "
        "copied() waited for it; any other memory takes the waited-for copy",
    ),
    ("_batches/cuda_dma.py", "DeviceCopier._registered_segment"): (
        "cudaHostRegister of a segment this process created, while it is mapped",
        "segment.before_unmap(self._unregister)",
        "the segment's own close unregisters it (after the copies in flight, on the device it was registered on) "
        "before it unmaps; a refusal raises, naming cuda_dma=False (torch's bindings cannot clear its pending error)",
    ),
    ("_weights/updates.py", "load_weights"): (
        "weights copied into a policy of this process (an in-process collector's, an inference server's) from "
        "tensors another thread wrote (a snapshot the caller's thread made, or the trainer's weights)",
        "wait_ready(ready)",
        "the work queued on the writer's streams (recorded as events when the weights were handed over) is waited "
        "for before the copy, and the copy is synchronised (synchronize_devices) before the next pass, which may "
        "run on another thread's or a lane's stream",
    ),
}


def _is_site(node: ast.AST) -> bool:
    """A call with ``non_blocking=`` anything but ``False``, a call of ``cudaHostRegister``, or an ``update_``
    (weights copied in place into a module: read by other threads' streams)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in ("cudaHostRegister", "update_"):
        return True
    return any(
        k.arg == "non_blocking" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
        for k in node.keywords
    )


def _sites() -> dict[tuple[str, str], str]:
    """Each function of the package holding a non_blocking copy or a cudaHostRegister call, with its source."""
    found: dict[tuple[str, str], str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        module = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(source)
        lines = source.splitlines()
        functions: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                functions += [
                    (f"{node.name}.{f.name}", f)
                    for f in node.body
                    if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                ]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.name, node))
        for name, function in functions:
            if any(_is_site(node) for node in ast.walk(function)):
                found[(module, name)] = "\n".join(lines[function.lineno - 1 : function.end_lineno])
        outside = [
            node.lineno
            for node in ast.walk(tree)
            if _is_site(node) and not any(f.lineno <= node.lineno <= (f.end_lineno or 0) for _, f in functions)
        ]
        assert not outside, f"{module}: CUDA copies or registrations outside a function or method at lines {outside}"
    return found


def test_every_non_blocking_copy_and_host_registration_is_listed_with_its_partner() -> None:
    found = _sites()
    unlisted = sorted(set(found) - set(SITES))
    assert not unlisted, (
        f"non_blocking copies or cudaHostRegister calls not listed in SITES: {unlisted}; a copy to the host is "
        "synchronised before the host reads it, and only memory the pool owns is registered (docs/architecture.md, "
        "'CUDA rules'): list each with its partner and why"
    )
    stale = sorted(set(SITES) - set(found))
    assert not stale, f"listed in SITES but no longer in the package: {stale}"


@pytest.mark.parametrize("site", sorted(SITES), ids=lambda site: f"{site[0]}:{site[1]}")
def test_each_site_holds_its_partner_in_the_same_function(site: tuple[str, str]) -> None:
    source = _sites()[site]
    what, partner, why = SITES[site]
    assert partner in source, f"{site}: {what}: its partner {partner!r} is gone from the function ({why})"


def test_the_scan_finds_a_copy_to_the_host_that_nobody_waits_for() -> None:
    tree = ast.parse("def f(x):\n    y = x.to('cpu', non_blocking=True)\n    z = x.to('cpu', non_blocking=False)\n")
    calls = [node for node in ast.walk(tree) if _is_site(node)]
    assert len(calls) == 1
    assert calls[0].lineno == 2
