"""Result rows as NDJSON, the form the command-line tools print: one object per row, with the
query's 0-based index under "query" (windowed rows carry window_start and window_end).

Each query gets a line template made once (its keys are fixed) and each value is encoded by
the function for its type: the same text as `json.dumps` of the row's dict (the Spark engine's
output is compared line by line), at a fraction of its cost, which was most of the time of
`python -m fjords` over many queries. A value of another type goes through `json.dumps`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from math import isfinite
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
    batch in one `write`.

    The batch is encoded a column at a time: a column whose values are all of one type
    (the usual case: a stream column is typed) is mapped through that type's encoder in one
    C-level pass, instead of a dispatch per value; then each line is the template filled.
    Readings repeat their numbers (a speed in eighths of a mph, a timestamp per sampling
    round), so the text of ints and finite floats is kept by value, for all printers
    (`float.__repr__` was most of the encoding)."""
    slow = _dict_printer(index, columns, out)
    if not columns or "query" in columns or len(set(columns)) != len(columns):
        return slow  # the dict's rules decide
    keys = [f"{encode_basestring_ascii(c).replace('%', '%%')}: %s" for c in columns]
    fill = ("{" + ", ".join([f'"query": {index}', *keys]) + "}\n").__mod__
    known = _KNOWN

    def emit(rows: list[tuple]) -> None:
        try:
            cols = [_encode_column(c, known) for c in zip(*rows, strict=True)]
        except KeyError:  # a value of another type: json.dumps, as before
            slow(rows)
            return
        out.write("".join(map(fill, zip(*cols, strict=True))))

    return emit


def _encode_column(values: tuple, known: dict[type, dict]) -> list[str] | map:
    """Each value's JSON text (KeyError for a type without an encoder)."""
    kinds = set(map(type, values))
    if len(kinds) != 1:
        enc = _ENCODE
        return [enc[v.__class__](v) for v in values]
    kind = kinds.pop()
    if kind is float:
        # not 0.0: -0.0 == 0.0 as a key, but is written "-0.0"
        if not all(map(isfinite, values)):
            return map(_float, values)
        if 0.0 in values:
            return map(float.__repr__, values)
    texts = known.get(kind)
    if texts is None:
        return map(_ENCODE[kind], values)
    try:
        return list(map(texts.__getitem__, values))
    except KeyError:
        if len(texts) > CACHE:
            texts.clear()
        text = _ENCODE[kind]
        for v in set(values).difference(texts):
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
