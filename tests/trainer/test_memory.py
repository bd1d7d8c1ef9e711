"""The trainer's memory model (`trainer.memory`): its activation bytes equal what autograd keeps in the real Hugging
Face layers (counted by storage, parameters left out) in float32 and bf16; its shapes and components by hand; the
presets fit their GPUs with the margin."""
from __future__ import annotations

import pytest
import torch

from agentrl.config import load_config
from agentrl.trainer.memory import (
    GIB,
    SHAPES,
    Setup,
    Shape,
    estimate,
    layer_activation_bytes,
    preset_setup,
    step_activation_bytes,
)


def _saved_bytes(shape: Shape, dtype: torch.dtype, tokens: int) -> int:
    """Bytes of the distinct storages autograd saves in a decoder forward, parameters left out."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).to(dtype)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=torch.randint(0, shape.vocab, (1, tokens)), use_cache=False)
    return sum(seen.values())


@pytest.mark.parametrize("dtype, b", [(torch.float32, 4), (torch.bfloat16, 2)])
@pytest.mark.parametrize("shape", [Shape(128, 2, 4, 2, 352, 100, True), Shape(192, 3, 3, 1, 512, 100, True)])
def test_activation_bytes_are_what_autograd_keeps(shape: Shape, dtype: torch.dtype, b: int) -> None:
    T = 96
    got = _saved_bytes(shape, dtype, T)
    assert got == T * step_activation_bytes(shape, b, b, checkpointing=False)
    deeper = Shape(**{**shape.__dict__, "layers": shape.layers + 1})
    assert _saved_bytes(deeper, dtype, T) - got == T * layer_activation_bytes(shape, b)


def test_shapes_count_the_published_parameters() -> None:
    # Qwen2.5 model cards: 0.49B, 3.09B, 7.61B, 14.7B, 32.5B parameters
    for name, billions in {"0.5b": 0.49, "3b": 3.09, "7b": 7.62, "14b": 14.77, "32b": 32.76}.items():
        assert SHAPES[name].params() / 1e9 == pytest.approx(billions, rel=0.01), name


def test_components_by_hand() -> None:
    s = Shape(hidden=8, layers=2, heads=2, kv_heads=1, intermediate=16, vocab=100, tied=True)
    P = s.params()
    assert s.layer_params() == 8 * 4 * (2 + 2) + 4 * (2 + 2) + 2 * 4 * 8 + 3 * 8 * 16 + 2 * 8
    assert P == 2 * s.layer_params() + 100 * 8 + 8
    e = estimate(s, Setup(ranks=4, sharded=True, compute_bytes=2, micro_batch_tokens=64, head_rows=10,
                          checkpointing=False, reference=False, attention="varlen", kv_repeat=False))
    assert e.components["params"] == e.components["grads"] == 4 * P / 4 and e.components["optimizer"] == 8 * P / 4
    assert e.components["activations"] == 64 * step_activation_bytes(s, 2, 2, False)
    assert e.components["head"] == 2 * 10 * 8 + 4 * 10 * 8 + 22 * 10 * 100 + 2 * 100 * 8
    assert "attention_mask" not in e.components and "reference" not in e.components
    sdpa = estimate(s, Setup(ranks=1, sharded=False, compute_bytes=4, micro_batch_tokens=64, row_len=32,
                             attention="sdpa"))
    assert sdpa.components["attention_mask"] == 64 * 32 and sdpa.components["gathered"] == 0


@pytest.mark.parametrize("preset", ["agentbench-qwen2.5-3b", "agentbench-qwen2.5-7b", "agentbench-qwen2.5-14b",
                                    "agentbench-qwen2.5-32b"])
def test_the_presets_fit_80_gb_gpus_with_the_margin(preset: str) -> None:
    """Every preset's trainer (its ranks, micro-batch, checkpointing, KL reference) within 85% of an 80 GB GPU."""
    cfg = load_config(preset)
    setup, gpu = preset_setup(cfg, 80)
    e = estimate(SHAPES[preset.rsplit("-", 1)[1]], setup)
    assert e.fits(gpu), (preset, e.gib())
    assert e.peak < 0.85 * 80 * GIB


@pytest.mark.parametrize("shape, tokens, measured_gib", [("0.5b", 16384, 63.4), ("0.5b", 4096, 21.7),
                                                         ("3b", 4096, 74.1)])
def test_the_model_predicts_the_peaks_measured_with_the_old_head(shape: str, tokens: int, measured_gib: float) -> None:
    """The H200 runs of docs/trainer.md (`gpu_check`: one rank, FSDP2 bf16, no activation checkpointing, no KL reference, SDPA,
    the whole-vocabulary head): torch.cuda.max_memory_allocated against the model's peak with the old head."""
    u = Setup(ranks=1, sharded=True, compute_bytes=2, micro_batch_tokens=tokens, head_rows=tokens // 2, row_len=2048,
              attention="sdpa", checkpointing=False, reference=False)
    predicted = estimate(SHAPES[shape], u).peak_old_head / GIB
    assert measured_gib <= predicted <= 1.1 * measured_gib, predicted
