"""Compiled plain columns recognised: `lambda t: t[i]` from the compiler is read as field `i`.

The fast add paths read fields by index (and by C-level `itemgetter`) instead of calling the
compiled function per reading; these helpers tell which functions are plain columns.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import lru_cache

from fjords.runtime.operators.aggregate.state import Fn


def column_ref(i: int) -> Fn:
    return lambda t: t[i]


def key1_ref(f: Fn) -> Callable[[tuple], tuple]:
    return lambda t: (f(t),)


_COLUMN_CODE = column_ref(0).__code__.co_code
_KEY1_CODE = key1_ref(column_ref(0)).__code__.co_code


def column_index(f: object) -> int | None:
    """The field index `i` when `f` is a compiled plain column (`lambda t: t[i]`), else None."""
    code = getattr(f, "__code__", None)
    cells = getattr(f, "__closure__", None)
    if code is not None and cells and len(cells) == 1 and code.co_code == _COLUMN_CODE:
        i = cells[0].cell_contents
        if isinstance(i, int):
            return i
    return None


def fast_fn(f: Fn) -> Fn:
    """`f`, or a C-level `itemgetter` when `f` is a compiled plain column (`lambda t: t[i]`)."""
    i = column_index(f)
    return f if i is None else _getter(i)


@lru_cache(maxsize=1024)  # one itemgetter per position, shared by every query
def _getter(i: int) -> Fn:
    return operator.itemgetter(i)


def single_column(key_fn: Callable[[tuple], tuple]) -> Fn | None:
    """The one column function of a one-column GROUP BY key (`lambda t: (f(t),)`), else None."""
    code = getattr(key_fn, "__code__", None)
    cells = getattr(key_fn, "__closure__", None)
    if code is not None and cells and len(cells) == 1 and code.co_code == _KEY1_CODE:
        f = cells[0].cell_contents
        if callable(f):
            return f
    return None


def single_key(key_fn: Callable[[tuple], tuple]) -> Fn | None:
    """The one column function of a one-column GROUP BY key (`lambda t: (f(t),)`), else None:
    then the bare value can be the group's dict key (no tuple per reading)."""
    f = single_column(key_fn)
    return None if f is None else fast_fn(f)
