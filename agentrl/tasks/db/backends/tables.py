"""A sample's tables, and what both backends answer about them the way AgentBench's dbbench does.

Both backends build a sample's tables with every column TEXT and every value inserted as its string,
answer a statement with the observation AgentBench gives (`str()` of the list of row tuples, or the
error, cut at 800 characters: `result_text`, `truncate`), and compute AgentBench's table-state hash that
grades INSERT/UPDATE/DELETE samples: per row the first 5 hex digits of MD5(CONCAT_WS(',', columns...)),
the row hashes sorted and joined with ',' (cut at 1024 bytes, MySQL's default group_concat_max_len), and
the MD5 of that; tables joined with '_' in sorted order; an empty table hashes to "None" (`rows_hash`,
`combine_hashes`).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

RESULT_LIMIT = 800  # AgentBench cuts a result string here and appends "[TRUNCATED]"
MAX_ROWS = 10_000  # rows fetched for one observation (the text is cut at 800 characters anyway)
MIN_STATEMENT_S = 0.2
"""A statement needs at least this much of its message's budget left to start."""
NO_TIME_LEFT = "Error: this message's time is spent; the statement did not run."
GROUP_CONCAT_MAX = 1024


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def tables_of(entry: dict[str, Any]) -> list[Table]:
    """The tables of one AgentBench dbbench entry (`table` is one object or a list)."""
    raw = entry["table"] if isinstance(entry["table"], list) else [entry["table"]]
    tables = []
    for t in raw:
        cols = tuple(str(c["name"]) for c in t["table_info"]["columns"])
        rows = tuple(tuple(str(v) for v in row) for row in t["table_info"]["rows"])
        tables.append(Table(str(t["table_name"]), cols, rows))
    return tables


def truncate(text: str) -> str:
    return text[:RESULT_LIMIT] + "[TRUNCATED]" if len(text) > RESULT_LIMIT else text


def result_text(rows: Iterable[tuple[Any, ...]], limit: int = RESULT_LIMIT, max_rows: int = MAX_ROWS) -> str:
    """AgentBench's observation text `str(list(rows))`, built row by row and no further than its first
    `limit` characters need (then cut by `truncate` as before): a statement's rows are streamed, never held,
    and a value's text is made from its first characters only (`_value_repr`)."""
    parts, size = ["["], 1
    for count, row in enumerate(rows):
        if count >= max_rows:
            break
        values = [_value_repr(v, limit + 8) for v in row]
        piece = (", " if count else "") + "(" + ", ".join(values) + ("," if len(values) == 1 else "") + ")"
        parts.append(piece)
        size += len(piece)
        if size > limit:
            return "".join(parts)
    return "".join(parts) + "]"


def _value_repr(value: Any, limit: int) -> str:
    """`repr(value)`, or for a long str or bytes value a prefix of it of at least `limit` characters (the
    same prefix `repr` would start with: the quote Python picks depends on the whole value, so it is picked
    from the whole value and forced on the prefix with a suffix that is then cut off)."""
    if not isinstance(value, (str, bytes)) or len(value) <= limit:
        return repr(value)
    quote_char, dquote_char = ("'", '"') if isinstance(value, str) else (b"'", b'"')
    double = quote_char in value and dquote_char not in value  # repr would quote with "
    head = value[:limit]
    # head + '"' + "'" makes repr pick ' (when the whole does), head + "'" makes it pick " (when the whole does)
    tail = quote_char if double else quote_char + dquote_char
    text = repr(head + tail)
    return text[:-(len(repr(tail)) - (1 if isinstance(value, str) else 2))]


def combine_hashes(hashes: list[str]) -> str:
    return "_".join(sorted(hashes))


def rows_hash(rows: list[tuple[Any, ...]]) -> str:
    """AgentBench's hash of one table from its rows, computed here instead of by MySQL (None skipped)."""
    if not rows:
        return "None"  # MD5(GROUP_CONCAT(<no rows>)) is NULL
    row_hashes = sorted(hashlib.md5(",".join(str(v) for v in row if v is not None).encode()).hexdigest()[:5]
                        for row in rows)
    joined = ",".join(row_hashes).encode()[:GROUP_CONCAT_MAX]
    return hashlib.md5(joined).hexdigest()
