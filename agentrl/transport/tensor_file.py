"""safetensors files read and written a tensor (or a block of rows) at a time, with plain reads and writes.

Why not `safetensors.safe_open` / `save_file`: `save_file` needs every tensor in memory at once, and a
memory-mapped read counts every page it touches in the reader's RSS until the file is closed, so a rank that
reads a whole 15 GB file through the map holds 15 GB by the time it is done. Here a rank reads only the bytes
of the rows it asked for (`read_rows`) into a buffer of its own, and a writer that knows the tensors' names,
dtypes and shapes up front (the header comes first and holds every offset) takes the data one tensor at a
time (`TensorFileWriter`), so nothing holds more than the tensor it is handing over.

The layout is safetensors' own (an 8-byte little-endian header length, a JSON header of
`{name: {dtype, shape, data_offsets}}` plus `__metadata__`, padded with spaces to 8 bytes, then the tensors'
bytes back to back, row-major), so `safetensors`, `transformers` and vLLM read what this writes.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

_CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
_DTYPES = {v: k for k, v in _CODES.items()}


@dataclass(frozen=True)
class Entry:
    """One tensor of a file: its dtype, shape and the byte range of its data from the start of the file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one slice along dim 0 (the whole tensor for a scalar)."""
        rows = self.shape[0] if self.shape else 1
        return (self.end - self.start) // rows if rows else 0


def read_header(path: str | Path) -> dict[str, Entry]:
    """The tensors of a safetensors file by name (the data is not read)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {name: Entry(_DTYPES[h["dtype"]], tuple(h["shape"]), 8 + n + h["data_offsets"][0],
                        8 + n + h["data_offsets"][1]) for name, h in header.items()}


def read_rows(f, entry: Entry, first: int | None = None, rows: int | None = None) -> torch.Tensor:
    """Rows `first` .. `first + rows` (dim 0) of a tensor of the open file `f`, or the whole tensor; a new
    tensor in the file's dtype that holds only those bytes."""
    shape = entry.shape
    if first is None:
        offset, nbytes = entry.start, entry.end - entry.start
    else:
        assert rows is not None and shape and 0 <= first and first + rows <= shape[0], (first, rows, shape)
        offset, nbytes = entry.start + first * entry.row_bytes, rows * entry.row_bytes
        shape = (rows, *shape[1:])
    buf = torch.empty(nbytes, dtype=torch.uint8)
    f.seek(offset)
    view = memoryview(buf.numpy())
    got = 0
    while got < nbytes:  # a read may return fewer bytes than asked (large reads, network filesystems)
        n = f.readinto(view[got:])
        if not n:
            raise EOFError(f"{getattr(f, 'name', f)}: the file ends inside a tensor")
        got += n
    return buf.view(entry.dtype).view(shape)


class TensorFileWriter:
    """A safetensors file written one tensor at a time, in the order of `specs` (name, dtype, shape).

    The header goes out first (it holds every offset, computed from the specs); `write` then takes each
    tensor's data in turn, whole or as consecutive blocks of rows, and `close` checks that everything came
    and makes the file durable.
    """

    def __init__(self, path: str | Path, specs: Sequence[tuple[str, torch.dtype, Sequence[int]]],
                 metadata: dict[str, str] | None = None) -> None:
        header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
        self._sizes: list[tuple[str, int]] = []
        offset = 0
        for name, dtype, shape in specs:
            n = dtype.itemsize
            for d in shape:
                n *= int(d)
            header[name] = {"dtype": _CODES[dtype], "shape": [int(d) for d in shape],
                            "data_offsets": [offset, offset + n]}
            self._sizes.append((name, n))
            offset += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._f = open(path, "wb")  # noqa: SIM115 - held open across write() calls, closed by close()
        self._f.write(struct.pack("<Q", len(raw)) + raw)
        self._next, self._left = 0, self._sizes[0][1] if self._sizes else 0

    def write(self, name: str, data: torch.Tensor) -> None:
        """The next bytes of tensor `name` (the whole tensor, or its next block of rows), in its declared dtype."""
        while self._next < len(self._sizes) and self._left == 0 and self._sizes[self._next][0] != name:
            self._advance()  # an empty tensor takes no bytes: its data may be left out
        want = self._sizes[self._next][0] if self._next < len(self._sizes) else None
        if name != want:
            raise ValueError(f"expected data of {want!r} next, got {name!r}")
        raw = data.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        if raw.numel() > self._left:
            raise ValueError(f"{name}: {raw.numel()} bytes given, {self._left} left to write")
        self._f.write(memoryview(raw.numpy()))
        self._left -= raw.numel()
        if self._left == 0:
            self._advance()

    def _advance(self) -> None:
        self._next += 1
        self._left = self._sizes[self._next][1] if self._next < len(self._sizes) else 0

    def close(self, fsync: bool = True) -> None:
        """Check that every tensor was written and close; `fsync=False` leaves durability to the caller (who
        may fsync later, off the critical path)."""
        while self._next < len(self._sizes) and self._left == 0:
            self._advance()
        if self._next < len(self._sizes):
            self._f.close()
            raise ValueError(f"{self._sizes[self._next][0]!r} and later tensors were never written")
        self._f.flush()
        if fsync:
            os.fsync(self._f.fileno())
        self._f.close()

    def abort(self) -> None:
        self._f.close()


def write_tensors(path: str | Path, specs: Sequence[tuple[str, torch.dtype, Sequence[int]]],
                  tensors: Iterable[tuple[str, torch.Tensor]], metadata: dict[str, str] | None = None,
                  fsync: bool = True) -> None:
    """Write `tensors` (an iterable yielding them one at a time, in the order of `specs`) to `path`."""
    w = TensorFileWriter(path, specs, metadata)
    try:
        for name, t in tensors:
            w.write(name, t)
    except BaseException:
        w.abort()
        raise
    w.close(fsync)
