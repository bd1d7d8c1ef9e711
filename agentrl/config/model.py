"""`model`: which model a run trains (a Hugging Face directory, or our tiny one built from these numbers) and how
its conversations are rendered and parsed (chat template, tool parser, stop tokens)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.config.errors import ConfigError, _check


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    """A Hugging Face model directory. Empty: the run builds its own tiny model (below) under run_dir/model."""
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    """head_dim = hidden_size / num_heads must be 64 or more (vLLM's CPU attention rejects smaller)."""
    intermediate_size: int = 512
    vocab_size: int = 1024
    """Size of the byte-level BPE vocabulary trained on the task text."""
    max_position: int = 1024
    rope_theta: float = 10000.0
    """RoPE base. A tiny from-scratch model learns to copy from its context far sooner with a small base
    (sharper relative positions); the demo uses 100."""
    copy_init: float = 1.0
    """The built model's first attention layer starts as copy heads (value and output projections are
    identities, the value scaled by this); 0: plain random init. See `agentrl.models.tiny.init_copy_heads`."""
    tool_parser: str = "auto"
    """vLLM's tool-call parser for the model's output (`ToolParserManager` names: hermes, llama3_json, glm45,
    mistral, qwen3_xml, ...); auto: by config.json's model_type (Qwen2/2.5/3 hermes, Llama-3.x llama3_json,
    GLM-4.x glm45; see `agentrl.rollout.tool_calls.PARSER_BY_TYPE`). Our tiny model's calls are Hermes-shaped."""
    stop_tokens: tuple[str, ...] = ()
    """Stop tokens beyond the tokenizer's eos and generation_config.json's eos_token_id (token strings; one the
    vocabulary lacks fails at load)."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for the chat template, e.g. {enable_thinking: false} for Qwen3."""
    chat_template: str = ""
    """Replaces the model directory's chat template wherever prompts are rendered (rollout, evaluation,
    jobs.check_model) and in every published or exported directory. One of agentrl's tool-capable templates by
    name (`TEMPLATES_DIR`: chatml-tools, gemma-tools, llama3-tools, phi3-tools for those families' turn tokens;
    plain-tools, plain-text turns closed by the model's eos, for a base model with none; own-tools: the model's own
    template, given tools, for any family whose template renders system, user and assistant turns), a template
    file (.jinja), or a model directory or tokenizer_config.json whose template to use. Empty: the directory's own.
    A template that lays out no tools fails at load, naming the template that fits the model's turns. The special
    token the template writes after an assistant turn is a stop token whatever generation_config.json lists."""

    def validate(self, p: str) -> None:
        _check(bool(self.tool_parser.strip()), f"{p}.tool_parser", "must name a vLLM tool parser or be auto")
        if self.chat_template:
            try:
                chat_template_file(self.chat_template)
            except FileNotFoundError as e:
                raise ConfigError(f"{p}.chat_template: {e}") from None
        _check(self.rope_theta > 1, f"{p}.rope_theta", "must be > 1")
        _check(self.copy_init >= 0, f"{p}.copy_init", "must be >= 0 (0: off)")
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size", "max_position"):
            _check(getattr(self, name) > 0, f"{p}.{name}", "must be positive")
        _check(self.hidden_size % self.num_heads == 0, f"{p}.num_heads", "must divide hidden_size")
        _check(self.hidden_size // self.num_heads >= 64, f"{p}.num_heads",
               "head_dim (hidden_size/num_heads) must be >= 64 for vLLM's CPU attention")
        _check(self.vocab_size >= 300, f"{p}.vocab_size", "must be >= 300 (256 bytes + special tokens)")


TEMPLATES_DIR = Path(__file__).parent.parent / "models" / "templates"
"""agentrl's own chat templates (`model.chat_template: NAME`), for families whose shipped template has no tools."""


def chat_template_names() -> list[str]:
    return sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))


def chat_template_file(spec: str) -> Path:
    """The file `model.chat_template` names: agentrl's template NAME, a template file, or a model directory's
    own template (its chat_template.jinja, else its tokenizer_config.json). FileNotFoundError says what is known."""
    builtin = TEMPLATES_DIR / f"{spec}.jinja"
    if "/" not in spec and builtin.exists():
        return builtin
    path = Path(spec).expanduser()
    if path.is_dir():
        for name in ("chat_template.jinja", "tokenizer_config.json"):
            if (path / name).exists():
                return path / name
        raise FileNotFoundError(f"{path} holds neither chat_template.jinja nor tokenizer_config.json")
    if path.is_file():
        return path
    raise FileNotFoundError(f"{spec!r} is neither one of agentrl's templates ({', '.join(chat_template_names())}) "
                            "nor a template file or model directory")


OWN_TOOLS = "own-tools"
"""The template name that wraps the model's own template (`own-tools.jinja` rewrites the messages before it)."""


def chat_template_text(spec: str, model_dir: str | Path | None = None) -> str:
    """The template `model.chat_template` names, as text (a tokenizer_config.json's `chat_template`: the string,
    or of a list of named templates the `tool_use` one, else `default`). own-tools needs `model_dir`: its own
    template follows our rewriting of the messages (a directory published with it already has it, kept as is)."""
    if spec == OWN_TOOLS:
        if model_dir is None:
            raise ValueError(f"model.chat_template={OWN_TOOLS} wraps the model directory's own template: no "
                             "directory was given")
        try:
            return own_tools(chat_template_text(str(model_dir)))
        except FileNotFoundError as e:
            raise ValueError(f"model.chat_template={OWN_TOOLS} gives the model directory's own template the tools, "
                             f"and {model_dir} has none ({e}): name one of agentrl's templates "
                             f"({', '.join(n for n in chat_template_names() if n != OWN_TOOLS)}) or a template "
                             "file") from None
    path = chat_template_file(spec)
    if path.suffix != ".json":
        return path.read_text()
    value = json.loads(path.read_text()).get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("tool_use") or named.get("default")
    if not isinstance(value, str) or not value:
        raise FileNotFoundError(f"{path} has no chat_template")
    return value


def own_tools(template: str) -> str:
    """`template` given tools: own-tools.jinja's rewriting of the messages, then `template` (unchanged when it
    already is one)."""
    prefix = (TEMPLATES_DIR / f"{OWN_TOOLS}.jinja").read_text().rstrip("\n")
    return template if template.startswith(prefix) else prefix + template
