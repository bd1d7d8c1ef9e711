"""The MPI channel's message layout: exact round trip of every field, alignment, and rejected buffers."""
from __future__ import annotations

import numpy as np
import pytest

from agentrl.transport import codec, shards
from agentrl.transport.codec import CodecError, decode, encode
from tests.transport.test_shards import make_trajectories


def test_round_trip_every_field_exactly() -> None:
    trajs = make_trajectories(3)
    trajs[2].metrics["nan"] = float("nan")  # JSON carries non-finite metrics too
    back = decode(encode(trajs))
    assert len(back) == len(trajs)
    for got, want in zip(back, trajs, strict=True):
        for name, dtype in shards.ARRAYS.items():
            a = getattr(got, name)
            assert a.dtype == dtype and np.array_equal(a, getattr(want, name)), name
            assert a.flags.owndata  # copies: the receive buffer may be reused
        assert got.reward == want.reward  # exact, not float32 as in the shards
        for name in ("traj_id", "task", "index", "group_id", "status", "num_turns", "timings"):
            assert getattr(got, name) == getattr(want, name), name
        assert got.metrics.keys() == want.metrics.keys()
    assert np.isnan(back[2].metrics["nan"])


def test_layout_hand_checked() -> None:
    t = make_trajectories(0)[1]
    buf = encode([t])
    magic, version, n, json_len, total, _, nbytes = codec.HEADER.unpack_from(buf, 0)
    assert (magic, n, total, nbytes) == (codec.MAGIC, 1, t.num_tokens, buf.nbytes) and nbytes % 8 == 0
    start = (codec.HEADER.size + json_len + 7) // 8 * 8  # tokens start at the first 8-byte boundary
    assert np.array_equal(buf[start:start + 4 * total].view(np.int32), t.tokens)
    assert decode(buf.tobytes())[0].traj_id == t.traj_id  # bytes work as well as the array


def test_empty_batch() -> None:
    buf = encode([])
    assert buf.nbytes == 48 and decode(buf) == []  # header + "[]" padded to 8


def test_rejects_foreign_or_damaged_buffers() -> None:
    buf = encode(make_trajectories(1))
    with pytest.raises(CodecError, match="shorter than its header"):
        decode(buf[:10])
    with pytest.raises(CodecError, match="magic"):
        decode(np.concatenate([np.frombuffer(b"XXXX", np.uint8), buf[4:]]))
    with pytest.raises(CodecError, match="says .* bytes, received"):
        decode(buf[:-8])
    bad = buf.copy()
    bad[4] += 1  # schema_version
    with pytest.raises(CodecError, match="schema_version"):
        decode(bad)
