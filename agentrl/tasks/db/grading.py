"""AgentBench's grading of `db` answers, rewritten (its `DBBenchTask.compare_results`).

SELECT-type samples (`type` other/counting/ranking/comparison/aggregation-*): the committed answers and
the label are normalized (a "[(v,), ...]" result string becomes its values; quotes, "%", thousands
separators stripped; none/null/nan/"" become "0") and compared: one value each by number
(|a-b| <= 0.01) or string; several values by multiset with that tolerance when all are numbers, else
as sets. INSERT/UPDATE/DELETE samples compare the table-state hash with the sample's `answer_md5`.
Pure functions of strings: no database here.
"""
from __future__ import annotations

import ast
from collections import Counter
from typing import Any

MODIFY = ("INSERT", "UPDATE", "DELETE")
"""The sample types graded by the table-state hash, not by the committed answers."""

_SPECIAL = {"none", "null", "undefined", "nan", "inf", "infinity", "-inf", "-infinity", ""}


def normalize_value(value: Any) -> str:
    """One answer value as AgentBench compares it."""
    if value is None:
        return "0"
    text = str(value).strip()
    if text.endswith("%"):
        return text[:-1].strip()
    if "," in text and not text.startswith("[") and not text.endswith("]"):
        text = text.replace(",", "")
    return "0" if text.lower() in _SPECIAL else text


def _strip(value: Any) -> str:
    return str(value).strip().strip("'\"")


def _result_values(text: str) -> list[str] | None:
    """The values of a "[(v,), (w,)]" result string (one-column rows only), or None if it is not one."""
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        inner = text.strip("[]")
        if inner.count("(") == 1 and inner.startswith("(") and inner.endswith(",)"):
            return [inner[1:-2].strip().strip("'\"")]
        return None
    if isinstance(parsed, list) and all(isinstance(x, tuple) for x in parsed):
        return [_strip(x[0]) for x in parsed if len(x) == 1]
    return None


def _split_list(inner: str) -> list[str]:
    items, current, quoted = [], "", False
    for ch in inner:
        if ch in "'\"":
            quoted = not quoted
        elif ch == "," and not quoted:
            if current:
                items.append(normalize_value(_strip(current)))
            current = ""
        else:
            current += ch
    if current:
        items.append(normalize_value(_strip(current)))
    return items


def clean_answers(answer: Any) -> list[str]:
    """Committed answers or a label as the list of normalized strings that grading compares."""
    if answer is None:
        return ["0"]
    if isinstance(answer, str):
        values = _result_values(answer)
        if values is not None:
            return [normalize_value(v) for v in values]
        text = answer.strip()
        if text.startswith("[") and text.endswith("]"):
            try:
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return _split_list(text[1:-1])
            if isinstance(parsed, list):
                return [normalize_value(_strip(x[0] if isinstance(x, tuple) and len(x) == 1 else x)) for x in parsed]
        return [normalize_value(_strip(text))]
    if isinstance(answer, (list, tuple)):
        return [normalize_value(_strip(x[0] if isinstance(x, tuple) and len(x) == 1 else x)) for x in answer]
    return [normalize_value(_strip(answer))]


def _is_float(text: str) -> bool:
    try:
        float(text)
    except (ValueError, TypeError):
        return False
    return True


def _close(a: str, b: str, tol: float = 1e-2) -> bool:
    return abs(float(a) - float(b)) <= tol


def answers_match(answer: Any, truth: Any, kind: str, no_extra: bool = False) -> bool:
    """AgentBench's comparison of committed answers (or a table hash) with the ground truth.

    no_extra: also fail an answer that repeats a value more often than the truth holds it (AgentBench
        compares several non-numeric values as sets, so ["Fantasy", "Fantasy"] passes for ["Fantasy"]:
        a policy could pad answers for free). The strict protocol sets it; the faithful one keeps
        AgentBench's sets.
    """
    got, want = clean_answers(answer), clean_answers(truth)
    if no_extra and kind not in MODIFY:
        have = Counter(want)
        if any(n > 1 and n > have[value] for value, n in Counter(got).items()):  # a repeated value, padded
            return False
    if kind in MODIFY:
        return got == want
    if len(got) == 1 and len(want) == 1:
        a, b = got[0], want[0]
        if _is_float(a) and _is_float(b):
            return _close(a, b)
        return a == b
    if all(map(_is_float, got)) and all(map(_is_float, want)):
        if len(got) != len(want):
            return False
        unused = list(want)
        for a in got:
            hit = next((i for i, b in enumerate(unused) if _close(a, b)), None)
            if hit is None:
                return False
            unused.pop(hit)
        return True
    return set(got) == set(want)

