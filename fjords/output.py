"""Result rows as NDJSON, the form the command-line tools print: one object per row, with the
query's 0-based index under "query" (windowed rows carry window_start and window_end).

A batch's lines are made a column at a time (its keys are fixed), each value encoded by the
function for its type: the same text as `json.dumps` of the row's dict (the Spark engine's
output is compared line by line), at a fraction of its cost, which was most of the time of
`python -m fjords` over many queries. A value of another type goes through `json.dumps`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from json.encoder import encode_basestring_ascii
from math import isfinite
from operator import itemgetter
from typing import Any, TextIO


def _float(v: float) -> str:
    r = float.__repr__(v)
    if r[-1] in "nf":  # nan, inf, -inf: written as json.dumps writes them
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return r


_ENCODE: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,
    float: _float,
    int: int.__repr__,
    bool: lambda v: "true" if v else "false",
    type(None): lambda v: "null",
}


CACHE = 65_536  # numbers whose text is kept (per type); then it starts over
# Shared by every printer (a reading matched by several queries, a timestamp of a sampling
# round). Apart by type: 1 == 1.0 as a key, but not as text.
_KNOWN: dict[type, dict] = {float: {}, int: {}}


def ndjson_printer(
    index: int, columns: tuple[str, ...], out: TextIO
) -> Callable[[list[tuple]], None]:
    """A sink batch callback writing each row of query `index` as one JSON line, the whole
    batch in one `write`."""
    slow = _dict_printer(index, columns, out)
    text = _text(columns, f'{{"query": {index}, ', "}\n")
    if text is None:
        return slow  # the dict's rules decide

    def emit(rows: list[tuple]) -> None:
        whole = text(rows)
        if whole is None:  # a value of another type: json.dumps
            slow(rows)
        else:
            out.write(whole)

    return emit


# A query's batch this small is encoded together with its neighbours' (NdjsonWriter); larger
# ones already spread the work per batch thin, and go as they are.
SMALL = 256


class NdjsonWriter:
    """Every query's rows of a step of a run (a chunk of a file routed), written at `flush` as
    the queries' `ndjson_printer`s would have written them, in the same order, to the byte.

    A printer's cost is mostly per batch (a column at a time, a template per type): 1,000
    narrow filters each get a few rows per chunk, and ~9,000 batches of ~30 rows cost as much
    as their 300,000 lines. Here consecutive small batches of queries with the same columns
    are encoded as one, each line led by its query's head (`{"query": 7, `) as a column of
    its own, up to `SMALL` x 16 rows at a time (a whole chunk's rows at once formatted their
    lines ~1.5x slower: their values no longer in the CPU's caches)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._pending: list[tuple[int, tuple[str, ...], list[tuple]]] = []
        self._own: dict[int, Callable[[list[tuple]], None]] = {}  # each query's printer
        self._heads: dict[int, str] = {}  # each query's line head, written as it is
        self._texts: dict[tuple[str, ...], Callable[..., str | None] | None] = {}

    def printer(self, index: int, columns: tuple[str, ...]) -> Callable[[list[tuple]], None]:
        """The sink batch callback of query `index`: its rows wait for `flush`."""
        self._own[index] = ndjson_printer(index, columns, self.out)
        self._heads[index] = f'{{"query": {index}, '
        pending = self._pending

        def emit(rows: list[tuple]) -> None:
            if rows:
                pending.append((index, columns, rows))

        return emit

    def flush(self) -> None:
        batch = self._pending[:]
        self._pending.clear()
        together: list[tuple[int, tuple[str, ...], list[tuple]]] = []
        size = 0
        for entry in batch:
            i, columns, rows = entry
            if together and (columns != together[0][1] or size >= SMALL * 16):
                self._write_together(together)
                together, size = [], 0
            if len(rows) >= SMALL:
                if together:
                    self._write_together(together)
                    together, size = [], 0
                self._own[i](rows)
            else:
                together.append(entry)
                size += len(rows)
        if together:
            self._write_together(together)

    def _write_together(self, group: list[tuple[int, tuple[str, ...], list[tuple]]]) -> None:
        columns = group[0][1]
        if columns in self._texts:
            text = self._texts[columns]
        else:  # (the head only says "query" is taken: each row has its own)
            text = self._texts[columns] = _text(columns, '{"query": 0, ', "}\n")
        whole = None
        if text is not None:
            rows = list(itertools.chain.from_iterable(r for _, _, r in group))
            whole = text(rows, [(self._heads[i], len(r)) for i, _, r in group])
        if whole is None:  # a name or a value the templates do not take: each on its own
            for i, _, r in group:
                self._own[i](r)
        else:
            self.out.write(whole)


def json_objects(columns: Sequence[str]) -> Callable[[list[tuple]], list[str] | None]:
    """Each row as the text of the JSON object {column: value} (`json.dumps` of the row's
    dict, exactly), for a batch of rows at once; None for a batch holding a value of a type
    it does not know (the caller then uses json.dumps). The result streams' (SSE, NDJSON)
    encoding of the Fjord's rows."""
    text = _text(tuple(columns), "{", "}\n")

    def encode(rows: list[tuple]) -> list[str] | None:
        whole = text(rows) if text is not None else None
        if whole is None:
            return None
        lines = whole.split("\n")  # (a JSON text has no raw newline: it is escaped)
        lines.pop()  # after the last line's newline
        return lines

    return encode


# A batch this long is taken apart a column at a time by index: `zip(*rows)` makes an
# iterator per row, ~3x the cost per row at a few thousand rows (and more beyond).
_LONG = 64


def _text(
    columns: tuple[str, ...], head: str, tail: str
) -> Callable[[list[tuple]], str | None] | None:
    """The text of a batch of rows, one line each: the row's `head`, its columns as JSON
    members, then `tail`; None where a dict of the row would differ (no columns, a repeated
    name, a column named "query" after a head that has one).

    The batch is looked at a column at a time: a column whose values are all of one type (the
    usual case: a stream column is typed) needs no dispatch per value. Plain strings
    (printable ASCII without quote or backslash, the usual sensor id) go into the text as they
    are, between quotes that join the constant text around them; numbers by their text, kept
    by value for all printers (readings repeat their numbers, and `float.__repr__` was most
    of the encoding). Every value's text and the constant texts between them are then laid
    out in one list, a slice per column, and joined once: no formatting per line (a template
    filled per line was most of the cost of printing)."""
    if (
        not columns
        or len(set(columns)) != len(columns)
        or ('"query"' in head and "query" in columns)
    ):
        return None
    keys = [f"{encode_basestring_ascii(c)}: " for c in columns]
    width = len(keys)
    getters = [itemgetter(j) for j in range(width)]
    layouts: dict[tuple[bool, ...], list[str]] = {}
    known = _KNOWN

    def layout(quoted: tuple[bool, ...]) -> list[str]:
        """The constant texts around the values, for which columns' values are quoted."""
        q = ['"' if b else "" for b in quoted]
        parts = [f"{keys[0]}{q[0]}"]
        parts += [f"{q[j]}, {keys[j + 1]}{q[j + 1]}" for j in range(width - 1)]
        parts.append(f"{q[-1]}{tail}")
        layouts[quoted] = parts
        return parts

    def text(rows: list[tuple], heads: Sequence[tuple[str, int]] | None = None) -> str | None:
        """`heads`: runs of rows with their own text in place of `head`, as (text, how many
        rows) in order (the writer's: each query's rows)."""
        n = len(rows)
        if not n:
            return ""
        if n < _LONG:
            values: list = list(zip(*rows, strict=True))
            if len(values) != width:
                raise ValueError(f"rows of {len(values)} values for {width} columns")
        else:
            if set(map(len, rows)) != {width}:
                raise ValueError(f"rows of other than {width} values for {width} columns")
            values = [list(map(get, rows)) for get in getters]
        try:
            cols = [_column(c, known) for c in values]
        except KeyError:
            return None
        quoted = tuple([q for q, _ in cols])
        parts = layouts.get(quoted) or layout(quoted)
        step = 2 * width + 1  # a row's head and first key, then a value and what follows it
        flat: list[str | None] = [None] * (n * step)
        if heads is None:
            flat[0::step] = [head + parts[0]] * n
        else:  # one text per run, not per row
            first = parts[0]
            flat[0::step] = list(
                itertools.chain.from_iterable(itertools.repeat(h + first, k) for h, k in heads)
            )
        at = 1
        for (_, texts), part in zip(cols, parts[1:], strict=True):
            flat[at::step] = texts
            flat[at + 1 :: step] = [part] * n
            at += 2
        return "".join(flat)  # type: ignore[arg-type]  # every slot is filled

    return text


def _column(
    values: Sequence, known: dict[type, dict]
) -> tuple[bool, Sequence[str] | Iterable[str]]:
    """How a column goes into the text: whether between quotes (plain strings, as they are)
    and the values' texts (KeyError: a type without an encoder)."""
    kinds = set(map(type, values))
    if len(kinds) == 1 and str in kinds and _plain(values):
        return True, values
    return False, _encode_column(values, known, kinds)


_PLAIN: set[str] = set()  # strings known to be their own JSON text between quotes


def _plain(values: Sequence) -> bool:
    plain = _PLAIN
    if all(map(plain.__contains__, values)):
        return True
    if len(plain) > CACHE:
        plain.clear()
    for v in set(values).difference(plain):
        if encode_basestring_ascii(v) != f'"{v}"':
            return False
        plain.add(v)
    return True


def _encode_column(
    values: Sequence, known: dict[type, dict], kinds: set[type] | None = None
) -> Sequence[str] | Iterable[str]:
    """Each value's JSON text (KeyError for a type without an encoder)."""
    kinds = set(map(type, values)) if kinds is None else kinds
    if len(kinds) != 1:
        enc = _ENCODE
        return [enc[v.__class__](v) for v in values]
    kind = next(iter(kinds))
    texts = known.get(kind)
    if texts is None:
        return map(_ENCODE[kind], values)
    try:
        return list(map(texts.__getitem__, values))
    except KeyError:
        if len(texts) > CACHE:
            texts.clear()
        text = _ENCODE[kind]
        new = set(values).difference(texts)
        if kind is float:
            # Kept: finite and not zero (-0.0 == 0.0 as a key, but is written "-0.0").
            if not all(map(isfinite, new)) or 0.0 in new:
                texts.update((v, text(v)) for v in new if v and isfinite(v))
                get = texts.get  # (None for the values not kept: a text is never empty)
                return [get(v) or text(v) for v in values]
        for v in new:
            texts[v] = text(v)
        return list(map(texts.__getitem__, values))


def _dict_printer(
    index: int, columns: tuple[str, ...], out: TextIO
) -> Callable[[list[tuple]], None]:
    def emit(rows: list[tuple]) -> None:
        for row in rows:
            obj: dict[str, Any] = {"query": index, **dict(zip(columns, row, strict=True))}
            out.write(json.dumps(obj))
            out.write("\n")

    return emit
