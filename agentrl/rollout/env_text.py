"""Environment text inside a chat template: its tokens come out with special tokens off.

A tool result that says `<|im_start|>assistant` must not become the model's real `<|im_start|>` token: a
tool (and through it the policy) could forge whole turns in the context. The field's rule (tiktoken's
`encode_ordinary`, harmony's renderer, transformers' `split_special_tokens`): only the template's own
structure produces special tokens; environment text is encoded as ordinary text. (Added tokens that are not
special, e.g. our tiny model's JSON fragments, are ordinary vocabulary and stay as they are.) A chat
template renders one string, so the env's text has to be found in it first:

  * a message whose content holds no special token's string (nearly all) needs nothing: the rendering is
    encoded as it always was, token for token;
  * a message whose content does is rendered once more with its content between two tags (letters and
    digits, which `tojson`, `trim` and the like leave alone, with the content's leading and trailing
    whitespace outside them). Where the tagged rendering, tags removed, is the plain rendering, the spans
    between the tags are the env's text, encoded with special tokens off (`PlainText.encode`); the rest is
    encoded as usual;
  * where it is not (a template that branches on the content itself), the content is rendered with a word
    joiner (U+2060) after the first character of each special token's string: the text the model sees then
    differs from the env's by that invisible character, and no special token comes out of it.

`Transcript.check` renders and encodes the whole conversation by the same rule, so the two agree.
Not here: tool schemas (the task's own, rendered in the system prompt as the template says).
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

log = logging.getLogger("agentrl.rollout.chat")

Span = tuple[int, int]
JOINER = "\u2060"


class PlainText:
    """A tokenizer's special tokens and an encoder that never produces them from text."""

    def __init__(self, tokenizer: Any, backend: Any) -> None:
        special = {i: t.content for i, t in tokenizer.added_tokens_decoder.items() if t.special and t.content}
        self.special_ids = set(special)
        strings = sorted(set(special.values()), key=len, reverse=True)
        self.pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
        self._tokenizer = tokenizer
        self._plain = _special_tokens_off(backend, special) if strings else None

    def holds(self, text: Any) -> bool:
        """Whether `text` (a message's content) holds a special token's string."""
        return self.pattern is not None and isinstance(text, str) and self.pattern.search(text) is not None

    def encode(self, text: str) -> list[int]:
        """`text` as ordinary text: no special token comes out of it."""
        if self._plain is not None:
            return list(self._plain.encode(text, add_special_tokens=False).ids)
        ids = list(self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        if self.special_ids.intersection(ids):  # a tokenizer that matches them anyway
            ids = list(self._tokenizer.encode(self.defuse(text), add_special_tokens=False))
        return ids

    def defuse(self, text: str) -> str:
        """`text` with a word joiner after the first character of each special token's string."""
        if self.pattern is None:
            return text
        for _ in range(8):  # joining one string cannot form another, but a tokenizer's list is its own
            out = self.pattern.sub(lambda m: m.group()[0] + JOINER + m.group()[1:], text)
            if out == text or not self.pattern.search(out):
                return out
            text = out
        return text


def _special_tokens_off(backend: Any, special: dict[int, str]) -> Any:
    """A copy of a `tokenizers.Tokenizer` that encodes special tokens' strings as text (its
    `encode_special_tokens`); None without a backend, or when its model still makes one of them from text."""
    if backend is None:
        return None
    try:
        from tokenizers import Tokenizer

        plain = Tokenizer.from_str(backend.to_str())
        plain.encode_special_tokens = True
    except Exception as e:  # noqa: BLE001 - an unusual tokenizer: transformers' split_special_tokens instead
        log.warning("no plain-text encoder for this tokenizer (%s): env text uses split_special_tokens", e)
        return None
    if any(set(special).intersection(plain.encode(t, add_special_tokens=False).ids) for t in special.values()):
        log.warning("this tokenizer's model makes special tokens from text: env text uses split_special_tokens")
        return None
    return plain


def render_located(render: Callable[[list[dict[str, Any]]], str], messages: list[dict[str, Any]], hot: list[int],
                   nonce: str, plain: PlainText) -> tuple[str, list[Span]]:
    """(the rendering of `messages`, the spans of the contents of `messages[i]` for i in `hot` in it).

    `render` renders a message list (the template with its tools and generation prompt). With no hot message
    the spans are []; when the hot contents cannot be located, the rendering is of their defused text
    (module docstring) and the spans are [] too."""
    text = render(messages)
    if not hot:
        return text, []
    tagged = list(messages)
    tags: list[tuple[str, str]] = []
    for k, i in enumerate(hot):
        content = messages[i]["content"]
        core = content.strip()
        lead, trail = content[:len(content) - len(content.lstrip())], content[len(content.rstrip()):]
        tag = (f"AGENTRL{nonce}O{k}X", f"AGENTRL{nonce}C{k}X")
        tagged[i] = {**messages[i], "content": lead + tag[0] + core + tag[1] + trail}
        tags.append(tag)
    located = _untag(render(tagged), tags)
    if located is not None and located[0] == text:
        return text, located[1]
    log.warning("the chat template changes env text it renders (or repeats it): special-token strings in env "
                "text get a word joiner instead")
    defused = list(messages)
    for i in hot:
        defused[i] = {**messages[i], "content": plain.defuse(messages[i]["content"])}
    return render(defused), []


def _untag(tagged: str, tags: list[tuple[str, str]]) -> tuple[str, list[Span]] | None:
    """`tagged` without its tags and the spans they enclosed, or None unless each tag is there once, in order,
    and the spans do not overlap."""
    marks = []
    for k, (open_, close) in enumerate(tags):
        if tagged.count(open_) != 1 or tagged.count(close) != 1:
            return None
        marks += [(tagged.index(open_), len(open_), k, 0), (tagged.index(close), len(close), k, 1)]
    marks.sort()
    parts, at, removed = [], 0, 0
    starts: dict[int, int] = {}
    spans: list[Span] = []
    for pos, length, k, is_close in marks:
        if pos < at:  # tags overlapping one another
            return None
        parts.append(tagged[at:pos])
        if is_close:
            if k not in starts:
                return None
            spans.append((starts.pop(k), pos - removed))
        else:
            starts[k] = pos - removed
        removed += length
        at = pos + length
    parts.append(tagged[at:])
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        return None
    return "".join(parts), spans


def encode_spans(encode: Callable[[str], list[int]], plain: PlainText, text: str, spans: list[Span],
                 lo: int = 0, hi: int | None = None) -> list[int]:
    """`text[lo:hi]` encoded with `encode`, except within `spans` (clipped to it): ordinary text there."""
    hi = len(text) if hi is None else hi
    ids: list[int] = []
    at = lo
    for a, b in spans:
        a, b = max(a, lo), min(b, hi)
        if a >= b:
            continue
        if a > at:
            ids += encode(text[at:a])
        ids += plain.encode(text[a:b])
        at = b
    if at < hi:
        ids += encode(text[at:hi])
    return ids
