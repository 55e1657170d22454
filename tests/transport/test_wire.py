"""The wire format: roundtrips of arbitrary TensorDicts, and every malformed message is a ProtocolError."""

from __future__ import annotations

import math

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, TensorDict

from acollect._runtime.wire import (
    PROTOCOL_VERSION,
    decode_tensordict,
    encode_tensordict,
    pack_message,
    unpack_message,
    validate_layout,
)
from acollect._weights.sync import flatten_params, unflatten_into
from acollect.errors import ConfigurationError, ProtocolError

WIRE_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's bytes (NaN payloads included), for exact comparisons."""
    return tensor.resolve_conj().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def on_the_wire(frames: list) -> list:
    """What a receiver holds: fresh writable buffers, never the sender's memory."""
    return [bytes(frames[0]), *(bytearray(frame) for frame in frames[1:])]


def assert_same(actual: TensorDict, expected: TensorDict) -> None:
    assert actual.batch_size == expected.batch_size
    assert actual.names == expected.names
    expected_keys = set(expected.keys(include_nested=True, leaves_only=True))
    assert set(actual.keys(include_nested=True, leaves_only=True)) == expected_keys
    for key in expected_keys:
        got, want = actual.get(key), expected.get(key)
        assert (got.dtype, got.shape) == (want.dtype, want.shape), key
        assert raw_bytes(got) == raw_bytes(want), key


@st.composite
def tensors(draw: st.DrawFn, batch_size: tuple[int, ...]) -> torch.Tensor:
    dtype = draw(st.sampled_from(WIRE_DTYPES))
    shape = (*batch_size, *draw(st.lists(st.integers(0, 3), max_size=2)))
    nbytes = math.prod(shape) * dtype.itemsize
    data = bytearray(draw(st.binary(min_size=nbytes, max_size=nbytes)))
    if not nbytes:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(data, dtype=torch.uint8).clone()
    if dtype is torch.bool:
        raw &= 1
    return raw.view(dtype).view(shape)


@st.composite
def tensordicts(draw: st.DrawFn) -> TensorDict:
    batch_size = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    names = st.text("abcdefgh", min_size=1, max_size=3)
    keys = draw(st.lists(st.lists(names, min_size=1, max_size=3).map(tuple), max_size=5, unique=True))
    assume(not any(a != b and b[: len(a)] == a for a in keys for b in keys))
    td = TensorDict(batch_size=batch_size)
    for key in keys:
        td.set(key, draw(tensors(batch_size)))
    if batch_size and draw(st.booleans()):
        td.names = [f"d{i}" if draw(st.booleans()) else None for i in range(len(batch_size))]
    if draw(st.booleans()):
        td.set("empty_sub", TensorDict(batch_size=(*batch_size, 2)))
    return td


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(td=tensordicts(), copy=st.booleans())
def test_any_tensordict_roundtrips(td: TensorDict, copy: bool) -> None:
    frames = pack_message("batch", {"seq": 7}, td)
    header, decoded = unpack_message(on_the_wire(frames), copy=copy)
    assert header == {"v": PROTOCOL_VERSION, "kind": "batch", "seq": 7}
    assert decoded is not None
    assert_same(decoded, td)


def test_zero_dim_non_contiguous_and_special_dtypes_roundtrip() -> None:
    td = TensorDict(
        {
            "scalar": torch.tensor(3.5, dtype=torch.float64),
            "transposed": torch.arange(12.0).view(3, 4).t(),
            "flags": torch.tensor([True, False, True, True]),
            "half": torch.linspace(-1, 1, 4, dtype=torch.bfloat16),
            "conj": torch.tensor([1 + 2j, 3 - 1j, 0j, 1j]).conj(),
            "empty": torch.empty(4, 0, 5),
            ("next", "obs"): torch.arange(8, dtype=torch.uint8).view(4, 2),
        },
        batch_size=[],
    )
    _, decoded = unpack_message(on_the_wire(pack_message("batch", {}, td)))
    assert decoded is not None
    assert_same(decoded, td)
    assert torch.equal(decoded["conj"], torch.tensor([1 - 2j, 3 + 1j, 0j, -1j]))


def test_encode_is_zero_copy_for_contiguous_leaves() -> None:
    obs = torch.arange(10, dtype=torch.float32).view(5, 2)
    _, (buffer,) = encode_tensordict(TensorDict({"obs": obs}, batch_size=[5]))
    obs[0, 0] = 42.0
    assert torch.frombuffer(bytearray(buffer), dtype=torch.float32)[0] == 42.0


def test_decode_shares_memory_with_writable_buffers_unless_copied() -> None:
    layout, buffers = encode_tensordict(TensorDict({"a": torch.arange(4, dtype=torch.int64)}, batch_size=[4]))
    received = bytearray(buffers[0])
    shared = decode_tensordict(layout, [received])
    copied = decode_tensordict(layout, [received], copy=True)
    received[0] = 99
    assert shared["a"][0] == 99
    assert copied["a"][0] == 0


def test_read_only_buffers_are_copied_without_a_warning() -> None:
    layout, buffers = encode_tensordict(TensorDict({"a": torch.arange(4)}, batch_size=[4]))
    decoded = decode_tensordict(layout, [bytes(buffers[0])])  # filterwarnings=error would fail on a warning
    assert torch.equal(decoded["a"], torch.arange(4))


def test_message_without_tensors() -> None:
    assert unpack_message(pack_message("ping")) == ({"v": PROTOCOL_VERSION, "kind": "ping"}, None)


# --------------------------------------------------------------------------- sender-side errors


def test_encode_rejects_non_tensor_data_and_unsupported_dtypes() -> None:
    with pytest.raises(ConfigurationError, match="non-tensor"):
        encode_tensordict(TensorDict({"s": NonTensorData("x", batch_size=[2])}, batch_size=[2]))
    with pytest.raises(ConfigurationError, match="wire dtypes"):
        encode_tensordict(TensorDict({"q": torch.zeros(2, dtype=torch.float8_e4m3fn)}, batch_size=[2]))
    with pytest.raises(ConfigurationError, match="TensorDict"):
        encode_tensordict({"a": torch.zeros(2)})  # type: ignore[arg-type]


def test_pack_rejects_reserved_and_unpackable_fields_and_bad_kind() -> None:
    with pytest.raises(ConfigurationError, match="reserved"):
        pack_message("batch", {"v": 2})
    with pytest.raises(ConfigurationError, match="msgpack"):
        pack_message("batch", {"obj": object()})
    with pytest.raises(ConfigurationError, match="kind"):
        pack_message("")
    with pytest.raises(ConfigurationError, match="str keys"):
        pack_message("batch", {1: "x"})  # type: ignore[dict-item]


# --------------------------------------------------------------------------- receiver-side validation


def good_message() -> tuple[dict, list[bytearray]]:
    td = TensorDict({"obs": torch.zeros(2, 3), ("next", "done"): torch.zeros(2, 1, dtype=torch.bool)}, batch_size=[2])
    header = {"v": PROTOCOL_VERSION, "kind": "batch"}
    header["td"], buffers = encode_tensordict(td)
    return header, [bytearray(b) for b in buffers]


def frames_of(header: dict, buffers: list) -> list:
    return [msgpack.packb(header), *buffers]


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda h, b: h["td"]["leaves"][0].update(dtype="float128"), "dtype 'float128'"),
        (lambda h, b: h["td"]["leaves"][0].update(nbytes=4), "declares 4 bytes"),
        (lambda h, b: h["td"]["leaves"][0].update(shape=[2, 4]), "declares 24 bytes"),
        (lambda h, b: h["td"]["leaves"][0].update(key=[1]), "leaf key"),
        (lambda h, b: h["td"]["leaves"][0].update(key=[]), "leaf key"),
        (lambda h, b: h["td"]["leaves"][0].update(shape=[3, 2]), "batch_size"),
        (lambda h, b: h["td"]["leaves"][1].update(key=["obs", "x"]), "nested under leaf"),
        (lambda h, b: h["td"]["leaves"][1].update(key=["obs"], dtype="float32", shape=[2, 3], nbytes=24), "twice"),
        (lambda h, b: h["td"].update(names=["a", "b"]), "names"),
        (lambda h, b: h["td"].update(batch_size=[-1]), "batch_size"),
        (lambda h, b: h["td"].update(batch_size=[True]), "batch_size"),
        (lambda h, b: h["td"].update(leaves={}), "list of leaves"),
        (lambda h, b: h.update(td=[1, 2]), "expected a map"),
        (lambda h, b: b.pop(), "2 tensor frames but 1 arrived"),
        (lambda h, b: b.append(bytearray(1)), "2 tensor frames but 3 arrived"),
        (lambda h, b: b.__setitem__(0, b[0][:-1]), "has 23 bytes"),
        (lambda h, b: b.__setitem__(1, bytearray([2, 0])), "other than 0 and 1"),
        (lambda h, b: h.pop("kind"), "kind"),
        (lambda h, b: h.update(kind=3), "kind"),
    ],
)
def test_malformed_messages_are_protocol_errors(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    header, buffers = good_message()
    unpack_message(frames_of(header, buffers))  # the unmutated message is fine
    mutate(header, buffers)
    with pytest.raises(ProtocolError, match=reason):
        unpack_message(frames_of(header, buffers))


def test_wrong_version_names_both_versions() -> None:
    header, buffers = good_message()
    header["v"] = PROTOCOL_VERSION + 1
    with pytest.raises(
        ProtocolError, match=f"peer speaks version {PROTOCOL_VERSION + 1}.*speaks version {PROTOCOL_VERSION}"
    ):
        unpack_message(frames_of(header, buffers))
    with pytest.raises(ProtocolError, match="version None"):
        unpack_message([msgpack.packb({"kind": "batch"})])


def test_size_limits() -> None:
    header, buffers = good_message()
    with pytest.raises(ProtocolError, match="26 bytes, more than the allowed 25"):
        unpack_message(frames_of(header, buffers), max_bytes=25)
    with pytest.raises(ProtocolError, match=r"nbytes of \('obs',\)=24, expected an int in \[0, 10\]"):
        unpack_message(frames_of(header, buffers), max_bytes=10)
    with pytest.raises(ProtocolError, match="header frame has"):
        unpack_message(frames_of(header, buffers), max_header_bytes=8)
    absurd = {
        "batch_size": [],
        "names": None,
        "leaves": [{"key": ["x"], "dtype": "uint8", "shape": [1 << 40], "nbytes": 1 << 40}],
    }
    with pytest.raises(ProtocolError, match=r"nbytes of \('x',\)=1099511627776, expected an int in \[0, 17179869184\]"):
        validate_layout(absurd)
    absurd["leaves"][0].update(shape=[0, 1 << 60], nbytes=0)
    with pytest.raises(ProtocolError, match="dim=1152921504606846976"):
        validate_layout(absurd)


def test_kinds_filter_and_stray_frames() -> None:
    with pytest.raises(ProtocolError, match="unexpected message kind 'ping'"):
        unpack_message(pack_message("ping"), kinds={"batch"})
    with pytest.raises(ProtocolError, match="extra frames"):
        unpack_message([*pack_message("ping"), b"stray"])
    with pytest.raises(ProtocolError, match="non-empty list"):
        unpack_message([])
    with pytest.raises(ProtocolError, match="non-empty list"):
        unpack_message(b"\x80")  # type: ignore[arg-type]


def test_header_must_be_plain_msgpack_map() -> None:
    with pytest.raises(ProtocolError, match="expected a map"):
        unpack_message([msgpack.packb([1, 2])])
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        unpack_message([msgpack.packb({"v": 2, "kind": "x", "e": msgpack.ExtType(5, b"abc")})])
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        unpack_message([msgpack.packb({1: "int key"})])
    with pytest.raises(ProtocolError, match="not a contiguous bytes-like"):
        unpack_message([object()])


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


def assert_protocol_error_or_valid(frames: list) -> None:
    try:
        unpack_message(frames, max_bytes=1 << 20)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_random_bytes_only_ever_raise_protocol_error(frames: list[bytes]) -> None:
    assert_protocol_error_or_valid(frames)


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(["batch_size", "names", "leaves", "subs", "key", "dtype", "shape", "nbytes"]),
    value=msgpack_values,
    extra=st.lists(st.binary(max_size=32), max_size=3),
)
def test_fuzzed_layout_fields_only_ever_raise_protocol_error(field: str, value: object, extra: list[bytes]) -> None:
    header, buffers = good_message()
    if field in {"key", "dtype", "shape", "nbytes"}:
        header["td"]["leaves"][0][field] = value
    else:
        header["td"][field] = value
    assert_protocol_error_or_valid(frames_of(header, buffers + extra))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_truncated_or_corrupted_frames_only_ever_raise_protocol_error(data: st.DataObject) -> None:
    header, buffers = good_message()
    frames = frames_of(header, buffers)
    index = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[index])
    cut = data.draw(st.integers(0, len(frame)))
    if data.draw(st.booleans()):
        frame = frame[:cut]
    elif frame:
        frame[cut % len(frame)] ^= data.draw(st.integers(1, 255))
    frames[index] = frame
    assert_protocol_error_or_valid(frames[: data.draw(st.integers(1, len(frames)))])


# --------------------------------------------------------------------------- flat weights


def test_weights_roundtrip_between_two_mlps() -> None:
    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    source.register_buffer("steps", torch.tensor(5))
    target = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    target.register_buffer("steps", torch.tensor(0))
    layout, flat = flatten_params(source.state_dict())
    assert layout["nbytes"] == flat.numel()
    assert all(leaf["offset"] % 64 == 0 for leaf in layout["leaves"])
    unflatten_into(msgpack.unpackb(msgpack.packb(layout)), bytearray(flat.numpy()), target.state_dict())
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    assert target[0].weight.requires_grad  # updated in place, still a parameter


def test_weights_from_tensordict_into_tensordict_with_preallocated_out() -> None:
    params = TensorDict(
        {"w": torch.randn(3, 3), "flag": torch.tensor([True, False]), "half": torch.ones(2, dtype=torch.bfloat16)},
        batch_size=[],
    )
    params["nested", "scalar"] = torch.tensor(2.5)
    params["nested", "empty"] = torch.empty(0, 4)
    out = torch.empty(4096, dtype=torch.uint8)
    layout, flat = flatten_params(params, out=out)
    assert flat is out
    target = params.clone().zero_()
    unflatten_into(layout, flat, target)
    assert_same(target, params)


def test_unflatten_rejects_mismatches_before_touching_the_target() -> None:
    layout, flat = flatten_params({"a": torch.ones(2), "b": torch.ones(3)})
    target = {"a": torch.zeros(2), "b": torch.zeros(4)}
    with pytest.raises(ProtocolError, match=r"'b'.*target holds torch.float32 \[4\]"):
        unflatten_into(layout, flat, target)
    assert not target["a"].any()
    with pytest.raises(ProtocolError, match="no tensor to go to"):
        unflatten_into(layout, flat, {"a": torch.zeros(2)})
    with pytest.raises(ProtocolError, match="lack 1 tensors"):
        unflatten_into(layout, flat, {"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(1)})
    unflatten_into(layout, flat, {"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(1)}, strict=False)
    with pytest.raises(ProtocolError, match="past the"):
        unflatten_into(layout, flat[:70], {"a": torch.zeros(2), "b": torch.zeros(3)})
    bad = {"leaves": [{**layout["leaves"][0], "offset": 2}], "nbytes": 8}
    with pytest.raises(ProtocolError, match="multiple of its item size"):
        unflatten_into(bad, flat, {"a": torch.zeros(2)})
    with pytest.raises(ProtocolError, match="list of leaves"):
        unflatten_into({"leaves": None}, flat, target)


def test_flatten_rejects_bad_input() -> None:
    with pytest.raises(ConfigurationError, match="out="):
        flatten_params({"a": torch.ones(100)}, out=torch.empty(10, dtype=torch.uint8))
    with pytest.raises(ConfigurationError, match=r"torch\.Tensor"):
        flatten_params({"a": [1.0]})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="tensors"):
        flatten_params([torch.ones(1)])  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(td=tensordicts())
def test_any_tensordict_flattens_and_unflattens(td: TensorDict) -> None:
    layout, flat = flatten_params(td)
    target = td.clone().apply(lambda t: torch.zeros_like(t))
    unflatten_into(layout, flat.clone(), target)
    assert_same(target, td)
