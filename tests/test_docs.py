"""Every ``python`` code block in README.md and docs/*.md runs as written.

Blocks run one by one, each in a fresh namespace, from a scratch directory. A block with
top-level ``await``/``async for``/``async with`` is compiled as a coroutine and driven by
``asyncio.run``, exactly as a reader would paste it into ``python -m asyncio``. A block
preceded by the line ``<!-- skip -->`` is shown but not run (e.g. one that needs a GPU or Ray);
one preceded by ``<!-- requires: envpool -->`` (modules separated by commas) runs where those
modules import and is skipped elsewhere (an optional extra's env source).

The README's test set-up command is also checked against ``.ci/run`` so the two never drift.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
SKIP_MARKER = "<!-- skip -->"
_REQUIRES = re.compile(r"^<!-- requires: (?P<modules>[\w., ]+) -->$")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)$")


@dataclass(frozen=True)
class CodeBlock:
    """One fenced code block: where it is, its language and its text."""

    path: str
    line: int
    language: str
    source: str
    skip: bool
    requires: tuple[str, ...] = ()


def extract_blocks(text: str, path: str = "<string>") -> list[CodeBlock]:
    """Returns the fenced code blocks of a markdown text, in order.

    A block counts as skipped when the last non-blank line before its opening fence is
    ``<!-- skip -->``, and requires the modules that line names when it is
    ``<!-- requires: a, b -->``. Indented fences (inside lists or admonitions) are dedented.
    """
    blocks: list[CodeBlock] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, language = match["indent"], match["info"].strip().split(" ")[0].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        previous = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
        needs = _REQUIRES.match(previous)
        requires = tuple(m.strip() for m in needs["modules"].split(",")) if needs else ()
        source = "\n".join(body) + "\n"
        blocks.append(CodeBlock(path, start + 1, language, source, previous == SKIP_MARKER, requires))
        i += 1
    return blocks


def run_block(block: CodeBlock) -> dict[str, object]:
    """Runs one python block in a fresh namespace and returns that namespace."""
    namespace: dict[str, object] = {"__name__": "__docs__"}
    code = compile(block.source, f"{block.path}:{block.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        coroutine = eval(code, namespace)
        asyncio.run(coroutine)
    else:
        exec(code, namespace)
    return namespace


def _python_blocks() -> list[CodeBlock]:
    found = []
    for doc in DOC_FILES:
        relative = doc.relative_to(ROOT).as_posix()
        found.extend(b for b in extract_blocks(doc.read_text(encoding="utf-8"), relative) if b.language == "python")
    return found


def _block_id(block: CodeBlock) -> str:
    index = [b for b in _python_blocks() if b.path == block.path].index(block)
    return f"{block.path}:{index}"


PYTHON_BLOCKS = _python_blocks()


@pytest.mark.parametrize(
    "block",
    # A block that needs torchrl runs with the other torchrl tests (`-m torchrl`, CI's interop step).
    [pytest.param(b, marks=[pytest.mark.torchrl] if "torchrl" in b.requires else []) for b in PYTHON_BLOCKS],
    ids=[_block_id(b) for b in PYTHON_BLOCKS],
)
def test_doc_block_runs(block: CodeBlock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.skip:
        pytest.skip(f"{block.path}:{block.line} is marked {SKIP_MARKER}")
    for module in block.requires:
        pytest.importorskip(module, reason=f"{block.path}:{block.line} requires {module}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    # Warning-free as written, whatever the pytest configuration says: a reader's copy prints nothing else.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_block(block)


def test_harness_runs_sync_and_async_blocks_and_honours_skip() -> None:
    text = (
        "Intro.\n\n"
        "```python\nx = 1 + 1\n```\n\n"
        "```python\n"
        "async def agen():\n    yield 1\n    yield 2\n\n"
        "result = 0\nasync for i in agen():\n    result += i\n"
        "```\n\n"
        "<!-- skip -->\n\n"
        "```python\nraise SystemExit('must not run')\n```\n\n"
        "- a list item:\n\n"
        "    ```bash\n    echo hi\n    ```\n\n"
        "<!-- requires: envpool, ale_py -->\n"
        "```python\nimport envpool\n```\n"
    )
    blocks = extract_blocks(text)
    assert [(b.language, b.skip, b.requires) for b in blocks] == [
        ("python", False, ()),
        ("python", False, ()),
        ("python", True, ()),
        ("bash", False, ()),
        ("python", False, ("envpool", "ale_py")),
    ]
    assert run_block(blocks[0])["x"] == 2
    assert run_block(blocks[1])["result"] == 3
    assert blocks[3].source == "echo hi\n"
    with pytest.raises(ZeroDivisionError):
        run_block(CodeBlock("<t>", 1, "python", "async def f():\n    return 1 / 0\nawait f()\n", False))


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    blocks = extract_blocks((ROOT / "README.md").read_text(encoding="utf-8"), "README.md")
    shell = [b for b in blocks if b.language in {"bash", "sh", "shell", "console"}]
    assert len(shell) == 2, f"README.md must show exactly two set-up commands, found {len(shell)}"
    assert all(len(b.source.strip().splitlines()) == 1 for b in shell), "each set-up command is one line"
    run_main, run_tests = (b.source.strip() for b in shell)
    assert "python examples/quickstart.py" in run_main
    assert run_tests.endswith("pytest")
    assert run_tests in (ROOT / ".ci" / "run").read_text(encoding="utf-8"), ".ci/run must run the README's test command"
