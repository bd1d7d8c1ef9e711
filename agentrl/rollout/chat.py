"""The model's own conversation format: its chat template, its stop tokens and its tool-call parser.

Nothing here knows a model family. A trajectory's tokens are built the way the model's template renders
the conversation, without ever re-tokenizing what the model sampled:

    prompt       tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    each turn    the sampled ids, exactly as sampled (stop token included)
    observation  the template's *delta*: the conversation rendered with the new env messages and a
                 generation prompt, from the end of the last sampled turn on

To find where a sampled turn ends inside a rendering, every sampled turn stands in the rendered
conversation as an assistant message whose content is a marker (`SAMPLED` with a random nonce per
transcript: no template changes it, and neither the policy nor an env can write it; a fixed marker once let
an env echo crash the rank under `strict`); the delta is the text after the last marker. It starts with
whatever the template puts after an assistant message (Qwen's `<|im_end|>\\n`, Llama's `<|eot_id|>`, GLM's
next role token): when the model sampled that very token it is not repeated, otherwise (a turn cut at the
token limit, or ended on another stop token) the template's own turn end follows as context. Consecutive
env messages are rendered together, so templates that group tool results into one turn (Qwen2.5) or use
their own role for them (Llama's `ipython`) get their own rendering.

`Transcript.check` compares the finished episode with one whole re-render of the conversation: each
context segment must equal the template's rendering there. Templates whose rendering of earlier turns
depends on later ones (reasoning stripped from past turns, a date or counter in the system prompt) fail
it; `rollout.template_check` decides whether that raises (strict), is counted (warn) or is skipped (off).
What the check cannot see: the model's own tool-call text is kept as sampled, so a template that would
re-render a call differently (other JSON spacing) is not a mismatch; that is the sampled-ids contract.

Env text is encoded with special tokens off (a tool result saying `<|im_start|>assistant` is plain text, not
a forged turn; `env_text`), the prompt, each delta and the check alike.
"""
from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.config import OWN_TOOLS, chat_template_names, chat_template_text, own_tools
from agentrl.rollout.env_text import PlainText, Span, encode_spans, render_located
from agentrl.rollout.template_probe import (
    PLAIN_TEMPLATE,
    PROBE_TOOL,
    TEMPLATE_BY_TOKENS,
    choose_parser,
    probe,
    suggest_template,
)
from agentrl.rollout.tool_calls import ParsedTurn, ToolCallError, ToolCallParser
from agentrl.tasks.json_args import clean_text

log = logging.getLogger("agentrl.rollout.chat")

SAMPLED = "<<agentrl:sampled-turn>>"
"""The shape of the marker a sampled turn is rendered as (each `Transcript` adds a random nonce)."""
CHECK_MODES = ("strict", "warn", "off")


class TemplateMismatch(RuntimeError):
    """An episode's tokens differ from the whole re-render of its conversation (`rollout.template_check: strict`)."""


def model_stop_ids(tokenizer: Any, model_dir: str | Path | None, extra: tuple[str, ...] = ()) -> tuple[int, ...]:
    """Stop ids: the tokenizer's eos, `generation_config.json`'s eos_token_id (one or a list) and `extra` token
    strings (`model.stop_tokens`; one the vocabulary lacks is an error naming it)."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    gen = Path(model_dir) / "generation_config.json" if model_dir is not None else None
    if gen is not None and gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids += [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    vocab = tokenizer.get_vocab()
    for t in extra:
        if t not in vocab:
            raise ValueError(f"model.stop_tokens: {t!r} is not in the tokenizer's vocabulary")
        ids.append(int(vocab[t]))
    out = tuple(dict.fromkeys(ids))
    if not out:
        raise ValueError("model.stop_tokens: the model has no eos token (tokenizer or generation_config.json); "
                         "name its end-of-turn token in model.stop_tokens")
    return out


def template_error(source: str, problems: list[str], vocab: dict[str, int], template: str,
                   own_fits: bool = False) -> str:
    """Why the chat template of `source` cannot run a tool-using task, and what to set instead (`own_fits`: the
    template passes the probe once own-tools rewrites the messages before it)."""
    fits = suggest_template(vocab, template)
    fix = (f"Set model.chat_template={fits[0]} (agentrl's tool-capable template for {', '.join(fits[1])} turns, "
           "which this model has)" if fits else
           f"Set model.chat_template={PLAIN_TEMPLATE} (agentrl's template of plain-text System/User/Assistant turns, "
           "each of the model's closed by its eos token: for a base model whose vocabulary has no chat turn tokens)"
           if not template else
           f"Set model.chat_template={OWN_TOOLS} (the model's own turns: the tools, calls and results written into "
           "the system, assistant and user messages its template renders)" if own_fits else
           "Set model.chat_template to a template that lays out `tools`, writes `tool_calls` and shows `tool` "
           "results: a .jinja file or a model directory whose template does (agentrl's own, for other families' "
           f"turns: {', '.join(chat_template_names())}; docs/models.md says what a template needs)")
    return (f"model.chat_template: the chat template of {source} cannot run a tool-using task: {'; '.join(problems)}. "
            f"{fix}. jobs.train, jobs.eval and jobs.check_model all take model.chat_template=...")


def check_turn_tokens(name: str, tokenizer: Any, model_dir: str | Path) -> None:
    """One of agentrl's family templates (`name`) on a tokenizer without that family's turn tokens is an error:
    the model would read the turn markers as plain text it never saw, and never stop on the turn's end."""
    tokens = next((t for t, n in TEMPLATE_BY_TOKENS if n == name), ())
    vocab = tokenizer.get_vocab()
    missing = [t for t in tokens if t not in vocab]
    if not missing:
        return
    own = getattr(tokenizer, "chat_template", None)
    fits = suggest_template(vocab, own if isinstance(own, str) else "")
    instead = f"{fits[0]} (this model's {', '.join(fits[1])} turns)" if fits else \
        f"{OWN_TOOLS} (the model's own template, given the tools)" if own else \
        f"{PLAIN_TEMPLATE} (plain-text turns closed by the model's eos: it has no template and no turn tokens)"
    raise ValueError(f"model.chat_template={name} writes turns of {', '.join(tokens)}, and the tokenizer of "
                     f"{model_dir} has no {', '.join(missing)} token: the model would read those markers as text it "
                     f"never saw and never stop on its turn end. Set model.chat_template={instead}, or a template "
                     "file of your own")


def _own_tools_fit(tokenizer: Any, kwargs: dict[str, Any]) -> bool:
    """Whether the tokenizer's template, given tools by own-tools, passes the probe."""
    wrapped = own_tools(str(tokenizer.chat_template))

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen,
                                             chat_template=wrapped, **kwargs)

    features = probe(render)
    return not features.problems() and features.call_text is not None


@dataclass
class ChatFormat:
    """A tokenizer with its chat template, stop ids and tool parser: everything the rollout needs of a model."""

    tokenizer: Any
    parser: ToolCallParser
    stop_ids: tuple[int, ...]
    check_mode: str = "warn"
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    parser_note: str = ""
    """How the tool parser was chosen: what the template writes, the vocabulary's call tokens, the model type."""
    turn_end: int | None = None
    """The special token the template writes after an assistant turn (`turn_end_id`), one of `stop_ids`; None
    when it writes text there (no stop token can end such a turn: `jobs.check_model` fails)."""

    def __post_init__(self) -> None:
        self._backend = _plain_backend(self.tokenizer, ("encode", "_encode_plus"))
        self._decoder = _plain_backend(self.tokenizer, ("decode", "_decode"))
        self.plain = PlainText(self.tokenizer, getattr(self.tokenizer, "backend_tokenizer", None))
        """Env text's encoder: special tokens off (`env_text`)."""

    @classmethod
    def load(cls, model_dir: str | Path, tool_parser: str = "auto", stop_tokens: tuple[str, ...] = (),
             check_mode: str = "warn", template_kwargs: dict[str, Any] | None = None,
             chat_template: str = "") -> ChatFormat:
        """The format of the Hugging Face model directory `model_dir`; `chat_template` (`model.chat_template`:
        a NAME of agentrl's templates, a file or a model directory) replaces the directory's own template."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        if chat_template:
            check_turn_tokens(chat_template, tokenizer, model_dir)
            tokenizer.chat_template = chat_template_text(chat_template, model_dir)
        cfg_file = Path(model_dir) / "config.json"
        model_type = json.loads(cfg_file.read_text()).get("model_type", "") if cfg_file.exists() else ""
        source = f"{model_dir}" + (f" with model.chat_template={chat_template}" if chat_template else "")
        return cls.of(tokenizer, tool_parser, model_stop_ids(tokenizer, model_dir, stop_tokens), check_mode,
                      template_kwargs, model_type, source)

    @classmethod
    def of(cls, tokenizer: Any, tool_parser: str = "auto", stop_ids: tuple[int, ...] | None = None,
           check_mode: str = "warn", template_kwargs: dict[str, Any] | None = None,
           model_type: str = "", source: str = "the model") -> ChatFormat:
        """The format of a tokenizer object (stop ids default to its eos alone). Its template is probed first
        (`template_probe`): one that cannot show the model tools, write its calls or show their results fails
        here, naming the template to set; then the tool parser is the one that reads the template's calls."""
        if check_mode not in CHECK_MODES:
            raise ValueError(f"rollout.template_check: {check_mode!r} is not one of {', '.join(CHECK_MODES)}")
        vocab = tokenizer.get_vocab()
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError(template_error(source, ["it has none (tokenizer_config.json `chat_template`, or "
                                                     "chat_template.jinja)"], vocab, ""))
        kwargs = dict(template_kwargs or {})

        def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
            return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen,
                                                 **kwargs)

        features = probe(render)
        problems = features.problems()
        if problems or features.call_text is None:
            raise ValueError(template_error(source, problems, vocab, str(template), _own_tools_fit(tokenizer, kwargs)))
        parser, note = choose_parser(tool_parser, tokenizer, model_type, features.call_text)
        log.info("%s: tool parser %s", source, note)
        stops = stop_ids if stop_ids is not None else model_stop_ids(tokenizer, None)
        fmt = cls(tokenizer, parser, tuple(stops), check_mode, kwargs, note)
        # The template's own turn end is a stop whatever the directory lists: a base model's generation_config
        # names only its eos, and under a template of ours (or any chosen one) every turn would otherwise run
        # to max_new_tokens, past the <end_of_turn> it wrote.
        fmt.turn_end = fmt.turn_end_id()
        if fmt.turn_end is not None and fmt.turn_end not in fmt.stop_ids:
            log.info("%s: the template's turn end %r is a stop token too", source,
                     tokenizer.convert_ids_to_tokens(fmt.turn_end))
            fmt.stop_ids = (*fmt.stop_ids, fmt.turn_end)
        return fmt

    # ------------------------------------------------------------------ rendering
    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  **self.template_kwargs)

    def encode(self, text: str) -> list[int]:
        """`tokenizer.encode(text, add_special_tokens=False)`. For a fast tokenizer whose encoding transformers
        does not change, straight from its Rust backend, as transformers itself calls it (the same ids) but
        without its Python around the call (padding/truncation strategies, batch conversions: most of the cost
        of the short texts each turn encodes); while no padding or truncation is set on the backend."""
        b = self._backend
        if (b is not None and b.truncation is None and b.padding is None
                and b.encode_special_tokens == self.tokenizer.split_special_tokens):
            return b.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """`tokenizer.decode(ids, skip_special_tokens=False)`; from the backend, as transformers calls it, when
        its class keeps transformers' decoding and does not clean up spaces afterwards (that would change text)."""
        if self._decoder is not None and isinstance(ids, list) and not self.tokenizer.clean_up_tokenization_spaces:
            return self._decoder.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def assistant_ids(self, msg: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[int]:
        """`msg` as the model would write it after a generation prompt, ending with the token the template
        puts after it (the scripted expert's demonstrations, which the warm start imitates)."""
        base = [{"role": "user", "content": "?"}]
        follow = [{"role": "tool", "content": "."}] if msg.get("tool_calls") else [{"role": "user", "content": "."}]
        msg = _canonical_arguments(msg)
        head = self.render(base, tools, add_generation_prompt=True)
        marker = f"<<agentrl:sampled-turn:{secrets.token_hex(8)}>>"  # not in any tool's text: a fresh nonce
        marked = self.render(base + [{"role": "assistant", "content": marker}] + follow, tools, False)
        before, after = marked.split(marker, 1)
        whole = self.render(base + [msg] + follow, tools, False)
        if not (whole.startswith(before) and whole.endswith(after)) or not before.startswith(head):
            raise ValueError("the chat template renders an assistant message where the marker test cannot find it")
        body = whole[len(before):len(whole) - len(after)] if after else whole[len(before):]
        ids = self.encode(before[len(head):] + body)
        end = self.encode(after)[:1]
        return ids + end if end and end[0] in self._special_ids() else ids

    def turn_end_id(self) -> int | None:
        """The special token the template writes right after an assistant turn's text (whitespace before it
        skipped): ChatML's `<|im_end|>`, Llama-3's `<|eot_id|>`, Gemma's `<end_of_turn>`, Phi-3's `<|end|>`, a
        Zephyr-style `</s>`, GLM's next role token. None when the template writes plain text there."""
        marker = f"<<agentrl:sampled-turn:{secrets.token_hex(8)}>>"
        talk = [{"role": "user", "content": "?"}, {"role": "assistant", "content": marker},
                {"role": "user", "content": "."}]
        after = self.render(talk, [PROBE_TOOL], False).split(marker, 1)[-1].lstrip()
        end = self.encode(after)[:1]
        return end[0] if end and end[0] in self._special_ids() else None

    def _special_ids(self) -> set[int]:
        return set(self.tokenizer.all_special_ids) | {i for i, t in self.tokenizer.added_tokens_decoder.items()
                                                       if t.special}

    # ------------------------------------------------------------------ parsing
    def parse(self, ids: list[int], tools: list[dict[str, Any]], call_id_prefix: str = "call") -> ParsedTurn:
        """A sampled turn's content and tool calls (its stop token dropped first, as vLLM's server does)."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.parser.parse(self.decode(ids), tools, call_id_prefix)

    def error_observation(self, errors: list[ToolCallError]) -> list[dict[str, Any]]:
        """The rollout's own answer to unreadable calls: the errors and the family's call syntax, whose markers
        (`<tool_call>`, special in some tokenizers) stay the model's tokens (`Transcript.observation_ids`
        with `own=True`); an error that quotes a special token's string of the model's (a tool name) other
        than the family's call markers has it defused."""
        quoted = [ToolCallError(e.text, self.plain.defuse(e.message)) if self.plain.holds(self._unmarked(e.message))
                  else e for e in errors]
        return [{"role": "tool", "content": self.parser.format_errors(quoted)}]

    def _unmarked(self, text: str) -> str:
        for marker in (*self.parser.markers, "</tool_call>"):
            text = text.replace(marker, "")
        return text


def _plain_backend(tokenizer: Any, methods: tuple[str, ...]) -> Any:
    """The `tokenizers.Tokenizer` behind `tokenizer` when transformers' `methods` are a plain call of it: a fast
    tokenizer (`TokenizersBackend`) whose class keeps transformers' own `methods`; else None (a slow tokenizer,
    or a class that adds handling of its own: `ChatFormat` then calls transformers)."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    if not isinstance(tokenizer, TokenizersBackend):
        return None
    if any(getattr(type(tokenizer), m) is not getattr(TokenizersBackend, m) for m in methods):
        return None
    return getattr(tokenizer, "_tokenizer", None)


def _canonical_arguments(msg: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments as objects, as transformers' chat templates expect them (the OpenAI wire format
    carries a JSON string; templates such as GLM's iterate the arguments' items)."""
    calls = msg.get("tool_calls")
    if not calls:
        return msg
    out = []
    for c in calls:
        args = c["function"].get("arguments") or "{}"
        args = json.loads(args) if isinstance(args, str) else args
        out.append({**c, "function": {**c["function"], "arguments": args}})
    return {**msg, "tool_calls": out}


_TURN: dict[str, Any] = {"role": "assistant", "content": ""}
"""A sampled turn's place in `Transcript.messages`: rendered as an assistant message holding the marker."""


def _new_nonce() -> str:
    return secrets.token_hex(8)


class Transcript:
    """One episode's conversation as the template sees it, beside the token segments built from it.

    Sampled turns are rendered as an assistant message whose content is this transcript's marker,
    `<<agentrl:sampled-turn:NONCE>>` with a random nonce: no policy or env can write it (an env text that
    holds the nonce gets the transcript a new one). Env text is encoded with special tokens off
    (`env_text`), and loses any unpaired surrogate (U+FFFD) on the way in."""

    def __init__(self, fmt: ChatFormat, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 max_prompt: int | None = None) -> None:
        self.fmt, self.tools = fmt, tools
        self._hot: dict[int, tuple[Any, bool]] = {}  # id(message) -> (its content, holds special tokens' text)
        self._own: set[int] = set()  # ids of the rollout's own messages in `messages` (error observations)
        self.nonce = _new_nonce()
        self._tools_text = json.dumps(tools, ensure_ascii=False)
        self.messages = self._env(messages)
        text, spans = self._render(self.messages, True)
        prompt = self._encode(text, spans)
        self.prompt = prompt[:max_prompt] if max_prompt is not None else prompt
        self.segments: list[tuple[str, list[int]]] = [("context", list(self.prompt))]
        # What each context segment was encoded from (its text, and for a delta the sampled turn it followed):
        # `check` encodes a piece of the whole render again only where that text differs.
        self._sources: list[tuple[str, list[int] | None] | None] = [(text, None)]
        self._delta: tuple[list[int], str, list[int]] | None = None  # the last observation_ids: ids, text, turn

    @property
    def marker(self) -> str:
        return f"<<agentrl:sampled-turn:{self.nonce}>>"

    def _env(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Env messages as rendered: unpaired surrogates replaced; a new nonce if one of them holds it."""
        out = [{**m, "content": clean_text(m["content"])} if isinstance(m.get("content"), str) else m
               for m in messages]
        while any(self.nonce in str(m.get("content", "")) for m in out) or self.nonce in self._tools_text:
            self.nonce = _new_nonce()
        return out

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                own: frozenset[int] = frozenset()) -> tuple[str, list[Span]]:
        """The template's text of `messages` (sampled turns as the marker) and where the env text that holds
        special tokens' strings lies in it (`env_text.render_located`); the rollout's own messages (ids in
        `self._own` or `own`) are not env text."""
        shown = [{"role": "assistant", "content": self.marker} if m is _TURN else m for m in messages]
        hot = []
        for i, m in enumerate(messages):
            if m is not _TURN and id(m) not in self._own and id(m) not in own:
                content = m.get("content")
                seen = self._hot.get(id(m))
                if seen is None or seen[0] is not content:  # ids are reused once a message is gone
                    seen = self._hot[id(m)] = (content, self.fmt.plain.holds(content))
                if seen[1]:
                    hot.append(i)
        return render_located(lambda ms: self.fmt.render(ms, self.tools, add_generation_prompt), shown, hot,
                              self.nonce, self.fmt.plain)

    def _encode(self, text: str, spans: list[Span], lo: int = 0, hi: int | None = None) -> list[int]:
        return encode_spans(self.fmt.encode, self.fmt.plain, text, spans, lo, hi)

    def sampled(self, ids: list[int]) -> None:
        self.segments.append(("sampled", list(ids)))
        self._sources.append(None)
        self.messages.append(_TURN)

    def observation_ids(self, messages: list[dict[str, Any]], own: bool = False) -> list[int]:
        """The template's delta for env `messages` after the last sampled turn (not yet added); `own`: the
        rollout's own messages (`ChatFormat.error_observation`), encoded as the template's text."""
        messages = self._env(messages)
        text, spans = self._render(self.messages + messages, True, frozenset(map(id, messages)) if own else frozenset())
        start = text.rindex(self.marker) + len(self.marker)
        turn = self.segments[-1][1]
        ids = self._after_turn(self._encode(text, spans, start), turn)
        self._delta = (ids, text[start:], turn)
        return ids

    def observed(self, messages: list[dict[str, Any]], ids: list[int], own: bool = False) -> None:
        messages = self._env(messages)
        if own:
            self._own.update(map(id, messages))
        self.messages += messages
        self.segments.append(("context", list(ids)))
        d, self._delta = self._delta, None
        self._sources.append((d[1], d[2]) if d is not None and d[0] is ids else None)

    def _after_turn(self, tail: list[int], turn: list[int] | None = None) -> list[int]:
        last = turn if turn is not None else self.segments[-1][1]
        return tail[1:] if tail and last and last[-1] == tail[0] else tail

    def check(self) -> list[str]:
        """Where this episode's context tokens differ from one whole re-render of its conversation ([] if nowhere)."""
        ends_open = self.messages[-1] is not _TURN and self.messages[-1]["role"] != "assistant" \
            if self.messages else True
        whole, spans = self._render(self.messages, ends_open)
        cuts, at = [], whole.find(self.marker)
        while at >= 0:
            cuts.append(at)
            at = whole.find(self.marker, at + len(self.marker))
        bounds = list(zip([0] + [c + len(self.marker) for c in cuts], cuts + [len(whole)]))
        turns = [ids for kind, ids in self.segments if kind == "sampled"]
        if len(bounds) != len(turns) + 1:
            return [f"the whole render holds {len(bounds) - 1} sampled turns, the episode {len(turns)}"]
        problems = []
        # A piece equal to the text a segment was encoded from encodes to that segment again: skip it.
        if self._sources[0] is None or whole[slice(*bounds[0])] != self._sources[0][0]:
            want0 = self._encode(whole, spans, *bounds[0])
            if want0[:len(self.prompt)] != self.prompt:
                problems.append(_diff("prompt", self.prompt, want0, self.fmt))
        turn_i = 0
        for (kind, ids), source in zip(self.segments[1:], self._sources[1:]):
            if kind == "sampled":
                turn_i += 1
                continue
            lo, hi = bounds[turn_i]
            if source is not None and source[0] == whole[lo:hi] and source[1] == turns[turn_i - 1]:
                continue
            want = self._after_turn(self._encode(whole, spans, lo, hi), turns[turn_i - 1])
            if ids != want:
                problems.append(_diff(f"after turn {turn_i}", ids, want, self.fmt))
        return problems

    def verify(self, task: str) -> int:
        """Run the check as `check_mode` says; returns the number of mismatched segments (0 when off)."""
        if self.fmt.check_mode == "off":
            return 0
        problems = self.check()
        if problems and self.fmt.check_mode == "strict":
            raise TemplateMismatch(f"{task}: the episode's tokens differ from the chat template's whole rendering: "
                                   + "; ".join(problems))
        for p in problems:
            log.warning("template mismatch (%s): %s", task, p)
        return len(problems)


def _diff(where: str, got: list[int], want: list[int], fmt: ChatFormat) -> str:
    k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return (f"{where}: token {k} of {len(got)} differs (episode {fmt.decode(got[k:k + 12])!r}, "
            f"template {fmt.decode(want[k:k + 12])!r})")
