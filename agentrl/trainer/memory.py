"""A memory model of one trainer rank: bytes per component for a decoder shape and the trainer's settings.

Pure arithmetic (no torch): `jobs.plan_pipeline --memory` runs it on a login node for every preset, and
`jobs.gpu_check` prints it beside the measured peak. What it counts, per rank, for Hugging Face Qwen2/Llama-style
decoders trained by `trainer.step` (P parameters, W ranks, T tokens per micro-batch, N of them through the head,
b the compute dtype's bytes: 2 for bf16, 4 for float32):

    params, grads, optimizer   float32 master weights, gradients, AdamW's two moments: 4P, 4P, 8P, each /W under
                               FSDP2 (DDP and one rank hold them whole)
    gathered                   FSDP2's unsharded compute copies (b bytes) of the root group (embedding, final norm,
                               untied head; held through forward and backward) and of two decoder layers (the one
                               running and the one prefetched), and their unsharded gradients before the
                               reduce-scatter; under DDP with bf16 autocast, the cast copy of the weights
    activations                what autograd keeps, per token and layer (`layer_activation_bytes`, checked against
                               the saved tensors of the real layers in tests/trainer/test_memory.py); with activation
                               checkpointing each layer keeps its input only, and one layer's whole set lives during
                               its recomputation
    attention_mask             SDPA on packed rows only: the materialised [R, 1, L, L] bool mask (T·L bytes)
    head                       the tiled head: the chosen hidden states (b·N·D), ∂h in float32 (4·N·D), a tile's
                               temporaries (~22 bytes per logit of `tile_elements`), the head's weight gradient
    reference                  the frozen KL model (algo.kl_coef > 0): its sharded weights in b bytes, its root group
                               gathered while it runs, one tile of its head

`peak` is the sum (the components coexist at the end of the last micro-batch's backward); `fits` leaves a margin
for what `torch.cuda.max_memory_allocated` does not see (CUDA context, NCCL buffers, fragmentation).
`old_head` is what the trainer's old whole-vocabulary head needed (16·T·V bytes at its backward:
the float32 log-softmax, its gradient, a temporary and the logits' gradient); `peak_old_head` swaps it in. With it
the model predicts the three peaks measured on an H200 with that head (docs/trainer.md) within +1% to +5%.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

GIB = 2**30
MARGIN = 0.15
"""Share of a GPU's memory a plan leaves free beyond the modelled peak (context, NCCL, allocator fragmentation)."""


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (Hugging Face config names in comments)."""

    hidden: int  # hidden_size
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    intermediate: int  # intermediate_size
    vocab: int  # vocab_size
    tied: bool  # tie_word_embeddings
    head_dim: int = 0  # head_dim (0: hidden // heads)
    qkv_bias: bool = True  # Qwen2: biases on q, k, v

    @property
    def d(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def layer_params(self) -> int:
        D, d = self.hidden, self.d
        qkv = D * d * (self.heads + 2 * self.kv_heads) + (d * (self.heads + 2 * self.kv_heads) if self.qkv_bias else 0)
        return qkv + self.heads * d * D + 3 * D * self.intermediate + 2 * D

    def root_params(self) -> int:
        """Embedding, final norm and (untied) head: FSDP2's root group."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def params(self) -> int:
        return self.layers * self.layer_params() + self.root_params()

    @classmethod
    def from_config(cls, path: str | Path) -> Shape:
        c = json.loads(Path(path).read_text())
        return cls(hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                   kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
                   intermediate=c["intermediate_size"], vocab=c["vocab_size"],
                   tied=bool(c.get("tie_word_embeddings", False)), head_dim=c.get("head_dim") or 0,
                   qkv_bias=bool(c.get("attention_bias", c.get("model_type") == "qwen2")))


# Qwen2.5's published configurations (config.json of each Hugging Face repository).
SHAPES = {
    "0.5b": Shape(896, 24, 14, 2, 4864, 151936, tied=True),
    "1.5b": Shape(1536, 28, 12, 2, 8960, 151936, tied=True),
    "3b": Shape(2048, 36, 16, 2, 11008, 151936, tied=True),
    "7b": Shape(3584, 28, 28, 4, 18944, 152064, tied=False),
    "14b": Shape(5120, 48, 40, 8, 13824, 152064, tied=False),
    "32b": Shape(5120, 64, 40, 8, 27648, 152064, tied=False),
}


@dataclass(frozen=True)
class Setup:
    """The trainer's settings that decide a rank's memory."""

    ranks: int = 1
    sharded: bool = True  # FSDP2 (else DDP / one rank)
    compute_bytes: int = 2  # 2: bf16 compute, 4: float32
    micro_batch_tokens: int = 16384
    head_rows: int = 0  # positions through the head per micro-batch (0: all of them, the worst case)
    row_len: int = 8192  # longest trajectory: packed rows are this long (the SDPA mask's L)
    attention: str = "varlen"  # varlen | flex | sdpa
    kv_repeat: bool = True  # varlen on torch 2.11: KV heads repeated to the query heads
    checkpointing: bool = True
    reference: bool = True  # a frozen KL reference (algo.kl_coef > 0)
    tile_elements: int = 1 << 26

    @property
    def residual_bytes(self) -> int:
        """The residual stream's dtype: FSDP2 computes in its parameter dtype; autocast (DDP, one rank) keeps the
        float32 embedding output in float32."""
        return self.compute_bytes if self.sharded else 4


def layer_activation_bytes(s: Shape, b: int, kv_repeat: bool = False) -> float:
    """Bytes autograd keeps per token for one decoder layer (Hugging Face's Qwen2/Llama layer, b-byte compute):

    2 RMSNorms, each its float32 input, its normalised value (b), its float32 1/rms (4) and its output, kept by the
    projections that read it (b); the attention kernel's q, k, v and output (k, v with the query's head count when
    repeated) and its float32 logsumexp (4 per head); the MLP's gate, SiLU(gate), up and their product (4·b·I)."""
    kv = s.heads if kv_repeat else s.kv_heads
    norms = 2 * ((4 + 2 * b) * s.hidden + 4)
    attn = b * s.d * (2 * s.heads + 2 * kv) + 4 * s.heads
    return norms + attn + 4 * b * s.intermediate


def step_activation_bytes(s: Shape, b: int, residual_bytes: int, checkpointing: bool, kv_repeat: bool = False
                          ) -> float:
    """Bytes per token autograd keeps for a whole forward: every layer's set (`layer_activation_bytes`), or with
    activation checkpointing each layer's input (the residual stream) plus one layer's set while it is recomputed;
    the final norm's float32 input, normalised value and 1/rms; the rotary cos and sin (b·d each); the token ids
    (8)."""
    layer = layer_activation_bytes(s, b, kv_repeat)
    final = (4 + b) * s.hidden + 4 + 2 * b * s.d + 8
    return (s.layers * residual_bytes * s.hidden + layer if checkpointing else s.layers * layer) + final


@dataclass
class Estimate:
    components: dict[str, float] = field(default_factory=dict)  # bytes
    old_head: float = 0.0

    @property
    def peak(self) -> float:
        return sum(self.components.values())

    @property
    def peak_old_head(self) -> float:
        """The peak with the trainer's old whole-vocabulary head instead of the tiled one."""
        return self.peak - self.components.get("head", 0.0) + self.old_head

    def fits(self, gpu_bytes: float, margin: float = MARGIN) -> bool:
        return self.peak <= (1 - margin) * gpu_bytes

    def gib(self) -> dict[str, float]:
        return {k: round(v / GIB, 2) for k, v in {**self.components, "peak": self.peak}.items()}


def estimate(s: Shape, u: Setup) -> Estimate:
    """Bytes per component of one rank's peak (see the module docstring)."""
    P, W = s.params(), (u.ranks if u.sharded else 1)
    b, T, D = u.compute_bytes, u.micro_batch_tokens, s.hidden
    N = u.head_rows or T
    e = Estimate()
    e.components["params"] = 4 * P / W
    e.components["grads"] = 4 * P / W
    e.components["optimizer"] = 8 * P / W
    if u.sharded:  # root group's and two layers' gathered weights and their unsharded gradients
        e.components["gathered"] = 2 * b * (s.root_params() + 2 * s.layer_params())
    else:  # autocast's cast copy of every weight (float32 compute casts nothing)
        e.components["gathered"] = b * P if b < 4 else 0.0
    e.components["activations"] = T * step_activation_bytes(s, b, u.residual_bytes, u.checkpointing,
                                                              u.kv_repeat and u.attention == "varlen")
    if u.attention == "sdpa":
        e.components["attention_mask"] = float(T * min(u.row_len, T))
    rows = max(1, min(N, u.tile_elements // min(s.vocab, 8192)))
    tile = rows * min(s.vocab, 8192)
    e.components["head"] = b * N * D + 4 * N * D + 22 * tile + b * s.vocab * D
    if u.reference:
        e.components["reference"] = b * P / W + (b * s.root_params() if u.sharded else 0) + 10 * tile
    # the old head's backward: the float32 log-softmax kept for it, its gradient, softmax's backward temporary and the
    # logits' gradient (its forward, log-softmax beside the float32 logits plus the entropy's copies, stays below)
    e.old_head = 16 * T * s.vocab
    return e


def preset_setup(cfg, gpu_gib: float) -> tuple[Setup, float]:
    """(Setup, GPU bytes) of a run config's trainer (`agentrl.config.RunConfig`): its ranks, parallel layout, mixed
    precision (auto is bf16 on the GPUs presets target), micro-batch, checkpointing, KL reference."""
    t, tr = cfg.trainer, cfg.cluster.trainer
    ranks = max(1, tr.nodes * tr.ranks_per_node)
    attention = "varlen" if t.attn_implementation == "auto" else t.attn_implementation
    setup = Setup(ranks=ranks, sharded=t.parallel == "fsdp2" and ranks > 1,
                  compute_bytes=4 if t.mixed_precision == "fp32" else 2, micro_batch_tokens=t.micro_batch_tokens,
                  row_len=cfg.rollout.max_model_len, attention=attention, checkpointing=t.activation_checkpointing,
                  reference=cfg.algo.kl_coef > 0)
    return setup, gpu_gib * GIB


def report(name: str, s: Shape, u: Setup, gpu_bytes: float) -> dict:
    """One plan's figures: the setup, each component and the peak in GiB, whether it fits with the margin."""
    e = estimate(s, u)
    return {"name": name, "params": s.params(), "setup": asdict(u), "gib": e.gib(),
            "old_head_gib": round(e.old_head / GIB, 1), "peak_old_head_gib": round(e.peak_old_head / GIB, 1),
            "gpu_gib": round(gpu_bytes / GIB, 1),
            "fits": e.fits(gpu_bytes), "headroom_gib": round(((1 - MARGIN) * gpu_bytes - e.peak) / GIB, 1)}
