"""Weights (:mod:`acollect._weights.updates`, :mod:`acollect._weights.sync`, :mod:`acollect._workers.staging`,
:mod:`acollect._workers.weight_push`): versions, what is staged and when it applies, in which order, and the checks.

Each test kills mutants that ``tools/mutation.py weights`` found alive: queued pushes applied out of order (an older
push overwriting a newer one), a version stamped that is not the one the weights came with, a staged copy that a
later push rewrites, a check that lets a misfit through or names the wrong keys.
"""

from __future__ import annotations

import functools
import re
import subprocess
import threading
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict

from acollect._batches.shm import ShmSegment
from acollect._rollout.blocking import RolloutInterrupted
from acollect._rollout.build import build_engine
from acollect._rollout.spec import RolloutSpec
from acollect._weights.sync import (
    SharedMemWeightSyncScheme,
    ZmqWeightSyncScheme,
    copy_planned,
    flatten_params,
    plan_unflatten,
    read_weights,
    unflatten_into,
)
from acollect._weights.updates import (
    PolicyWeights,
    WeightUpdate,
    as_weights,
    check_push,
    check_weights,
    decode_structure,
    encode_structure,
    load_weights,
    one_source,
    structure_of,
    weights_of,
)
from acollect._workers import protocol as P
from acollect._workers.handles import WorkerHandle
from acollect._workers.pool_events import PoolEvents
from acollect._workers.process import WorkerProcess
from acollect._workers.staging import Staging
from acollect._workers.weight_push import WeightPusher
from acollect.errors import ConfigurationError, ProtocolError, WeightSyncError, WorkerCrashedError
from acollect.testing import CountingEnv, TwoPartProbe, WeightProbe


def leaf_keys(td: TensorDict) -> list[tuple[str, ...]]:
    """``td``'s leaf keys, each a tuple, sorted."""
    return sorted((k,) if isinstance(k, str) else tuple(k) for k in td.keys(include_nested=True, leaves_only=True))


def net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))


# -- the forms of weights, and the structure check ---------------------------------------------------------------
def test_dotted_keys_become_nested_keys_and_nested_ones_stay() -> None:
    state = net().state_dict()
    td = as_weights(state)
    assert sorted(td.keys(include_nested=True, leaves_only=True)) == [
        ("0", "bias"), ("0", "weight"), ("1", "bias"), ("1", "weight")
    ]  # fmt: skip
    assert td["0", "weight"] is state["0.weight"]  # not copied
    nested = TensorDict({"a": {"b": torch.ones(2)}}, batch_size=[])
    assert as_weights(nested) is nested
    flat = {"w": torch.ones(1)}
    assert as_weights(flat)["w"] is flat["w"]


@pytest.mark.parametrize(
    ("weights", "key", "why"),
    [
        ({"a.b": torch.ones(1), "a": {"b": torch.ones(1)}}, "a.b", "name each tensor once"),
        ({"a..b": torch.ones(1)}, "a..b", "name each tensor once"),
        ({"a": torch.ones(1), "a.b": torch.ones(1)}, "a.b", "consistent keys"),
    ],
)
def test_dotted_keys_that_clash_are_refused_naming_the_key(weights: dict[str, Any], key: str, why: str) -> None:
    td = TensorDict(weights, batch_size=[]) if any(isinstance(v, dict) for v in weights.values()) else weights
    with pytest.raises(ConfigurationError, match=rf"^my_weights='{re.escape(key)}' is invalid: expected .*{why}"):
        as_weights(td, "my_weights")


def test_weights_of_another_form_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"^my_weights='list' is invalid: expected an nn.Module, a TensorDict"):
        as_weights([torch.ones(1)], "my_weights")
    with pytest.raises(ConfigurationError, match=r"^policy_or_weights='dict' is invalid"):
        as_weights({"w": 1.0})


def test_one_source_only() -> None:
    assert one_source(policy_or_weights=None, weights=None) is None
    assert one_source(policy_or_weights=None, weights=3) == 3
    message = "update_policy_weights_() takes one source of weights, got policy_or_weights and weights="
    with pytest.raises(ConfigurationError, match=f"^{re.escape(message)}$"):
        one_source(policy_or_weights=1, weights=2)


def update(**given: Any) -> WeightUpdate:
    args: dict[str, Any] = {"policy_or_weights": None, "policy": None, "weights": None, "weights_dict": None,
                            "model_id": "policy", "worker_ids": None, "timeout": 5.0}  # fmt: skip
    args.update(given)
    return WeightUpdate.of(args.pop("policy_or_weights"), **args)


def test_an_update_is_checked_and_says_which_models_it_pushes() -> None:
    module = WeightProbe(1.0)
    plain = update(policy_or_weights=module, worker_ids=[1, 0], timeout=2)
    assert (plain.source, plain.weights_dict, plain.model_id, plain.worker_ids, plain.timeout) == (
        module, None, "policy", (1, 0), 2.0
    )  # fmt: skip
    assert plain.models("default") == {"policy": ("policy_or_weights", module)}
    assert update().models("default") == {"policy": ("policy_or_weights", "default")}
    assert update(policy_or_weights=module).policy_only("default", "one policy") is module
    assert update().policy_only("default", "one policy") == "default"
    by_id = update(weights_dict={"policy.a": 1, "env.b": 2})
    assert by_id.source is None
    assert by_id.models(None) == {"policy.a": ("weights_dict['policy.a']", 1), "env.b": ("weights_dict['env.b']", 2)}
    assert update(model_id="policy.part").models(7) == {"policy.part": ("policy_or_weights", 7)}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"weights_dict": {}}, "weights_dict={} is invalid: expected a non-empty dict model id -> weights."),
        ({"weights_dict": [1]}, "weights_dict=[1] is invalid: expected a non-empty dict model id -> weights."),
        ({"model_id": ""}, "model_id='' is invalid: expected a non-empty str such as 'policy'."),
        ({"model_id": 3}, "model_id=3 is invalid: expected a non-empty str such as 'policy'."),
        ({"worker_ids": "01"}, "worker_ids='01' is invalid: expected None (every worker) or a list of worker ids."),
        ({"worker_ids": 3}, "worker_ids=3 is invalid: expected None (every worker) or a list of worker ids."),
    ],
)
def test_an_update_of_bad_arguments_is_refused_naming_the_argument(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{re.escape(message)}$"):
        update(**given)


def test_an_update_for_one_policy_refuses_workers_and_other_models() -> None:
    with pytest.raises(ConfigurationError, match=r"^worker_ids=\[0\] is invalid: expected None: no workers\.$"):
        update(worker_ids=[0]).policy_only(None, "no workers")
    with pytest.raises(ConfigurationError, match=r"^model_id=\['policy.a'\] is invalid: expected 'policy' only: x\.$"):
        update(model_id="policy.a").policy_only(None, "x")
    with pytest.raises(ConfigurationError, match=r"^weights_dict=\['env', 'policy'\] is invalid"):
        update(weights_dict={"policy": 1, "env": 2}).policy_only(None, "x")


def test_a_structure_travels_through_a_hello_and_back() -> None:
    structure = structure_of(net())
    assert structure == {
        ("0", "weight"): ((3, 2), torch.float32), ("0", "bias"): ((3,), torch.float32),
        ("1", "weight"): ((1, 3), torch.float32), ("1", "bias"): ((1,), torch.float32),
    }  # fmt: skip
    encoded = encode_structure(net())
    assert encoded == [[["0", "weight"], [3, 2], "float32"], [["0", "bias"], [3], "float32"],
                       [["1", "weight"], [1, 3], "float32"], [["1", "bias"], [1], "float32"]]  # fmt: skip
    assert decode_structure(encoded) == structure
    assert decode_structure(None) is None
    assert structure_of("not weights") == {}
    assert structure_of(TensorDict({"x": torch.zeros(2, dtype=torch.int8)}, [])) == {("x",): ((2,), torch.int8)}


def test_a_structure_too_large_for_a_header_is_not_sent() -> None:
    # 16 bytes a key, 8 a dim, each part's length and 2: up to 1 << 18 bytes in all
    assert encode_structure({"k" * ((1 << 18) - 26): torch.zeros(1)}) is not None
    assert encode_structure({"k" * ((1 << 18) - 25): torch.zeros(1)}) is None
    assert encode_structure({"k" * ((1 << 18) - 34): torch.zeros(1, 1)}) is not None
    assert encode_structure({"k" * ((1 << 18) - 33): torch.zeros(1, 1)}) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"a": 1}, "weights structure is a dict, expected a list"),
        ([[["a"], [1]]], "weights structure entry [['a'], [1]] is not [key, shape, dtype]"),
        (["abc"], "weights structure entry 'abc' is not [key, shape, dtype]"),
        ([[[], [1], "float32"]], "weights structure key [] is not a non-empty list of str"),
        ([[["a", 1], [1], "float32"]], "weights structure key ['a', 1] is not a non-empty list of str"),
        ([["a", [1], "float32"]], "weights structure key 'a' is not a non-empty list of str"),
        ([[["a"], [-1], "float32"]], "weights structure shape [-1] is not a list of ints >= 0"),
        ([[["a"], [True], "float32"]], "weights structure shape [True] is not a list of ints >= 0"),
        ([[["a"], 3, "float32"]], "weights structure shape 3 is not a list of ints >= 0"),
        ([[["a"], [1], "nonsense"]], "weights structure dtype 'nonsense' is no torch dtype"),
        ([[["a"], [1], "Tensor"]], "weights structure dtype 'Tensor' is no torch dtype"),
        ([[["a"], [1], 5]], "weights structure dtype 5 is no torch dtype"),
    ],
)
def test_a_malformed_structure_is_a_protocol_error(value: object, message: str) -> None:
    with pytest.raises(ProtocolError, match=f"^{re.escape(message)}$"):
        decode_structure(value)


def test_a_shape_of_zero_is_a_structure_too() -> None:
    assert decode_structure([[["a", "b"], [0, 2], "int64"]]) == {("a", "b"): ((0, 2), torch.int64)}


def test_weights_that_do_not_fit_are_refused_naming_the_keys() -> None:
    expected = structure_of(net())
    with pytest.raises(ConfigurationError) as info:
        check_weights(as_weights({"0.weight": torch.zeros(3, 2), "2.bias": torch.zeros(1)}), expected, what="mine")
    assert str(info.value) == (
        "weights for mine do not fit it: missing keys ['0.bias', '1.bias', '1.weight']; unexpected keys ['2.bias']. "
        "Pass the weights of the module the collector runs: module.state_dict(), TensorDict.from_module(module) or "
        "the module itself."
    )
    with pytest.raises(ConfigurationError, match=r"^weights for the policy \(it holds no weights\) do not fit it: "
                                                 r"unexpected keys \['w'\]\. Pass"):  # fmt: skip
        check_weights(as_weights({"w": torch.zeros(1)}), {})
    with pytest.raises(ConfigurationError, match=r"^weights for the policy do not fit it: missing keys \['w'\]\. "):
        check_weights(TensorDict({}, []), {("w",): ((1,), torch.float32)})


def test_many_keys_are_listed_six_at_most() -> None:
    expected = {(f"k{i}",): ((1,), torch.float32) for i in range(8)}
    with pytest.raises(ConfigurationError, match=re.escape("missing keys ['k0', 'k1', 'k2', 'k3', 'k4', 'k5'] "
                                                           "(and 2 more)")):  # fmt: skip
        check_weights(as_weights({f"x{i}": torch.zeros(1) for i in range(9)}), expected)
    given = {f"k{i}": torch.zeros(2, dtype=torch.float64) for i in range(8)}
    with pytest.raises(ConfigurationError) as info:
        check_weights(as_weights(given), expected)
    assert str(info.value) == (
        "weights for the policy do not fit it: "
        + "; ".join(f"k{i}: expected float32 [1], given float64 [2]" for i in range(6))
        + " (and 2 more)."
    )
    with pytest.raises(
        ConfigurationError, match=re.escape("missing keys ['k0', 'k1', 'k2', 'k3', 'k4', 'k5']; unexpected")
    ):
        check_weights(
            as_weights({f"x{i}": torch.zeros(1) for i in range(7)}), {k: expected[k] for k in sorted(expected)[:6]}
        )
    exactly_six = {f"k{i}": torch.zeros(1, dtype=torch.int32) for i in range(6)}
    with pytest.raises(ConfigurationError, match=r"given int32 \[1\]\.$"):
        check_weights(as_weights(exactly_six), {k: v for k, v in expected.items() if int(k[0][1:]) < 6})


def test_a_dtype_alone_or_a_shape_alone_is_a_misfit() -> None:
    expected = {("w",): ((2,), torch.float32)}
    with pytest.raises(ConfigurationError, match=r"w: expected float32 \[2\], given float64 \[2\]\.$"):
        check_weights(as_weights({"w": torch.zeros(2, dtype=torch.float64)}), expected)
    with pytest.raises(ConfigurationError, match=r"w: expected float32 \[2\], given float32 \[3\]\.$"):
        check_weights(as_weights({"w": torch.zeros(3)}), expected)
    fits = as_weights({"w": torch.zeros(2)})
    assert check_weights(fits, expected) is fits


def test_a_wrappers_prefix_is_added_or_dropped_when_it_maps_exactly() -> None:
    inner = {"weight": torch.ones(1, 2), "bias": torch.ones(1)}
    wrapped = {("module", "weight"): ((1, 2), torch.float32), ("module", "bias"): ((1,), torch.float32)}
    mapped = check_weights(as_weights(inner), wrapped)
    assert leaf_keys(mapped) == [("module", "bias"), ("module", "weight")]
    assert mapped["module", "weight"] is inner["weight"]
    deep = {("a", "b", "weight"): ((1, 2), torch.float32), ("a", "b", "bias"): ((1,), torch.float32)}
    assert leaf_keys(check_weights(as_weights(inner), deep)) == [("a", "b", "bias"), ("a", "b", "weight")]
    partly = {("a", "b", "weight"): ((1, 2), torch.float32), ("a", "bias"): ((1,), torch.float32)}
    mapped = check_weights(as_weights({"b.weight": torch.ones(1, 2), "bias": torch.ones(1)}), partly)
    assert leaf_keys(mapped) == [("a", "b", "weight"), ("a", "bias")]
    ddp = {"module.weight": torch.ones(1, 2), "module.bias": torch.ones(1)}
    plain = structure_of(torch.nn.Linear(2, 1))
    assert leaf_keys(check_weights(as_weights(ddp), plain)) == [("bias",), ("weight",)]
    compiled = {"_orig_mod.x.weight": torch.ones(1, 2), "_orig_mod.x.bias": torch.ones(1)}
    assert leaf_keys(check_weights(as_weights(compiled), plain)) == [("bias",), ("weight",)]
    two_deep = {"a.b.weight": torch.ones(1, 2), "a.b.bias": torch.ones(1)}
    assert leaf_keys(check_weights(as_weights(two_deep), plain)) == [("bias",), ("weight",)]
    with pytest.raises(ConfigurationError, match="missing keys"):  # one key fewer: no mapping
        check_weights(as_weights({"weight": torch.ones(1, 2)}), wrapped)
    with pytest.raises(ConfigurationError, match="missing keys"):  # a prefix that is a whole key: no mapping
        check_weights(as_weights({"w": torch.ones(1)}), {("w", "x"): ((1,), torch.float32)})
    three = {("module", f"w{i}"): ((1,), torch.float32) for i in range(3)}
    mapped = check_weights(as_weights({f"w{i}": torch.ones(1) for i in range(3)}), three)
    assert leaf_keys(mapped) == sorted(three)
    mixed = {"module.weight": torch.ones(1, 2), "other.bias": torch.ones(1)}
    with pytest.raises(ConfigurationError, match="missing keys"):
        check_weights(as_weights(mixed), plain)


def test_a_push_is_checked_against_every_receiver_and_each_part_against_its_part() -> None:
    policy = TwoPartProbe(1.0, 1.0)
    structure = structure_of(policy)
    pushed = check_push({"policy.a": WeightProbe(0.5).state_dict(), "env.x": {"w": torch.ones(1)}},
                        [None, structure, structure])  # fmt: skip
    assert pushed["policy.a"]["w"].tolist() == [0.5]
    assert pushed["env.x"]["w"].tolist() == [1.0]
    with pytest.raises(ConfigurationError, match=r"^weights for model 'policy.a' of the policy do not fit it"):
        check_push({"policy.a": {"w": torch.ones(2)}}, [structure])
    with pytest.raises(ConfigurationError, match=r"^weights_dict\['policy.b'\]='list' is invalid"):
        check_push({"policy.b": [1]}, [structure])
    other = structure_of(WeightProbe(1.0))
    with pytest.raises(ConfigurationError, match=r"^the workers run policies of different structures: cannot push "
                                                 r"the policy$"):  # fmt: skip
        check_push({"policy": {"module.w": torch.ones(1)}}, [{("module", "w"): ((1,), torch.float32)}, other])
    assert check_push({"policy": {"w": torch.ones(1)}}, [other, dict(other)])["policy"]["w"].tolist() == [1.0]


def test_a_snapshot_of_weights_is_a_copy_and_the_policy_itself_is_none() -> None:
    policy = WeightProbe(1.0)
    assert weights_of(policy, policy) is None
    source = WeightProbe(2.0)
    snapshot = weights_of(source, policy)
    assert snapshot is not None
    source.w.data.fill_(5.0)
    assert snapshot["w"].tolist() == [2.0]
    assert not snapshot["w"].requires_grad
    assert weights_of({"w": torch.ones(1)}, None)["w"].tolist() == [1.0]
    with pytest.raises(ConfigurationError, match=r"w: expected float32 \[1\], given float32 \[2\]"):
        weights_of({"w": torch.ones(2)}, policy)
    with pytest.raises(ConfigurationError, match=r"w: expected float32 \[3\]"):
        weights_of({"w": torch.ones(2)}, None, {("w",): ((3,), torch.float32)})
    for bad in (None, 3):
        expected = (
            f"policy_or_weights={bad} is invalid: expected an nn.Module, a TensorDict of weights or a state dict (the "
            "collector was built without a policy holding weights: pass one)."
        )
        with pytest.raises(ConfigurationError, match=f"^{re.escape(expected)}$"):
            weights_of(bad, policy)


# -- the in-process collector: staged weights, applied between batches -----------------------------------------
def engine(value: float = 0.0, **spec: Any) -> Any:
    return build_engine(
        RolloutSpec(create_env_fn=functools.partial(CountingEnv, 2), frames_per_batch=4, policy=WeightProbe(value),
                   **spec),
        blocking=True,
    )  # fmt: skip


def probe_value(eng: Any) -> float:
    return float(eng.policy.weights_module.w.item())


def test_staged_weights_apply_at_the_boundary_with_their_version() -> None:
    eng = engine()
    staged = PolicyWeights()
    assert staged.version == 0
    assert staged.stage(weights_of(WeightProbe(3.0), None)) == 1
    assert staged.stage(None) == 2  # a version bump alone (the policy itself was pushed)
    assert staged.stage(weights_of(WeightProbe(4.0), None), bump=False) == 2
    assert probe_value(eng) == 0.0
    assert eng.policy_version == 0
    staged.apply_pending(eng)
    assert (probe_value(eng), eng.policy_version) == (4.0, 2)
    eng.policy.weights_module.w.data.fill_(9.0)
    staged.apply_pending(eng)  # nothing staged: only the version is stamped again
    assert (probe_value(eng), eng.policy_version) == (9.0, 2)
    eng.close()


def test_nothing_applies_while_a_batch_is_half_way() -> None:
    eng = engine()
    stop = threading.Event()
    stop.set()
    with pytest.raises(RolloutInterrupted):  # the batch stays half-way
        eng.collect(stop)
    assert eng.in_batch
    staged = PolicyWeights()
    staged.stage(weights_of(WeightProbe(1.0), None))
    staged.apply_pending(eng)
    assert (probe_value(eng), eng.policy_version) == (0.0, 0)
    eng.collect()
    staged.apply_pending(eng)
    assert (probe_value(eng), eng.policy_version) == (1.0, 1)
    eng.close()


def test_weights_for_a_policy_without_a_module_are_refused() -> None:
    eng = build_engine(RolloutSpec(create_env_fn=functools.partial(CountingEnv, 2), frames_per_batch=4), blocking=True)
    staged = PolicyWeights()
    staged.stage({"w": torch.ones(1)})
    with pytest.raises(ConfigurationError, match=r"^policy_or_weights='dict' is invalid: expected a collector whose "
                                                 r"policy is an nn.Module\.$"):  # fmt: skip
        staged.apply_pending(eng)
    eng.close()


def test_load_weights_copies_in_place_or_changes_nothing() -> None:
    module = net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    target = net()
    for p in target.parameters():
        p.data.add_(1.0)
    load_weights(module, target)
    assert all(torch.equal(module.state_dict()[k], target.state_dict()[k]) for k in before)
    with pytest.raises(ConfigurationError):
        load_weights(module, {"0.weight": torch.zeros(3, 2)})
    assert all(torch.equal(module.state_dict()[k], target.state_dict()[k]) for k in before)


# -- the buffers that carry weights ------------------------------------------------------------------------------
def test_a_flat_buffer_lays_every_tensor_out_aligned_and_back() -> None:
    params = {"b": torch.tensor([True, False, True]), "w": torch.arange(6, dtype=torch.float64).view(2, 3),
              "e": torch.zeros(0), "i": torch.tensor([7], dtype=torch.int16)}  # fmt: skip
    layout, flat = flatten_params(params)
    assert layout == {"nbytes": 128 + 2, "leaves": [
        {"key": ["b"], "dtype": "bool", "shape": [3], "offset": 0, "nbytes": 3},
        {"key": ["w"], "dtype": "float64", "shape": [2, 3], "offset": 64, "nbytes": 48},
        {"key": ["e"], "dtype": "float32", "shape": [0], "offset": 128, "nbytes": 0},
        {"key": ["i"], "dtype": "int16", "shape": [1], "offset": 128, "nbytes": 2},
    ]}  # fmt: skip
    target = {k: torch.zeros_like(v) for k, v in params.items()}
    unflatten_into(layout, bytearray(flat.numpy().tobytes()), target)
    assert all(torch.equal(target[k], params[k]) for k in params)


def test_a_preallocated_buffer_must_fit() -> None:
    params = {"w": torch.ones(4)}
    out = torch.zeros(32, dtype=torch.uint8)
    layout, flat = flatten_params(params, out=out)
    assert flat is out
    assert layout["nbytes"] == 16
    assert out[:16].view(torch.float32).tolist() == [1.0] * 4
    bad = [torch.zeros(15, dtype=torch.uint8), torch.zeros(4), torch.zeros(2, 16, dtype=torch.uint8),
           torch.zeros(64, dtype=torch.uint8)[::2], torch.zeros(40, dtype=torch.uint8)[8:]]  # fmt: skip
    for out in bad:
        with pytest.raises(ConfigurationError, match=r"expected a contiguous, 16-byte aligned 1-D uint8 CPU tensor of "
                                                     r"at least 16 bytes\.$"):  # fmt: skip
            flatten_params(params, out=out)
    layout, _ = flatten_params(params, out=torch.zeros(48, dtype=torch.uint8)[16:])
    assert layout["nbytes"] == 16


def test_flatten_refuses_what_is_no_tensor() -> None:
    with pytest.raises(ConfigurationError, match=r"^tensors\['w'\]='int' is invalid: expected a torch.Tensor\.$"):
        flatten_params({"w": 1})
    with pytest.raises(ConfigurationError, match=r"^tensors='list' is invalid: expected a TensorDict or a mapping"):
        flatten_params([torch.ones(1)])  # type: ignore[arg-type]


def layout_of(**leaf: Any) -> dict[str, Any]:
    entry = {"key": ["w"], "dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8}
    entry.update(leaf)
    return {"leaves": [entry], "nbytes": 8}


@pytest.mark.parametrize(
    ("layout", "flat", "target", "message"),
    [
        ([], torch.zeros(8, dtype=torch.uint8), {}, "weight layout must be a map with a list of leaves"),
        ({"leaves": 1}, torch.zeros(8, dtype=torch.uint8), {}, "weight layout must be a map with a list of leaves"),
        (layout_of(), torch.zeros(8), {}, "flat weights must be a 1-D uint8 tensor, got torch.float32 of shape [8]"),
        (
            layout_of(),
            torch.zeros(2, 4, dtype=torch.uint8),
            {},
            "flat weights must be a 1-D uint8 tensor, got torch.uint8 of shape [2, 4]",
        ),
        (
            layout_of(offset=2),
            torch.zeros(16, dtype=torch.uint8),
            {"w": torch.zeros(2)},
            "weight ('w',) starts at byte 2, not a multiple of its item size",
        ),
        (
            layout_of(offset=4),
            torch.zeros(8, dtype=torch.uint8),
            {"w": torch.zeros(2)},
            "weight ('w',) ends at byte 12, past the 8 received",
        ),
        (
            layout_of(),
            torch.zeros(8, dtype=torch.uint8),
            {"v": torch.zeros(2)},
            "weight ('w',) has no tensor to go to in the target",
        ),
        (
            layout_of(),
            torch.zeros(8, dtype=torch.uint8),
            {"w": torch.zeros(2, dtype=torch.int32)},
            "weight ('w',) is torch.float32 [2], the target holds torch.int32 [2]",
        ),
        (
            layout_of(),
            torch.zeros(8, dtype=torch.uint8),
            {"w": torch.zeros(1, 2)},
            "weight ('w',) is torch.float32 [2], the target holds torch.float32 [1, 2]",
        ),
        (
            layout_of(dtype="bool", nbytes=2),
            torch.tensor([1, 2], dtype=torch.uint8),
            {"w": torch.zeros(2, dtype=torch.bool)},
            "bool weight ('w',) holds bytes other than 0 and 1",
        ),
        (
            layout_of(),
            torch.zeros(8, dtype=torch.uint8),
            {"w": torch.zeros(2), "x": torch.zeros(1)},
            "the weights lack 1 tensors the target holds, e.g. ('x',)",
        ),
    ],
)
def test_a_layout_that_does_not_fit_is_refused_before_anything_is_copied(
    layout: object, flat: torch.Tensor, target: dict[str, torch.Tensor], message: str
) -> None:
    before = {k: v.clone() for k, v in target.items()}
    with pytest.raises(ProtocolError, match=f"^malformed message: {re.escape(message)}$"):
        unflatten_into(layout, flat, target)
    assert all(torch.equal(target[k], before[k]) for k in target)


def test_a_lax_plan_leaves_the_rest_of_the_target_and_bool_bytes_may_be_0_or_1() -> None:
    target = {"w": torch.zeros(2, dtype=torch.bool), "x": torch.full((1,), 5.0)}
    plan = plan_unflatten(layout_of(dtype="bool", nbytes=2), torch.tensor([1, 0], dtype=torch.uint8), target,
                          strict=False)  # fmt: skip
    assert [key for key, *_ in plan] == [("w",)]
    copy_planned(plan)
    assert target["w"].tolist() == [True, False]
    assert target["x"].tolist() == [5.0]


def test_an_unaligned_buffer_is_read_through_a_copy() -> None:
    layout, flat = flatten_params({"w": torch.tensor([1.5, -2.0])})
    shifted = torch.zeros(flat.numel() + 1, dtype=torch.uint8)
    shifted[1:] = flat
    target = TensorDict({"w": torch.zeros(2)}, batch_size=[])
    unflatten_into(layout, shifted[1:], target)
    assert target["w"].tolist() == [1.5, -2.0]
    nested = TensorDict({"a": {"b": torch.zeros(2)}}, batch_size=[])
    layout, flat = flatten_params(TensorDict({"a": {"b": torch.tensor([3.0, 4.0])}}, batch_size=[]))
    unflatten_into(layout, flat, nested)
    assert nested["a", "b"].tolist() == [3.0, 4.0]
    mapping = {("a", "b"): torch.zeros(2)}
    unflatten_into(layout, flat, mapping)
    assert mapping["a", "b"].tolist() == [3.0, 4.0]


def test_a_shared_memory_writer_rewrites_its_segment_until_the_weights_grow() -> None:
    writer = SharedMemWeightSyncScheme().make_writer()
    try:
        first, frame = writer.write(TensorDict({"w": torch.ones(4)}, batch_size=[]))
        assert frame is None
        assert first["layout"]["nbytes"] == 16
        again, _ = writer.write(TensorDict({"w": torch.full((4,), 2.0)}, batch_size=[]))
        assert again["shm"] == first["shm"]
        reader = ShmSegment.attach(again["shm"], 16)
        assert reader.tensor().view(torch.float32).tolist() == [2.0] * 4
        reader.close()
        smaller, _ = writer.write(TensorDict({"w": torch.ones(2)}, batch_size=[]))
        assert smaller["shm"] != first["shm"]
        assert smaller["layout"]["nbytes"] == 8
        grown, _ = writer.write(TensorDict({"w": torch.ones(8)}, batch_size=[]))
        assert grown["shm"] != smaller["shm"]
        assert grown["layout"]["nbytes"] == 32
    finally:
        writer.close()
        writer.close()
    assert repr(SharedMemWeightSyncScheme()) == "SharedMemWeightSyncScheme()"


def test_a_frame_writer_sends_a_fresh_buffer_each_push() -> None:
    writer = ZmqWeightSyncScheme().make_writer()
    entry, first = writer.write(TensorDict({"w": torch.ones(2)}, batch_size=[]))
    _, second = writer.write(TensorDict({"w": torch.ones(2)}, batch_size=[]))
    assert entry["shm"] is None
    assert entry["layout"]["nbytes"] == 8
    assert first is not None
    assert second is not None
    assert first.data_ptr() != second.data_ptr()


def test_a_worker_finds_each_models_buffer_in_frames_or_segments() -> None:
    layout, flat = flatten_params({"w": torch.ones(2)})
    header = {"models": [{"id": "policy", "layout": layout, "shm": None}, {"id": 7, "layout": layout}]}
    staged = read_weights(header, TensorDict({"m0": flat, "m1": flat * 2}, batch_size=[]), {}, None)
    assert list(staged) == ["policy", "7"]
    assert staged["7"][1].tolist() == (flat * 2).tolist()
    with pytest.raises(ProtocolError, match=r"^weights message lacks the frame of model 1$"):
        read_weights(header, TensorDict({"m0": flat}, batch_size=[]), {}, None)
    with pytest.raises(ProtocolError, match=r"^weights message lacks the frame of model 0$"):
        read_weights(header, None, {}, None)
    with pytest.raises(ProtocolError, match=r"^weights models is a dict, expected a list$"):
        read_weights({"models": {}}, None, {}, None)
    writer = SharedMemWeightSyncScheme().make_writer()
    try:
        entry, _ = writer.write(TensorDict({"w": torch.full((2,), 3.0)}, batch_size=[]))
        segments: dict[str, ShmSegment] = {}
        staged = read_weights({"models": [{"id": "policy", **entry}]}, None, segments, None)
        assert staged["policy"][1].view(torch.float32).tolist() == [3.0, 3.0]
        assert list(segments) == [entry["shm"]]
        attached = segments[entry["shm"]]
        read_weights({"models": [{"id": "policy", **entry}]}, None, segments, None)
        assert segments[entry["shm"]] is attached  # attached once
        for segment in segments.values():
            segment.close()
    finally:
        writer.close()


# -- a worker's staging: pushes queued while a batch runs apply in order --------------------------------------------
class Worker:
    """A worker's :class:`Staging` over a real engine, its acknowledgements kept in :attr:`acks`."""

    def __init__(self, *, asked: int = 0, waiting: bool = False, with_engine: bool = True) -> None:
        self.engine = engine() if with_engine else None
        self.acks: list[tuple[str, dict[str, Any]]] = []
        self.asked, self.waiting = asked, waiting
        self.staging = Staging(
            send=lambda kind, fields: self.acks.append((kind, fields)), engine=lambda: self.engine,
            dist=lambda: None, next_request=lambda: self.asked + 1, requests_waiting=lambda: self.waiting,
            asked=lambda: self.asked,
        )  # fmt: skip

    def push(self, version: object, value: float, **extra: Any) -> torch.Tensor:
        layout, flat = flatten_params({"w": torch.full((1,), value)})
        self.staging.stage_weights({"version": version, "models": [{"id": "policy", "layout": layout}], **extra},
                                   TensorDict({"m0": flat}, batch_size=[]))  # fmt: skip
        return flat

    def state(self) -> tuple[float, int]:
        assert self.engine is not None
        return probe_value(self.engine), self.engine.policy_version

    def close(self) -> None:
        self.staging.close()
        if self.engine is not None:
            self.engine.close()


def test_pushes_queued_during_a_batch_apply_in_order_the_newest_last() -> None:
    worker = Worker()
    with worker.staging.engine_lock:  # the runner holds it for a whole batch
        for version, value in ((1, 1.0), (2, 2.0), (3, 3.0)):
            worker.push(version, value)
    assert worker.state() == (0.0, 0)
    assert worker.acks == [(P.ACK, {"version": 1}), (P.ACK, {"version": 2}), (P.ACK, {"version": 3})]
    with worker.staging.engine_lock:
        worker.staging.apply_pending(None)
    assert worker.state() == (3.0, 3)
    worker.close()


def test_a_push_applies_from_the_request_it_names_and_no_sooner() -> None:
    worker = Worker(asked=2)
    with worker.staging.engine_lock:
        worker.push(1, 1.0, **{"from": 4})
        worker.push(2, 2.0, **{"from": 6})
        worker.push(3, 3.0, **{"from": 6})
    with worker.staging.engine_lock:
        assert worker.staging.apply_pending(3) == 0
        assert worker.state() == (0.0, 0)
        worker.staging.apply_pending(4)
        assert worker.state() == (1.0, 1)
        worker.staging.apply_pending(5)
        assert worker.state() == (1.0, 1)
        worker.staging.apply_pending(6)
        assert worker.state() == (3.0, 3)
    worker.close()


def test_an_idle_worker_applies_a_push_at_once_after_those_queued_before_it() -> None:
    worker = Worker()
    with worker.staging.engine_lock:
        worker.push(1, 1.0)
    worker.push(2, 2.0)  # idle: applied now, the queued one first
    assert worker.state() == (2.0, 2)
    with worker.staging.engine_lock:
        worker.staging.apply_pending(None)
    assert worker.state() == (2.0, 2)  # nothing left queued
    worker.close()


@pytest.mark.parametrize(("asked", "waiting", "first"), [(0, True, None), (0, False, 2), (3, False, 5)])
def test_a_push_waits_while_a_request_is_waiting_or_before_its_first_request(
    asked: int, waiting: bool, first: int | None
) -> None:
    worker = Worker(asked=asked, waiting=waiting)
    worker.push(1, 1.0, **({} if first is None else {"from": first}))
    assert worker.state() == (0.0, 0)
    with worker.staging.engine_lock:
        worker.staging.apply_pending(first if first is not None else asked + 1)
    assert worker.state() == (1.0, 1)
    worker.close()


def test_a_bad_from_counts_as_the_next_request() -> None:
    worker = Worker(asked=1)
    with worker.staging.engine_lock:
        worker.push(1, 1.0, **{"from": "soon"})
    with worker.staging.engine_lock:
        worker.staging.apply_pending(1)
        assert worker.state() == (0.0, 0)
        worker.staging.apply_pending(2)
        assert worker.state() == (1.0, 1)
    worker.close()


def test_a_queued_push_is_a_private_copy_of_the_buffer_it_came_in() -> None:
    worker = Worker()
    with worker.staging.engine_lock:
        flat = worker.push(1, 1.0)
        flat.view(torch.float32).fill_(7.0)  # the next push rewrites the shared segment
    with worker.staging.engine_lock:
        worker.staging.apply_pending(None)
    assert worker.state() == (1.0, 1)
    worker.close()


def test_a_push_held_by_a_half_way_batch_waits_for_the_batch_after_it() -> None:
    worker = Worker()
    assert worker.engine is not None
    stop = threading.Event()
    stop.set()
    with pytest.raises(RolloutInterrupted):
        worker.engine.collect(stop)
    assert worker.engine.in_batch
    worker.push(1, 1.0)  # the lock is free, but a batch is half-way
    with worker.staging.engine_lock:
        worker.staging.apply_pending(None)
    assert worker.state() == (0.0, 0)
    worker.engine.collect()
    with worker.staging.engine_lock:
        worker.staging.apply_pending(None)
    assert worker.state() == (1.0, 1)
    worker.close()


@pytest.mark.parametrize(
    ("version", "extra", "refused", "why"),
    [
        ("3", {}, -1, "ProtocolError: weights version '3' is not an int"),
        (True, {}, -1, "ProtocolError: weights version True is not an int"),
        (4, {"models": {}}, 4, "ProtocolError: weights models is a dict, expected a list"),
    ],
)
def test_a_malformed_push_is_refused_and_changes_nothing(
    version: object, extra: dict[str, Any], refused: int, why: str
) -> None:
    worker = Worker()
    worker.push(version, 1.0, **extra)
    assert worker.acks == [(P.ACK, {"version": refused, "error": why})]
    assert worker.state() == (0.0, 0)
    worker.close()


def test_a_worker_without_a_policy_refuses_weights() -> None:
    worker = Worker(with_engine=False)
    worker.push(1, 1.0)
    assert worker.acks == [(P.ACK, {"version": 1, "error": "ProtocolError: this worker has no policy to load weights "
                                                           "into"})]  # fmt: skip


def test_a_push_that_does_not_fit_this_workers_policy_is_refused() -> None:
    worker = Worker()
    layout, flat = flatten_params({"w": torch.ones(3)})
    worker.staging.stage_weights({"version": 2, "models": [{"id": "policy", "layout": layout}]},
                                 TensorDict({"m0": flat}, batch_size=[]))  # fmt: skip
    ((kind, fields),) = worker.acks
    assert (kind, fields["version"]) == (P.ACK, 2)
    assert fields["error"].startswith("ProtocolError: malformed message: weight ('w',) is torch.float32 [3]")
    assert worker.state() == (0.0, 0)
    worker.close()


def test_a_reseed_and_a_restored_state_are_counted_and_applied() -> None:
    worker = Worker()
    assert worker.engine is not None
    with worker.staging.engine_lock:
        worker.staging.stage_seed(5)
        worker.staging.stage_state({"next_traj_counter": 40, "frames": 400})
        assert (worker.engine.next_traj_counter, worker.engine.frames) == (0, 0)
        assert worker.staging.apply_pending(None) == 2
    assert (worker.engine.next_traj_counter, worker.engine.frames) == (40, 400)
    batch = worker.engine.collect()
    assert batch["collector", "traj_ids"][:, 0].tolist() == [40, 41]
    assert torch.initial_seed() == 5
    worker.staging.stage_seed(6)  # idle: applied at once
    assert torch.initial_seed() == 6
    with worker.staging.engine_lock:
        assert worker.staging.apply_pending(None) == 3
    worker.close()


def test_a_reseed_applied_at_once_leaves_a_push_for_a_later_request_waiting() -> None:
    worker = Worker()
    worker.push(1, 1.0, **{"from": 5})  # the engine is idle, but the push is for request 5
    assert worker.state() == (0.0, 0)
    worker.staging.stage_seed(3)  # applied at once, for the next request (1)
    assert torch.initial_seed() == 3
    assert worker.state() == (0.0, 0)
    with worker.staging.engine_lock:
        worker.staging.apply_pending(5)
    assert worker.state() == (1.0, 1)
    worker.close()


# -- the collector's side of a push ------------------------------------------------------------------------------
def ready_handles(n: int) -> list[WorkerHandle]:
    handles = []
    for index in range(n):
        config = P.WorkerConfig(index=index, generation=0, n_workers=n, address="", parent_pid=0)
        handle = WorkerHandle(index, config)
        handle.on_launch(now=0.0)
        handle.on_hello({"n_envs": 1, "layout": {"leaves": []}})
        handle.on_greeted(now=0.0)
        handles.append(handle)
    return handles


class Loopback:
    """The pool's ``send`` for a push, each worker answering at once (or refusing, or never)."""

    def __init__(self, handles: list[WorkerHandle], events: PoolEvents, answer: dict[int, str | None]) -> None:
        self.handles, self.events, self.answer = handles, events, answer
        self.sent: list[tuple[int, str, dict[str, Any], Any]] = []
        self.pusher: WeightPusher | None = None  # where the answers are filed, as the receive loop files them

    async def __call__(self, handle: WorkerHandle, kind: str, fields: Any, td: Any) -> None:
        self.sent.append((handle.index, kind, dict(fields), td))
        how = self.answer.get(handle.index, "ack")
        assert self.pusher is not None
        if how == "ack":
            self.pusher.on_ack(handle, {"version": fields["version"]})
        elif how is not None:
            self.pusher.on_ack(handle, {"version": fields["version"], "error": how})
        self.events.notify()


def pusher(n: int, answer: dict[int, str | None], **kwargs: Any) -> tuple[WeightPusher, Loopback, list[WorkerHandle]]:
    handles = ready_handles(n)
    events = PoolEvents()
    events.starting()
    events.running()
    send = Loopback(handles, events, answer)
    kwargs.setdefault("schemes", {})
    kwargs.setdefault("default_scheme", ZmqWeightSyncScheme())
    send.pusher = WeightPusher(handles, events, send, max_restarts=kwargs.pop("max_restarts", 0), **kwargs)
    return send.pusher, send, handles


async def push(weight_pusher: WeightPusher, value: float, workers: list[int], limit: float = 5.0) -> int:
    models = {"policy": TensorDict({"w": torch.full((1,), value)}, batch_size=[])}
    return await weight_pusher.push(models, workers, limit)


async def test_a_push_goes_to_each_worker_asked_with_the_next_version() -> None:
    weights, send, handles = pusher(3, {}, first_unasked=lambda: 7)
    assert weights.version == 0
    assert weights.last is None
    assert await push(weights, 1.0, [0, 2]) == 1
    assert await push(weights, 2.0, [1]) == 2
    assert [(i, kind, fields["version"], fields["from"]) for i, kind, fields, _ in send.sent] == [
        (0, P.WEIGHTS, 1, 7), (2, P.WEIGHTS, 1, 7), (1, P.WEIGHTS, 2, 7)
    ]  # fmt: skip
    assert [weights.acked_version(h) for h in handles] == [1, 2, 1]
    assert weights.last is not None
    fields, td = weights.last
    assert (fields["version"], [m["id"] for m in fields["models"]], "from" in fields) == (2, ["policy"], False)
    layout = fields["models"][0]["layout"]
    assert td is not None
    assert torch.equal(td["m0"], send.sent[-1][3]["m0"])
    assert td["m0"][: layout["nbytes"]].view(torch.float32).tolist() == [2.0]
    weights.close()
    weights.close()
    assert weights.last is None


async def test_two_models_go_in_one_message_as_frames_in_order() -> None:
    weights, send, _ = pusher(1, {}, schemes={"policy.b": ZmqWeightSyncScheme()})
    models = {"policy.a": TensorDict({"w": torch.ones(1)}, []), "policy.b": TensorDict({"w": torch.zeros(2)}, [])}
    await weights.push(models, [0], 5.0)
    ((_, _, fields, td),) = send.sent
    assert [m["id"] for m in fields["models"]] == ["policy.a", "policy.b"]
    assert td["m0"][:4].view(torch.float32).tolist() == [1.0]
    assert td["m1"][:8].view(torch.float32).tolist() == [0.0, 0.0]
    weights.close()


async def test_a_push_refused_by_every_worker_asked_names_each_and_why() -> None:
    weights, _, _ = pusher(3, {0: "no room", 2: "wrong shape"})
    with pytest.raises(WeightSyncError) as info:
        await push(weights, 1.0, [0, 1, 2])
    assert str(info.value) == ("weights version 1 were refused by workers [0, 2], which keep collecting with their "
                               "previous weights: worker 0: no room; worker 2: wrong shape")  # fmt: skip
    assert list(info.value.worker_ids) == [0, 2]
    weights.close()


async def test_a_push_not_acknowledged_in_time_names_the_silent_workers() -> None:
    weights, _, handles = pusher(3, {1: None})
    with anyio.fail_after(30), pytest.raises(WeightSyncError) as info:
        await push(weights, 1.0, [0, 1, 2], limit=0.3)
    assert str(info.value) == "weights version 1 were not acknowledged by workers [1] within 0.3s"
    assert list(info.value.worker_ids) == [1]
    assert [weights.acked_version(h) for h in handles] == [1, 0, 1]
    weights.close()


async def test_lost_workers_are_skipped_and_only_ready_ones_are_sent_to() -> None:
    weights, send, handles = pusher(3, {}, elastic=True)
    handles[1].on_lost(lockstep=False, running=True)
    assert await push(weights, 1.0, [0, 1, 2]) == 1
    assert [i for i, *_ in send.sent] == [0, 2]
    weights.close()


async def test_a_broken_pool_refuses_a_push_at_once() -> None:
    weights, send, _ = pusher(2, {})
    weights.events.fail(RuntimeError("the endpoint broke"))
    with pytest.raises(WeightSyncError, match=r"^cannot push weights: the collector is broken \(the endpoint broke\)$"):
        await push(weights, 1.0, [0, 1])
    assert send.sent == []
    assert weights.version == 0
    weights.close()


async def test_a_pool_broken_by_one_worker_still_updates_the_others() -> None:
    weights, send, _ = pusher(2, {0: None})
    weights.events.fail(WorkerCrashedError("worker 0 died", worker_id=0))
    # Raised at once, not after the limit: nobody waits for a dead worker's acknowledgement.
    with anyio.fail_after(30), pytest.raises(WeightSyncError) as info:
        await push(weights, 1.0, [0, 1], limit=600.0)
    assert (
        str(info.value) == "weights version 1 were not acknowledged by workers [0] within 600.0s; workers [0] are dead"
    )
    assert [i for i, *_ in send.sent] == [0, 1]
    weights.close()


@pytest.mark.parametrize(
    ("given", "got"),
    [
        ({"policy_or_weights": 1, "policy": 2}, "policy_or_weights and policy="),
        ({"policy": 1, "weights": 2}, "policy= and weights="),
        ({"policy_or_weights": 1, "weights_dict": {"policy": 2}}, "policy_or_weights and weights_dict="),
    ],
)
def test_an_update_from_two_sources_names_both(given: dict[str, Any], got: str) -> None:
    message = f"update_policy_weights_() takes one source of weights, got {got}"
    with pytest.raises(ConfigurationError, match=f"^{re.escape(message)}$"):
        update(**given)


def test_an_updates_worker_ids_and_timeout_are_checked_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"^worker_ids='a' is invalid"):
        update(worker_ids=["a"])
    with pytest.raises(ConfigurationError, match=r"^timeout=-1 is invalid"):
        update(timeout=-1)


def test_a_part_of_the_policy_is_checked_against_that_part_only() -> None:
    structure = structure_of(net())
    pushed = check_push({"policy.0": net()[0].state_dict()}, [structure])
    assert leaf_keys(pushed["policy.0"]) == [("bias",), ("weight",)]
    with pytest.raises(ConfigurationError, match=r"^weights for model 'policy.1' of the policy do not fit it"):
        check_push({"policy.1": net()[0].state_dict()}, [structure])
    nested = structure_of(torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 1)), torch.nn.Linear(1, 1)))
    assert leaf_keys(check_push({"policy.0.0": torch.nn.Linear(2, 1)}, [nested])["policy.0.0"]) == [
        ("bias",),
        ("weight",),
    ]
    with pytest.raises(ConfigurationError, match=r"^policy_or_weights='list' is invalid"):
        check_push({"policy": [1]}, [structure])


def dead_process() -> WorkerProcess:
    """A worker process that exited (a real one, killed and reaped)."""
    popen = subprocess.Popen(["sleep", "60"])
    popen.kill()
    popen.wait()
    return WorkerProcess(popen, None)


@pytest.mark.parametrize("restarts", ["max_restarts", "elastic"])
async def test_a_push_waits_for_a_dead_worker_to_be_restarted_or_lost(restarts: str) -> None:
    weights, send, handles = pusher(
        2, {0: None}, **({"max_restarts": 1} if restarts == "max_restarts" else {"elastic": True})
    )
    handles[0].on_process(dead_process())  # dead, and the liveness loop has not acted on it yet
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def liveness_acts() -> None:
                while not send.sent:  # the push went out, and waits: nothing yields between the two
                    await weights.events.wait(1.0)
                dead = handles[0]
                if restarts == "elastic":
                    dead.on_lost(lockstep=False, running=True)
                else:  # a successor, greeted with the last weights, acknowledges them
                    dead.on_death(lockstep=False, running=True)
                    dead.on_launch(now=0.0)
                    dead.on_hello({"n_envs": 1, "layout": {"leaves": []}})
                    dead.on_greeted(now=0.0)
                    weights.on_ack(dead, {"version": weights.last[0]["version"]})  # type: ignore[index]
                weights.events.notify()

            tg.start_soon(liveness_acts)
            assert await push(weights, 1.0, [0, 1], limit=600.0) == 1
    weights.close()


async def test_without_restarts_a_push_waits_for_no_dead_worker() -> None:
    weights, _, handles = pusher(2, {0: None})
    handles[0].on_process(dead_process())
    # Raised at once, not after the limit: a dead worker is never restarted here, nor answers.
    with anyio.fail_after(30), pytest.raises(WeightSyncError) as info:
        await push(weights, 1.0, [0, 1], limit=600.0)
    assert (
        str(info.value) == "weights version 1 were not acknowledged by workers [0] within 600.0s; workers [0] are dead"
    )
    assert list(info.value.worker_ids) == [0]
    weights.close()


def test_acknowledgements_keep_the_newest_version_and_refusals_say_why() -> None:
    weights, _, handles = pusher(1, {})
    handle = handles[0]
    assert weights.on_ack(handle, {"version": 3}) is None
    assert weights.on_ack(handle, {"version": 2}) is None
    assert (weights.acked_version(handle), weights.refused(handle)) == (3, None)
    assert weights.on_ack(handle, {"version": 4, "error": "E" * 3000}) == (4, "E" * 2000)
    assert (weights.acked_version(handle), weights.refused(handle)) == (3, (4, "E" * 2000))
    assert weights.on_ack(handle, {"version": 5, "error": None}) is None
    assert weights.acked_version(handle) == 5


def test_a_successor_has_acknowledged_nothing_but_the_last_refusal_is_kept() -> None:
    weights, _, handles = pusher(2, {})
    handle, other = handles
    weights.on_ack(handle, {"version": 3})
    weights.on_ack(handle, {"version": 4, "error": "no"})
    weights.on_ack(other, {"version": 2})
    handle.on_death(lockstep=False, running=True)
    handle.on_launch(now=1.0)  # a new process in the slot
    assert (weights.acked_version(handle), weights.refused(handle)) == (0, (4, "no"))
    assert weights.on_ack(handle, {"version": 1}) is None
    assert (weights.acked_version(handle), weights.acked_version(other)) == (1, 2)
