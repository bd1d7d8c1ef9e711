"""safetensors files written a tensor at a time and read a block of rows at a time (`transport.tensor_file`):
what the writer makes is what `safetensors` reads, byte for byte, and a block of rows is those rows."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentrl.transport.tensor_file import read_header, read_rows, write_tensors


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(7, 5, generator=g).to(torch.bfloat16), "b.bias": torch.randn(3, generator=g),
            "steps": torch.arange(4, dtype=torch.int64), "empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5),
            "mask": torch.tensor([True, False])}


def test_streamed_file_is_what_safetensors_reads(tmp_path: Path) -> None:
    want = _tensors()
    specs = [(n, t.dtype, tuple(t.shape)) for n, t in want.items()]
    # a.weight in two blocks of rows, the rest whole
    parts = [("a.weight", want["a.weight"][:4]), ("a.weight", want["a.weight"][4:]),
             *((n, t) for n, t in want.items() if n != "a.weight")]
    write_tensors(tmp_path / "x.safetensors", specs, parts)
    got = load_file(str(tmp_path / "x.safetensors"))
    assert got.keys() == want.keys()
    for n, t in want.items():
        assert got[n].dtype == t.dtype and got[n].shape == t.shape and torch.equal(got[n], t), n


def test_rows_of_a_tensor_written_by_safetensors(tmp_path: Path) -> None:
    want = _tensors()
    save_file(want, str(tmp_path / "y.safetensors"))
    entries = read_header(tmp_path / "y.safetensors")
    with open(tmp_path / "y.safetensors", "rb") as f:
        assert torch.equal(read_rows(f, entries["a.weight"], 2, 3), want["a.weight"][2:5])
        assert torch.equal(read_rows(f, entries["a.weight"], 7, 0), want["a.weight"][7:])
        for n, t in want.items():
            assert torch.equal(read_rows(f, entries[n]), t), n


def test_writer_refuses_tensors_out_of_order_or_missing(tmp_path: Path) -> None:
    specs = [("a", torch.float32, (2,)), ("b", torch.float32, (2,))]
    with pytest.raises(ValueError, match="expected data of 'a'"):
        write_tensors(tmp_path / "z", specs, [("b", torch.zeros(2))])
    with pytest.raises(ValueError, match="'b' and later"):
        write_tensors(tmp_path / "z", specs, [("a", torch.zeros(2))])
    with pytest.raises(ValueError, match="bytes given"):
        write_tensors(tmp_path / "z", specs, [("a", torch.zeros(3))])
