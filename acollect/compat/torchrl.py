"""TorchRL's collector names, for code written against TorchRL: ``RPCCollector`` and the legacy spellings.

acollect's own names are :class:`~acollect.Collector`, :class:`~acollect.MultiSyncCollector`,
:class:`~acollect.MultiAsyncCollector`, :class:`~acollect.AsyncCollector`,
:class:`~acollect.CollectorBase`, :class:`~acollect.DistributedCollector`,
:class:`~acollect.DistributedSyncCollector` and :class:`~acollect.RayCollector`. This module holds
what TorchRL calls them besides, so that ``from acollect import MultiSyncDataCollector`` keeps
working (the package re-exports every name here, outside its ``__all__``):

* the legacy aliases (``SyncDataCollector``, ``MultiSyncDataCollector``, ``MultiaSyncDataCollector``,
  ``aSyncDataCollector``, ``DataCollectorBase``, ``BaseCollector``, ``DistributedDataCollector``,
  ``DistributedSyncDataCollector``, ``RPCDataCollector``). Each is the acollect class itself, not a
  subclass, so ``isinstance`` checks and docs agree;
* :func:`RPCCollector`, which takes TorchRL's ``RPCDataCollector`` arguments. TorchRL drives remote
  collectors with ``torch.distributed.rpc``; here the remote side is a worker process (local, or
  wherever the launcher puts it) driven over ZeroMQ: the same commands (collect, push weights, seed,
  stop), with heartbeats and deadlines. So it is not a new engine: it translates the arguments and
  returns a :class:`~acollect.MultiAsyncCollector` (``sync=False``, the default) or a
  :class:`~acollect.MultiSyncCollector` (``sync=True``). The mapping, argument by argument, is in
  ``docs/distributed.md``.

The arguments are TorchRL's where the concepts match: see ``docs/migrating-from-torchrl.md``.

Examples:
    >>> from acollect import MultiSyncCollector
    >>> from acollect.compat.torchrl import MultiSyncDataCollector
    >>> MultiSyncDataCollector is MultiSyncCollector
    True
    >>> import anyio
    >>> from acollect.compat.torchrl import RPCCollector
    >>> from acollect.testing import CountingEnv
    >>> async def main():
    ...     async with RPCCollector([CountingEnv] * 2, frames_per_batch=8, total_frames=16, sync=True) as c:
    ...         return type(c).__name__, [tuple(b.shape) async for b in c]
    >>> anyio.run(main)
    ('MultiSyncCollector', [(2, 1, 4), (2, 1, 4)])
"""

from __future__ import annotations

from typing import Any

from acollect._policy import PolicyLike
from acollect.collectors import (
    AsyncCollector,
    Collector,
    CollectorBase,
    DistributedCollector,
    DistributedSyncCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
)
from acollect.errors import ConfigurationError

__all__ = [
    "BaseCollector",
    "DataCollectorBase",
    "DistributedDataCollector",
    "DistributedSyncDataCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "RPCCollector",
    "RPCDataCollector",
    "SyncDataCollector",
    "aSyncDataCollector",
]

# TorchRL sub-collector names that mean "one rollout loop per remote process", which is what a worker runs.
_SINGLE = {"SyncDataCollector", "Collector"}


def _check_collector_class(collector_class: Any) -> None:
    if collector_class is None or collector_class in ("single", "sync"):
        return
    name = collector_class if isinstance(collector_class, str) else getattr(collector_class, "__name__", None)
    if name not in _SINGLE:
        raise ConfigurationError.bad_value(
            "collector_class",
            collector_class,
            "None, 'single' or a Collector/SyncDataCollector class: each acollect worker runs one rollout "
            "engine (vectorize inside it with env_kwargs={'num_envs': N})",
        )


def RPCCollector(  # TorchRL's class name: code written against it calls it
    create_env_fn: Any,
    policy: PolicyLike = None,
    *,
    collector_class: Any = None,
    num_workers_per_collector: int = 1,
    sync: bool = False,
    max_weight_update_interval: int | None = None,
    tcp_port: int | None = None,
    visible_devices: Any = None,
    tensorpipe_options: Any = None,
    **kwargs: Any,
) -> MultiSyncCollector | MultiAsyncCollector:
    """Builds a multi-process collector from ``RPCDataCollector``'s arguments (see the module docs).

    A plain factory function, and acollect's only one: every collector class takes its mode in
    ``__init__`` (``DistributedCollector(sync=...)``, ``RayCollector(sync=...)``) and none picks a class in
    ``__new__``. This one stays a function because it only translates TorchRL's arguments: what it returns
    is exactly the public class they call for, :class:`~acollect.MultiSyncCollector` or
    :class:`~acollect.MultiAsyncCollector`, with nothing of its own added, so ``type()``, ``isinstance`` and
    the docs of the collector in hand all agree.

    Args:
        create_env_fn: one env factory per remote collector (a list), or one for ``num_workers``.
        policy: the policy (sent to every worker).
        collector_class: what each remote collector runs: ``None``/``"single"``/``SyncDataCollector`` (one
            rollout engine per worker); other classes are refused with the reason.
        num_workers_per_collector: must be 1 (vectorize within a worker with ``env_kwargs={"num_envs": N}``).
        sync: ``True``: lockstep batches (:class:`~acollect.MultiSyncCollector`); ``False``: first ready, first
            served (:class:`~acollect.MultiAsyncCollector`).
        max_weight_update_interval: as acollect's; TorchRL's ``-1`` (never) becomes ``None``.
        tcp_port: the collector's endpoint listens on ``tcp://127.0.0.1:<tcp_port>`` (unless ``address`` is given).
        visible_devices: only ``None`` (workers pick devices from ``device``/``collector_kwargs``).
        tensorpipe_options: only ``None`` (there is no tensorpipe: transport options are acollect's own).
        **kwargs: every other keyword of the multi-process collectors (``frames_per_batch``, ``total_frames``,
            ``policy_factory``, devices, ``collector_kwargs``, ``update_after_each_batch``, ``launcher``...).

    Returns:
        The collector: a :class:`~acollect.MultiAsyncCollector` or a :class:`~acollect.MultiSyncCollector`.

    Raises:
        ConfigurationError: an argument acollect has no equivalent for (the message says what to use).
    """
    _check_collector_class(collector_class)
    if num_workers_per_collector != 1:
        raise ConfigurationError.bad_value(
            "num_workers_per_collector",
            num_workers_per_collector,
            "1: use more workers (a longer create_env_fn list), or env_kwargs={'num_envs': N} in each",
        )
    for name, value in (("visible_devices", visible_devices), ("tensorpipe_options", tensorpipe_options)):
        if value is not None:
            raise ConfigurationError.bad_value(
                name, value, "None (no torch.distributed.rpc here: devices come from device/collector_kwargs)"
            )
    if not isinstance(sync, bool):
        raise ConfigurationError.bad_value("sync", sync, "True or False")
    if max_weight_update_interval is not None and max_weight_update_interval < 0:
        max_weight_update_interval = None  # TorchRL's "never"
    if tcp_port is not None:
        if isinstance(tcp_port, bool) or not isinstance(tcp_port, int) or not 0 < tcp_port < 65536:
            raise ConfigurationError.bad_value("tcp_port", tcp_port, "None or a port number in 1..65535")
        kwargs.setdefault("address", f"tcp://127.0.0.1:{tcp_port}")
    target = MultiSyncCollector if sync else MultiAsyncCollector
    return target(create_env_fn, policy, max_weight_update_interval=max_weight_update_interval, **kwargs)


# -- the legacy spellings -------------------------------------------------------------------
#: TorchRL's legacy name of :class:`~acollect.Collector` (one process, in-process collection).
SyncDataCollector = Collector
#: TorchRL's legacy name of :class:`~acollect.MultiSyncCollector`.
MultiSyncDataCollector = MultiSyncCollector
#: TorchRL's legacy name of :class:`~acollect.MultiAsyncCollector`.
MultiaSyncDataCollector = MultiAsyncCollector
#: TorchRL's legacy name of :class:`~acollect.AsyncCollector`.
aSyncDataCollector = AsyncCollector
#: TorchRL's name of the base every collector derives from (:class:`~acollect.CollectorBase`).
DataCollectorBase = CollectorBase
#: TorchRL's newer name of that base.
BaseCollector = CollectorBase
# RayCollector and submitit_delayed_launcher keep TorchRL's names as they are (acollect.RayCollector,
# acollect.submitit_delayed_launcher): they are acollect's own names too.
#: TorchRL's legacy name of :class:`~acollect.DistributedCollector`.
DistributedDataCollector = DistributedCollector
#: TorchRL's legacy name of :class:`~acollect.DistributedSyncCollector`.
DistributedSyncDataCollector = DistributedSyncCollector
#: TorchRL's legacy name of :func:`RPCCollector`.
RPCDataCollector = RPCCollector
