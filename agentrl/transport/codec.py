"""Trajectories as one flat byte buffer of typed arrays: the payload of the MPI channel's data messages.

Not pickle: the receiver allocates one buffer of the probed size, receives into it, and reads the shard
schema's arrays (`shards.ARRAYS`) as zero-copy numpy views. Layout, little-endian, every section starting
at a multiple of 8 bytes:

    header   40 bytes  magic b"ARLT", u32 schema_version, u32 n (trajectories), u32 json_len,
                       u64 total_tokens (ΣT), u64 reserved, u64 total_bytes (the whole buffer)
    json     json_len  utf-8 JSON list of n dicts: traj_id, task, index, group_id, reward, status,
                       num_turns, timings, metrics, T (this trajectory's length)
    tokens int32[ΣT], loss_mask uint8[ΣT], logprobs float32[ΣT], policy_version int32[ΣT], engine int16[ΣT]
                       the trajectories' arrays concatenated in order (split by the T of each)

`reward` travels as a JSON number (a Python float, exact), not as float32 as in the shards.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import numpy as np

from agentrl.transport.shards import ARRAYS
from agentrl.types import SCHEMA_VERSION, Status, Trajectory

MAGIC = b"ARLT"
HEADER = struct.Struct("<4sIIIQQQ")  # 40 bytes


class CodecError(ValueError):
    """A buffer that is not a trajectory message of this schema version."""


def _pad(n: int) -> int:
    return (n + 7) & ~7


def encode(trajectories: Sequence[Trajectory]) -> np.ndarray:  # -> uint8[nbytes]
    """Pack `trajectories` (any number, including none) into one uint8 buffer."""
    meta = [{
        "traj_id": t.traj_id, "task": t.task, "index": t.index, "group_id": t.group_id,
        "reward": float(t.reward), "status": Status(t.status).value, "num_turns": int(t.num_turns),
        "timings": t.timings, "metrics": t.metrics, "T": t.num_tokens,
    } for t in trajectories]
    text = json.dumps(meta, separators=(",", ":")).encode()
    total = sum(t.num_tokens for t in trajectories)
    offsets, pos = {}, _pad(HEADER.size + len(text))
    for name, dtype in ARRAYS.items():
        offsets[name] = pos
        pos = _pad(pos + total * np.dtype(dtype).itemsize)
    buf = np.zeros(pos, dtype=np.uint8)
    HEADER.pack_into(buf, 0, MAGIC, SCHEMA_VERSION, len(trajectories), len(text), total, 0, pos)
    buf[HEADER.size:HEADER.size + len(text)] = np.frombuffer(text, dtype=np.uint8)
    for name, dtype in ARRAYS.items():
        view = buf[offsets[name]:offsets[name] + total * np.dtype(dtype).itemsize].view(dtype)
        if total:
            np.concatenate([getattr(t, name) for t in trajectories], out=view, casting="same_kind")
    return buf


def decode(buf: np.ndarray | bytes | bytearray | memoryview) -> list[Trajectory]:
    """Unpack a buffer made by `encode`; the arrays are copies, so `buf` may be reused afterwards.

    Raises:
        CodecError: wrong magic, schema version or size, or malformed JSON.
    """
    raw = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf.view(np.uint8).ravel()
    if raw.nbytes < HEADER.size:
        raise CodecError(f"trajectory message of {raw.nbytes} bytes is shorter than its header")
    magic, version, n, json_len, total, _, nbytes = HEADER.unpack_from(raw, 0)
    if magic != MAGIC:
        raise CodecError(f"not a trajectory message (magic {magic!r})")
    if version != SCHEMA_VERSION:
        raise CodecError(f"trajectory message has schema_version {version}, this code reads {SCHEMA_VERSION}")
    if nbytes != raw.nbytes:
        raise CodecError(f"trajectory message says {nbytes} bytes, received {raw.nbytes}")
    try:
        meta = json.loads(raw[HEADER.size:HEADER.size + json_len].tobytes())
    except ValueError as e:
        raise CodecError(f"trajectory message has malformed JSON ({e})") from e
    if len(meta) != n or sum(m["T"] for m in meta) != total:
        raise CodecError(f"trajectory message header (n={n}, ΣT={total}) disagrees with its JSON")
    arrays, pos = {}, _pad(HEADER.size + json_len)
    for name, dtype in ARRAYS.items():
        size = total * np.dtype(dtype).itemsize
        arrays[name] = raw[pos:pos + size].view(dtype)  # [ΣT]
        pos = _pad(pos + size)
    out, start = [], 0
    for m in meta:
        end = start + m["T"]
        out.append(Trajectory(
            traj_id=m["traj_id"], task=m["task"], index=m["index"], group_id=m["group_id"],
            reward=m["reward"], status=Status(m["status"]), num_turns=m["num_turns"],
            timings=m["timings"], metrics=m["metrics"],
            **{name: arrays[name][start:end].copy() for name in ARRAYS},
        ))
        start = end
    return out
