"""User code sent to another process keeps its file name (acollect._pickling): its tracebacks name the file."""

from __future__ import annotations

import pickle
import traceback
from typing import Any

import pytest

from acollect._pickling import cloudpickle_dumps
from acollect._rollout.spec import RolloutSpec
from acollect._runtime.spawn import pickle_payload
from acollect._workers.config_codec import decode_config, encode_config
from acollect._workers.protocol import WorkerConfig
from acollect.launchers.base import pack_config
from acollect.testing import CountingEnv
from acollect.transport.auth import ClientKeys


def round_trip(obj: Any) -> Any:
    return pickle.loads(cloudpickle_dumps(obj))


def test_a_lambda_keeps_its_file_name() -> None:
    make = round_trip(lambda: 1 / 0)
    assert make.__code__.co_filename == __file__
    with pytest.raises(ZeroDivisionError) as info:
        make()
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert frame.filename == __file__
    assert frame.line == "make = round_trip(lambda: 1 / 0)"  # the file is found, so the line shows too


def test_nested_functions_and_classes_defined_here_keep_it() -> None:
    def outer() -> Any:
        return lambda: 2

    class Env:
        def step(self) -> int:
            return 3

    copied_outer, copied_env = round_trip((outer, Env))
    assert copied_outer.__code__.co_filename == __file__
    assert copied_outer().__code__.co_filename == __file__  # the inner lambda's code, a constant of outer's
    assert copied_env.step.__code__.co_filename == __file__
    assert (copied_outer()(), copied_env().step()) == (2, 3)


def test_code_whose_file_name_cannot_be_placed_pickles_as_cloudpickle_does() -> None:
    # The file name's slot is found by cloudpickle's placeholder; a code object named like the placeholder
    # makes two candidates, and then cloudpickle's own arguments are kept as they are.
    def confusing() -> int:
        return 4

    confusing.__code__ = confusing.__code__.replace(co_name="<dynamic-code>")
    copied = round_trip(confusing)
    assert copied.__code__.co_filename == "<dynamic-code>"
    assert copied() == 4


def unpickle_spawned(config: WorkerConfig) -> WorkerConfig:
    _path, body = pickle.loads(pickle_payload(config, what="a config", hint="-"))
    return pickle.loads(body)


def unpickle_launched(config: WorkerConfig) -> WorkerConfig:
    _path, _host, body = pickle.loads(pack_config(config))
    return pickle.loads(body)


def unpickle_joined(config: WorkerConfig) -> WorkerConfig:
    fields, td = encode_config(config, allow_pickle=True)
    message = {"index": config.index, "generation": config.generation, **fields}  # as the collector replies
    keys = ClientKeys(b"p" * 40, b"s" * 40, b"c" * 40)
    return decode_config(message, td, address="tcp://127.0.0.1:1", keys=keys, allow_pickle=True, authenticated=True)


@pytest.mark.parametrize(
    "unpickle",
    [unpickle_spawned, unpickle_launched, unpickle_joined],
    ids=["local workers and the inference process", "Ray and submitit", "workers started by hand"],
)
def test_every_way_a_worker_config_travels_keeps_the_file_name(unpickle: Any) -> None:
    rollout = RolloutSpec(create_env_fn=lambda: CountingEnv(num_envs=2), frames_per_batch=2)
    address = "tcp://127.0.0.1:1"
    config = WorkerConfig(index=0, generation=0, n_workers=1, address=address, parent_pid=0, rollout=rollout)
    received = unpickle(config).rollout
    assert received.create_env_fn.__code__.co_filename == __file__
    assert received.create_env_fn().num_envs == 2
