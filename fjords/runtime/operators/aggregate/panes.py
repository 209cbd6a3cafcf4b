"""Event time cut into panes: pane bounds exact in float arithmetic, and sizes of keys."""

from __future__ import annotations

import math
import sys

import numpy as np


def first_at(u: int) -> float:
    """The least float `x` with `x * 1000 >= u` in float arithmetic (`u` in milliseconds).

    `x * 1000` is monotonic in `x`, so `first_at(a) <= ts < first_at(b)` holds exactly when
    `a <= ts * 1000 < b`, that is when `a <= floor(ts * 1000) < b` for integers a and b: a
    reading's pane is checked by two comparisons instead of a product, a floor and a division.
    Exact for int and float times alike (Python compares an int with a float exactly)."""
    x = u / 1000
    while x * 1000 >= u:
        x = math.nextafter(x, -math.inf)
    while x * 1000 < u:
        x = math.nextafter(x, math.inf)
    return x


KEY_BYTES: dict[str, int] = {}  # sys.getsizeof of text group keys, shared by every aggregate


def key_bytes(key: object) -> int:
    """`sys.getsizeof(key)`, remembered for text keys (equal strings are equally large)."""
    n = KEY_BYTES.get(key) if key.__class__ is str else None
    if n is None:
        n = sys.getsizeof(key)
        if key.__class__ is str:
            if len(KEY_BYTES) >= 65_536:
                KEY_BYTES.clear()
            KEY_BYTES[key] = n
    return n


_BOUNDS: dict[int, float] = {}  # `first_at` of recent pane ends: shared by every aggregate


def pane_bound(u: int) -> float:
    """`first_at(u)`, remembered: the queries over one stream cross the same pane ends (100
    windowed queries: each end computed once, not 100 times)."""
    x = _BOUNDS.get(u)
    if x is None:
        if len(_BOUNDS) >= 4096:
            _BOUNDS.clear()
        x = _BOUNDS[u] = first_at(u)
    return x


# Pane bounds beyond this many milliseconds are not cached (times near 2**53 lose exactness).
EXACT_U = 1 << 50


NO_PANE: tuple[None, float, float] = (None, math.inf, -math.inf)  # every time misses it


ONLY_FLOAT, ONLY_INT, ONLY_STR = {float}, {int}, {str}


NEVER = np.iinfo(np.int64).max  # a dense group's first arrival before it has one
