"""``acollect info``: what this machine offers acollect.

Versions of acollect and its dependencies, CPU cores (and the workers a multi-process
collector starts by default), torch's thread counts, CUDA devices, multiprocessing start
methods, the transports that work here (ZeroMQ ``ipc`` and ``tcp``, shared memory in
``/dev/shm``, CURVE encryption) and which optional extras are installed. Paste its output
into a bug report.

torch's intra-op threads matter to the in-process ``Collector``: its thread runs the policy with
the caller's count, and with more than one, a small network's every op waits for a second thread
that another busy process (a trainer, another job) keeps off its core. The report says so, with
the fix (``torch.set_num_threads(1)``), wherever torch would use more than one.

Examples:
    >>> report = collect_info()
    >>> sorted(report)
    ['cpu', 'cuda', 'extras', 'multiprocessing', 'platform', 'transports', 'versions']
    >>> (report["cpu"]["advice"] is None) == (report["cpu"]["torch_threads"] == 1)
    True
    >>> report["transports"]["tcp"]
    True
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import multiprocessing
import os
import platform
import shutil
import sys
from typing import Any

__all__ = ["add_parser", "collect_info", "format_info", "run"]

# Distribution name -> import name, for the packages acollect depends on.
_DEPENDENCIES = {
    "torch": "torch",
    "tensordict": "tensordict",
    "gymnasium": "gymnasium",
    "pyzmq": "zmq",
    "anyio": "anyio",
    "numpy": "numpy",
    "msgpack": "msgpack",
    "cloudpickle": "cloudpickle",
    "psutil": "psutil",
}
# Optional extra -> the distributions it brings: every extra of pyproject.toml (tests/test_cli.py checks it).
_EXTRAS = {
    "progress": ["tqdm"],
    "torchrl": ["torchrl"],
    "ray": ["ray"],
    "submitit": ["submitit"],
    "envpool": ["envpool"],
    "atari": ["ale-py"],
    "mujoco": ["gymnasium"],  # gymnasium[mujoco]: the distribution as the requirement names it
    "examples": ["tyro", "aiohttp"],
    "docs": ["mkdocs", "mkdocs-material", "mkdocstrings"],
    "dev": [
        "pytest",
        "pytest-asyncio",
        "pytest-timeout",
        "trio",
        "hypothesis",
        "ruff",
        "mypy",
        "mkdocs",
        "mkdocs-material",
        "mkdocstrings",
        "tyro",
        "tqdm",
        "aiohttp",
        "ale-py",
        "envpool",
        "mutmut",
        "pettingzoo",
        "mpe2",
    ],
    "marl": ["torchrl", "vmas", "pettingzoo", "mpe2"],
    "pettingzoo": ["pettingzoo", "mpe2"],
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``acollect info``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "info",
        help="versions, cores, CUDA, start methods and transports of this machine",
        description=(
            "Prints the versions of acollect and its dependencies, CPU cores, CUDA devices, multiprocessing start "
            "methods, the transports that work here (ZeroMQ ipc and tcp, shared memory in /dev/shm, CURVE "
            "encryption) and which optional extras are installed. Paste it into a bug report."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=run)
    return parser


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


#: Said where torch would run more than one intra-op thread (measured in docs/performance.md).
THREADS_ADVICE = (
    "an in-process Collector runs its policy with the caller's torch threads: beside a trainer or another busy "
    "process, torch.set_num_threads(1) keeps it fast and steady (docs/performance.md#torch-threads-and-the-in-process-"
    "collector)"
)


def _cpu() -> dict[str, Any]:
    import psutil
    import torch

    from acollect._affinity import usable_cores
    from acollect.collectors._worker_configs import default_num_workers

    threads = torch.get_num_threads()
    return {
        "logical": os.cpu_count(),
        "physical": psutil.cpu_count(logical=False),
        "usable_by_this_process": len(usable_cores()),
        "default_num_workers": default_num_workers(),
        "torch_threads": threads,
        "torch_interop_threads": torch.get_num_interop_threads(),
        "advice": THREADS_ADVICE if threads > 1 else None,
    }


def _cuda() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "torch_cuda": torch.version.cuda, "devices": []}
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)})
    return {"available": True, "torch_cuda": torch.version.cuda, "devices": devices}


def _transports() -> dict[str, Any]:
    from acollect._batches.shm import SHM_DIR, shm_available
    from acollect._runtime.sockets import features

    shm: dict[str, Any] = {"available": shm_available(), "path": SHM_DIR}
    if shm["available"]:
        shm["free_gib"] = round(shutil.disk_usage(SHM_DIR).free / 2**30, 2)
    zmq = features()
    return {"ipc": zmq["ipc"], "tcp": True, "shm": shm, "curve": zmq["curve"], "libzmq": zmq["libzmq"]}


def _multiprocessing() -> dict[str, Any]:
    from acollect._workers.process import DEFAULT_START_METHOD, START_METHODS

    available = multiprocessing.get_all_start_methods()
    return {
        "available": available,
        "acollect_supports": [m for m in START_METHODS if m in available],
        "acollect_default": DEFAULT_START_METHOD,
    }


def collect_info() -> dict[str, Any]:
    """The report as a dict (what ``acollect info --json`` prints)."""
    import acollect

    versions: dict[str, str | None] = {"acollect": acollect.__version__, "python": platform.python_version()}
    for distribution, module in _DEPENDENCIES.items():
        versions[distribution] = _version(distribution) or getattr(importlib.import_module(module), "__version__", None)
    extras = {extra: {name: _version(name) for name in names} for extra, names in _EXTRAS.items()}
    return {
        "versions": versions,
        "platform": {"system": platform.platform(), "machine": platform.machine(), "executable": sys.executable},
        "cpu": _cpu(),
        "cuda": _cuda(),
        "multiprocessing": _multiprocessing(),
        "transports": _transports(),
        "extras": extras,
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _start_methods(mp: dict[str, Any]) -> str:
    """What this machine offers, and which of it acollect's workers use: the default, how to choose another."""
    default = mp["acollect_default"]
    choices = [f"{m} with start_method={m!r}" for m in mp["acollect_supports"] if m != default]
    used = ", ".join([f"{default} by default", *choices])
    never = [m for m in mp["available"] if m not in mp["acollect_supports"]]
    text = f"{', '.join(mp['available'])}; acollect workers use {used}"
    return text + (f"; never {', '.join(never)}" if never else "")


def _workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def format_info(report: dict[str, Any]) -> str:
    """The report as aligned text."""
    rows: list[tuple[str, str]] = []
    rows += [(name, version or "not installed") for name, version in report["versions"].items()]
    rows.append(("platform", report["platform"]["system"]))
    cpu = report["cpu"]
    usable = cpu["usable_by_this_process"]
    cores = f"{cpu['logical']} logical, {cpu['physical']} physical, {usable} usable here"
    workers = (
        f"multi-process collectors start {_workers(cpu['default_num_workers'])} by default (the trainer keeps a core)"
    )
    rows.append(("cpu cores", f"{cores}; {workers}"))
    threads = f"{cpu['torch_threads']} intra-op, {cpu['torch_interop_threads']} inter-op"
    rows.append(("torch threads", threads + (f": {cpu['advice']}" if cpu["advice"] else "")))
    cuda = report["cuda"]
    if cuda["available"]:
        names = ", ".join(f"{d['index']}: {d['name']} ({d['memory_gib']} GiB)" for d in cuda["devices"])
        rows.append(("cuda", f"yes (CUDA {cuda['torch_cuda']}): {names}"))
    else:
        built = f" (torch built for CUDA {cuda['torch_cuda']})" if cuda["torch_cuda"] else " (CPU-only torch)"
        rows.append(("cuda", "no" + built))
    rows.append(("start methods", _start_methods(report["multiprocessing"])))
    tr = report["transports"]
    shm = tr["shm"]
    shm_text = f"yes ({shm['path']}, {shm['free_gib']} GiB free)" if shm["available"] else f"no ({shm['path']})"
    rows += [
        ("transport ipc", _yes(tr["ipc"])),
        ("transport tcp", _yes(tr["tcp"])),
        ("shared memory", shm_text),
        ("CURVE (zmq)", _yes(tr["curve"]) + f" (libzmq {tr['libzmq']})"),
    ]
    for extra, packages in report["extras"].items():
        installed = [f"{name} {version}" for name, version in packages.items() if version]
        missing = [name for name, version in packages.items() if not version]
        text = ", ".join(installed) if installed else "not installed"
        if installed and missing:
            text += f" (missing {', '.join(missing)})"
        rows.append((f"extra [{extra}]", text))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def run(args: argparse.Namespace) -> int:
    """Prints the report."""
    report = collect_info()
    print(json.dumps(report, indent=2) if args.json else format_info(report))
    return 0
