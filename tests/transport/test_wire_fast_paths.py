"""The decoder's fast paths: the unchecked TensorDict assembly, torch.frombuffer leaves, the bool check, recv_frames.

Decoded TensorDicts are compared node by node with what the checked ``TensorDict(...)`` constructor builds from
the same tensors (the assembly the fast path replaced), and with the TensorDict that was encoded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import zmq
from tensordict import TensorDict, TensorDictBase

from acollect._runtime.sockets import has_message, recv_frames
from acollect._runtime.wire import decode_tensordict, encode_tensordict, validate_layout
from acollect.errors import ProtocolError


def sample(names: list[str | None] | None) -> TensorDict:
    generator = torch.Generator().manual_seed(0)
    td = TensorDict(
        {
            "obs": torch.randn(2, 3, 4, generator=generator),
            "half": torch.randn(2, 3, generator=generator).half(),
            "brain": torch.randn(2, 3, 2, generator=generator).bfloat16(),
            "count": torch.arange(6, dtype=torch.int64).reshape(2, 3) - 3,
            "pixels": torch.randint(0, 256, (2, 3, 5), dtype=torch.uint8, generator=generator),
            "nothing": torch.zeros(2, 3, 0),
            "next": {
                "done": torch.arange(30).reshape(2, 3, 5) % 3 == 0,
                "deep": {"reward": torch.randn(2, 3, 5, 1, generator=generator)},
                "mask": torch.rand(2, 3, 5, generator=generator) > 0.5,
                "empty": torch.zeros(2, 3, 5, 0, dtype=torch.int64),
            },
            "info": {"step": torch.ones(2, 3, dtype=torch.uint8)},
        },
        batch_size=[2, 3],
        names=names,  # type: ignore[arg-type]
    )
    td["next"].batch_size = [2, 3, 5]  # a sub-TensorDict with a longer batch size (its own sub follows)
    td["void"] = TensorDict(batch_size=[2, 3])  # no leaf: only the layout's subs recreate it
    return td


def checked_build(layout: dict[str, Any], tensors: list[torch.Tensor]) -> TensorDict:
    """What build_tensordict did before its fast path: the checked constructor, then the subs' batch sizes."""
    spec = validate_layout(layout)
    source: dict[str, Any] = {}
    for leaf, tensor in zip(spec.leaves, tensors, strict=True):
        node = source
        for part in leaf.key[:-1]:
            node = node.setdefault(part, {})
        node[leaf.key[-1]] = tensor
    td = TensorDict(source, batch_size=spec.batch_size, names=spec.names)  # type: ignore[arg-type]
    for key, batch_size in sorted(spec.subs, key=lambda sub: len(sub[0])):
        if key in td.keys(include_nested=True):
            td.get(key).batch_size = batch_size
        else:
            td.set(key, TensorDict(batch_size=batch_size))
    return td


def nodes(td: TensorDictBase) -> Iterator[tuple[tuple[str, ...], TensorDictBase]]:
    yield (), td
    for key in td.keys(include_nested=True):
        key = (key,) if isinstance(key, str) else key
        if isinstance(td.get(key), TensorDictBase):
            yield key, td.get(key)


def assert_same(actual: TensorDictBase, expected: TensorDictBase) -> None:
    assert type(actual) is type(expected)
    actual_nodes, expected_nodes = dict(nodes(actual)), dict(nodes(expected))
    assert actual_nodes.keys() == expected_nodes.keys()
    for key, node in expected_nodes.items():
        got = actual_nodes[key]
        assert type(got) is type(node), key
        assert got.batch_size == node.batch_size, key
        assert got.names == node.names, key
        assert set(got.keys()) == set(node.keys()), key
        for name, want in node.items():
            if isinstance(want, torch.Tensor):
                have = got.get(name)
                assert (have.dtype, have.shape) == (want.dtype, want.shape), (*key, name)
                assert torch.equal(have, want), (*key, name)


def address(buffer: Any) -> tuple[int, int]:
    array = np.frombuffer(buffer, dtype=np.uint8)
    return array.ctypes.data, array.nbytes


def shares(tensor: torch.Tensor, buffer: Any) -> bool:
    start, size = address(buffer)
    return start <= tensor.data_ptr() < start + size


@pytest.mark.parametrize("names", [None, [None, "time"], ["env", "time"]])
@pytest.mark.parametrize("form", ["bytearray", "bytes", "bytearray-copy"])
def test_decoding_matches_the_checked_constructor(names: list[str | None] | None, form: str) -> None:
    td = sample(names)
    layout, views = encode_tensordict(td)
    buffers = [bytes(view) if form == "bytes" else bytearray(view) for view in views]
    decoded = decode_tensordict(layout, buffers, copy=form == "bytearray-copy")
    assert_same(decoded, td)
    leaves = [decoded.get(tuple(leaf["key"])) for leaf in layout["leaves"]]
    assert_same(decoded, checked_build(layout, leaves))
    assert decoded["next"].names == [*(names or [None, None]), None]
    assert decoded["next", "deep"].batch_size == torch.Size([2, 3, 5])
    for leaf, tensor, buffer in zip(layout["leaves"], leaves, buffers, strict=True):
        if leaf["nbytes"] == 0:
            assert tensor.numel() == 0
            continue
        if form == "bytearray":
            assert isinstance(buffer, bytearray)
            assert shares(tensor, buffer), leaf["key"]
            buffer[0] ^= 0xFF  # the tensor sees a write to its frame (a bool's 0/1 flips to 254/255: only look)
            assert tensor.reshape(-1).view(torch.uint8)[0] == buffer[0], leaf["key"]
        else:
            assert not shares(tensor, buffer), leaf["key"]
            before = raw(tensor)
            if isinstance(buffer, bytearray):
                buffer[0] ^= 0xFF
            assert raw(tensor) == before, leaf["key"]


@pytest.mark.parametrize("names", [None, [None, "time"]])
def test_the_checked_constructor_stands_in_where_the_private_one_is_not_trusted(
    names: list[str | None] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from acollect._runtime import layout as _layout

    assert _layout.FAST_ASSEMBLY  # this tensordict passed the check made at import
    td = sample(names)
    layout, views = encode_tensordict(td)
    fast = decode_tensordict(layout, [bytearray(view) for view in views])
    monkeypatch.setattr(_layout, "FAST_ASSEMBLY", False)
    checked = decode_tensordict(layout, [bytearray(view) for view in views])
    assert_same(checked, td)
    assert_same(fast, checked)


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_renaming_one_decoded_node_renames_as_the_checked_constructors_do() -> None:
    td = sample([None, "time"])
    layout, views = encode_tensordict(td)
    decoded = decode_tensordict(layout, [bytearray(view) for view in views])
    expected = checked_build(layout, [decoded.get(tuple(leaf["key"])) for leaf in layout["leaves"]])
    for each in (decoded, expected):
        each["info"].names = ["a", "b"]  # a node's own list: no other node is renamed
    assert_same(decoded, expected)
    assert decoded.names == [None, "time"]
    assert decoded["info"].names == ["a", "b"]
    for each in (decoded, expected):
        each.names = ["x", "y"]  # the root renames its subs
    assert_same(decoded, expected)
    assert decoded["next", "deep"].names == ["x", "y", None]


def bool_message(nbytes: int, bad_at: int | None, value: int = 2) -> tuple[dict[str, Any], bytearray]:
    layout, _ = encode_tensordict(TensorDict({"flag": torch.zeros(nbytes, dtype=torch.bool)}, batch_size=[nbytes]))
    frame = bytearray(i % 2 for i in range(nbytes))
    if bad_at is not None:
        frame[bad_at] = value
    return layout, frame


@pytest.mark.parametrize("nbytes", [1, 100, 4096, 4097, 10_000])
@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("value", [2, 255])
@pytest.mark.parametrize("form", ["bytearray", "bytes", "bytearray-copy"])
def test_a_bool_leaf_holding_another_byte_is_refused(nbytes: int, where: str, value: int, form: str) -> None:
    layout, frame = bool_message(nbytes, 0 if where == "first" else nbytes - 1, value)
    buffer = bytes(frame) if form == "bytes" else frame
    with pytest.raises(ProtocolError, match=r"bool leaf \('flag',\) holds bytes other than 0 and 1"):
        decode_tensordict(layout, [buffer], copy=form == "bytearray-copy")


@pytest.mark.parametrize("nbytes", [1, 100, 4096, 4097, 10_000])
def test_a_bool_leaf_of_zeros_and_ones_decodes(nbytes: int) -> None:
    layout, frame = bool_message(nbytes, None)
    flag = decode_tensordict(layout, [frame])["flag"]
    assert flag.dtype is torch.bool
    assert torch.equal(flag, torch.arange(nbytes) % 2 == 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16, torch.bfloat16])
def test_a_misaligned_frame_is_cloned_with_the_right_values(dtype: torch.dtype) -> None:
    values = (torch.arange(12, dtype=torch.float32) * 1.5 - 4).to(dtype).reshape(3, 4)
    layout, views = encode_tensordict(TensorDict({"x": values}, batch_size=[3]))
    memory = bytearray(views[0].nbytes + 1)
    frame = memoryview(memory)[1:]
    frame[:] = views[0]
    assert address(frame)[0] % dtype.itemsize
    decoded = decode_tensordict(layout, [frame])["x"]
    assert decoded.dtype is dtype
    assert torch.equal(decoded, values)
    assert decoded.data_ptr() % dtype.itemsize == 0
    assert not shares(decoded, memory)


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    ctx = zmq.Context()
    sender, receiver = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        receiver.bind("inproc://test-wire-fast-paths")
        sender.connect("inproc://test-wire-fast-paths")
        yield sender, receiver
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        ctx.term()


def test_recv_frames_reads_one_whole_message(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    sender, receiver = pair
    assert has_message(receiver) is False
    with pytest.raises(zmq.Again):
        recv_frames(receiver)
    one = [b"alone"]
    thirteen = [b"header", b"", *(bytes([i]) * (i * 1000) for i in range(1, 12))]
    assert len(thirteen) == 13
    sender.send_multipart(one)
    sender.send_multipart(thirteen)
    sender.send_multipart([b"after", b"it"])
    assert receiver.poll(5000, zmq.POLLIN)
    assert has_message(receiver) is True
    for expected in (one, thirteen, [b"after", b"it"]):
        frames = recv_frames(receiver)
        assert all(isinstance(frame, zmq.Frame) for frame in frames)
        assert [frame.bytes for frame in frames] == expected
        assert not frames[-1].more
    assert has_message(receiver) is False
    with pytest.raises(zmq.Again):
        recv_frames(receiver)
