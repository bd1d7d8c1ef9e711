"""A tiny Qwen2-architecture causal LM and a byte-level BPE tokenizer, built offline.

Nothing comes from a model hub: the tokenizer is trained with `tokenizers` on text the caller supplies
(the project renders its tasks' conversations), the model is randomly initialised, and both are saved in
Hugging Face format so that transformers and vLLM load the directory like any other checkpoint.
This module knows nothing of tasks or chat formats; the caller passes the special tokens and template.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

# The pre-tokenization of Qwen2 (digits one by one, a letter run may take one leading symbol). transformers
# rebuilds every `qwen2` model directory's tokenizer with it (AutoTokenizer -> Qwen2Tokenizer, whatever
# tokenizer.json says), and vLLM loads tokenizers the same way, so the merges must be learned with it.
_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
          r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def train_tokenizer(corpus: Iterable[str], vocab_size: int, special_tokens: list[str],
                    chat_template: str, eos_token: str, pad_token: str,
                    whole_tokens: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Byte-level BPE over `corpus`; special tokens get the first ids, then the 256 byte symbols.

    `whole_tokens` are strings that always become one (non-special) token, e.g. fixed tool-call JSON.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    extra = [t for t in special_tokens if t not in (eos_token, pad_token)]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos_token, pad_token=pad_token,
                                   additional_special_tokens=extra)
    if whole_tokens:
        fast.add_tokens([AddedToken(t, normalized=False, special=False) for t in whole_tokens])
    fast.chat_template = chat_template
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast, hidden_size: int, num_layers: int, num_heads: int,
                intermediate_size: int, max_position: int, seed: int,
                rope_theta: float = 10000.0, copy_init: float = 0.0,
                stop_tokens: tuple[str, ...] = ()) -> Qwen2ForCausalLM:
    """A random-init Qwen2 with tied embeddings (so tokens seen only in context can still be emitted).

    `copy_init` > 0 starts the first layer's attention as copy heads (see `init_copy_heads`). `stop_tokens`
    (end of turn, end of text) go into its generation config's eos_token_id, where vLLM's server, transformers'
    `generate` and our rollout all read them."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_position, tie_word_embeddings=True, rope_theta=rope_theta, rms_norm_eps=1e-6,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    if stop_tokens:
        model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(t) for t in stop_tokens]
    if copy_init > 0:
        init_copy_heads(model, copy_init)
    return model


@torch.no_grad()
def init_copy_heads(model: Qwen2ForCausalLM, scale: float) -> None:
    """Start the first layer's value and output projections as identities (value scaled by `scale`).

    Tool use is copying: a name from the question into a call, a value from a tool result into the answer.
    A randomly initialised model has to discover copying on its own, and does so in a sudden transition
    whose step moves from machine to machine (measured here on the `unlock` task: the one-token copy from
    a tool result not yet learned after 600 warm-start steps of 32 episodes). With W_O W_V = I, whatever
    a head attends to is added to the residual stream as its own embedding, which the tied unembedding
    reads back as that same token: every head of the layer is a copy head from step 0, and training only
    has to learn where to look (the same copy formed by step ~150 on the same data; all three of
    `lookup`'s by step ~100). The query/key projections stay random.
    """
    attn = model.model.layers[0].self_attn
    hidden = model.config.hidden_size
    if attn.v_proj.weight.shape != (hidden, hidden) or attn.o_proj.weight.shape != (hidden, hidden):
        raise ValueError("copy heads need as many key/value heads as attention heads (v_proj hidden x hidden)")
    attn.v_proj.weight.copy_(torch.eye(hidden) * scale)
    attn.o_proj.weight.copy_(torch.eye(hidden))


def save(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: str | Path,
         probe: str | None = None) -> Path:
    """Save in Hugging Face format; if `probe` text is given, check the directory's tokenizer as
    transformers (and so vLLM) will load it splits `probe` into the same ids as `tokenizer` does.
    The directory appears whole or not at all (written aside, then renamed): a run continued after a crash
    finds either a complete model or none."""
    out = Path(out_dir)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if probe is not None:
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(str(tmp))
        want, got = tokenizer.encode(probe), loaded.encode(probe)
        if want != got:
            raise RuntimeError(f"the saved tokenizer loads as {type(loaded).__name__} and splits text differently "
                               f"({len(got)} ids instead of {len(want)}); tokens would not match training")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
