"""The dialect's grammar as a Lark LALR parser, built once (and cached between runs)."""

from __future__ import annotations

import os
from importlib.resources import files

from lark import Lark


def _cache_file() -> str | bool:
    """Where the built parser is kept between runs, or False (none).

    Building the LALR tables is about half a second of every start (`python -m fjords`, each
    CLI command); loaded from the cache it is a few milliseconds. Lark checks the file
    against a hash of the grammar, options and versions, and rebuilds on a mismatch. The
    file is a pickle, so it lives in the user's own cache directory (never a shared
    temporary one), and only if that directory is the user's."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(base, "fjords-gateway")
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
    except OSError:
        return False
    if st.st_uid != os.getuid() or st.st_mode & 0o022 or not os.access(d, os.W_OK):
        return False
    return os.path.join(d, "sql-parser.lark")


LARK = Lark(
    files("fjords.compile.sql").joinpath("grammar.lark").read_text(),
    parser="lalr",
    maybe_placeholders=False,
    cache=_cache_file(),
    # No propagate_positions: it doubled the parse time of long IN lists. Expression nodes get
    # their position from their first token instead (`_at`).
)
