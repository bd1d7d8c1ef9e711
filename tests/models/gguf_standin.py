"""A stand-in GGUF file: a stand-in Llama-architecture directory (`agentrl.models.standins`) written in llama.cpp's
format with the `gguf` package, float32 tensors and its byte-level BPE as a `gpt2` tokenizer, with or without a
chat template. Enough for transformers' GGUF reader (config, tokenizer, tensors), so `jobs.make_model --from-gguf`
runs on it in seconds. The q/k tensors are written as they are (llama.cpp's converter permutes them and
transformers permutes them back): the converted model is another random model, which is all a test needs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _gguf_name(name: str) -> str:
    if name in _NAMES:
        return _NAMES[name]
    _, _, i, rest = name.split(".", 3)  # model.layers.<i>.<module>.weight
    return f"blk.{i}.{_LAYER[rest.rsplit('.', 1)[0]]}.weight"


def write_gguf(model_dir: Path, out: Path, chat_template: str | None = None) -> Path:
    """`model_dir` (a Llama-architecture stand-in) as a GGUF file at `out`."""
    import gguf
    from safetensors.torch import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = {**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    gen = json.loads((model_dir / "generation_config.json").read_text())
    eos = gen["eos_token_id"][0] if isinstance(gen["eos_token_id"], list) else gen["eos_token_id"]

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("agentrl stand-in")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(float(cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.get("bos_token_id") or 0)
    w.add_eos_token_id(eos)
    if chat_template:
        w.add_chat_template(chat_template)
    for name, t in load_file(str(model_dir / "model.safetensors")).items():
        w.add_tensor(_gguf_name(name), t.to(torch.float32).numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
