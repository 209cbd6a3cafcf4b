"""What the parser says about a bad query: the word it does not support, the character or token
it did not expect and what may come there instead, and text it cannot read at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
)

from fjords.compile.sql.grammar import LARK
from fjords.errors import QuerySyntaxError

# Human names for the grammar's terminals in "expected ..." lists.
_TOKEN_NAMES = {
    "NAME": "identifier",
    "QUOTED_NAME": "identifier",
    "NUMBER": "number",
    "INT": "integer",
    "STRING": "string",
    "UNIT": "time unit (MILLISECONDS, SECONDS, MINUTES, HOURS, DAYS, WEEKS)",
    "COMP_OP": "comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*' or '/'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "DOT": "'.'",
    "STAR": "'*'",
    "LSQB": "'['",
    "RSQB": "']'",
    "SEMICOLON": "';'",
    "MINUS": "'-'",
    "$END": "end of query",
}


def token_name(name: str) -> str:
    if name in _TOKEN_NAMES:
        return _TOKEN_NAMES[name]
    return name.lstrip("_").upper()


def check_encodable(text: str) -> None:
    """Query text is stored (SQLite) and echoed (JSON, MQTT): it must be valid UTF-8, so a lone
    surrogate (`"\\ud800"` in JSON) is refused here, before anything is installed or saved."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        before = text[: e.start]
        line = before.count("\n") + 1
        col = e.start - (before.rfind("\n") + 1) + 1
        raise QuerySyntaxError(
            f"the query is not valid UTF-8 text (a lone surrogate {text[e.start]!r})", line, col
        ) from None


def _expected(e: UnexpectedInput, text: str, fallback: Iterable[str]) -> tuple[str, ...]:
    """The terminals that may really come next at the error.

    Lark's own list is read after the bad token already forced some reductions, and LALR merges
    lookaheads across contexts, so it both misses (`AND` after `a = 1`) and over-reports. Only
    on this error path, re-run the parse up to the bad token (linear: no per-token copies) and
    ask that state which terminals it accepts.
    """
    names: Iterable[str] = fallback
    bad_pos: int | None = None
    if isinstance(e, UnexpectedToken) and e.token.type != "$END":
        bad_pos = e.token.start_pos
    try:
        names = _accepts_before_error(text, bad_pos)
    except Exception:  # noqa: BLE001 -- only a nicer hint is lost; keep Lark's own list
        names = fallback
    return tuple(
        sorted({token_name(t) for t in names or () if not t.startswith("__") and "<" not in t})
    )


def _accepts_before_error(text: str, bad_pos: int | None) -> set[str]:
    """Re-feed the tokens before `bad_pos` (None: all of them, the error was at the end)."""
    parser = LARK.parse_interactive(text)
    try:
        for tok in parser.lexer_thread.lex(parser.parser_state):
            if tok.start_pos == bad_pos:
                break
            parser.feed_token(tok)
    except UnexpectedInput:  # the lexer failed, so nothing was fed: the state is exact
        pass
    return parser.accepts()


_JOIN_HINT = (
    "JOIN ... ON is not supported; list the sources in FROM separated by commas and put the "
    "join condition in WHERE (FROM traffic AS s, incidents AS i WHERE i.segment = s.segment)"
)


_SET_HINT = "is not supported (yet); UNION ALL is"


# SQL words the dialect reserves but does not have: the message for each, at the word.
_UNSUPPORTED = {
    "OFFSET": "OFFSET is not supported (yet)",
    "FETCH": "FETCH is not supported (yet)",
    "ALL": "ALL is not supported (yet)",
    "INTERSECT": f"INTERSECT {_SET_HINT}",
    "EXCEPT": f"EXCEPT {_SET_HINT}",
    "MINUS": f"MINUS {_SET_HINT}",
    "JOIN": _JOIN_HINT,
    "ON": _JOIN_HINT,
    "USING": _JOIN_HINT,
    "INNER": _JOIN_HINT,
    "OUTER": _JOIN_HINT,
    "LEFT": _JOIN_HINT,
    "RIGHT": _JOIN_HINT,
    "FULL": _JOIN_HINT,
    "CROSS": _JOIN_HINT,
    "NATURAL": _JOIN_HINT,
    "WITH": "WITH (common table expressions) is not supported",
    "OVER": "window functions (OVER) are not supported; put a window on the stream, "
    "e.g. FROM traffic [RANGE 15 MINUTES]",
    "PARTITION": "PARTITION BY is not supported; GROUP BY in a window on the stream instead",
    "WINDOW": "a WINDOW clause is not supported; put the window after the stream, "
    "e.g. FROM traffic [RANGE 15 MINUTES]",
    "INTO": "SELECT ... INTO is not supported: a query's results are published, not stored",
    "VALUES": "VALUES is not supported: a query reads sensor streams and tables",
    "INSERT": "only SELECT queries are supported",
    "UPDATE": "only SELECT queries are supported",
    "DELETE": "only SELECT queries are supported",
}


# Strings, quoted names and comments are skipped; a bare unsupported word is group 1. ASCII
# only, as the grammar's words are: with Unicode rules IGNORECASE took 'İnto' for INTO (and
# the message lookup then failed with a KeyError).
_SCAN = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|\b(" + "|".join(_UNSUPPORTED) + r")\b",
    re.IGNORECASE | re.ASCII,
)


_AFTER_UNION = re.compile(r"\bUNION\s*$", re.IGNORECASE | re.ASCII)


_WORD = re.compile(r"\w+", re.ASCII)


def check_unsupported(text: str) -> None:
    """A reserved-but-unsupported word gets its own message at the word, wherever it is: the
    LALR parse alone would read `x = 1 ORDER BY x` as `x = 1 OR DER ...` and blame `BY`."""
    # Most queries have none of the words anywhere: their words, in capitals, tell so at a
    # fifth of the scan's cost.
    if not _UNSUPPORTED.keys().isdisjoint(map(str.upper, _WORD.findall(text))):
        scan_unsupported(text)


def scan_unsupported(text: str) -> None:
    for m in _SCAN.finditer(text):
        if m.group(1) is None:
            continue
        if m.group(1).upper() == "ALL" and _AFTER_UNION.search(text, 0, m.start()):
            continue  # UNION ALL
        before = text[: m.start()]
        line = before.count("\n") + 1
        col = m.start() - (before.rfind("\n") + 1) + 1
        raise QuerySyntaxError(_UNSUPPORTED[m.group(1).upper()], line, col)


def syntax_error(e: UnexpectedInput, text: str) -> QuerySyntaxError:
    line, col = max(e.line, 1), max(e.column, 1)
    if isinstance(e, UnexpectedCharacters):
        at = e.pos_in_stream
        ch = text[at] if at is not None and at < len(text) else ""
        if ch == "'":
            return QuerySyntaxError("unterminated string", line, col, ("closing '",))
        if ch == '"':
            if text.startswith('""', e.pos_in_stream):
                return QuerySyntaxError("empty quoted identifier", line, col, ("identifier",))
            return QuerySyntaxError("unterminated quoted identifier", line, col, ('closing "',))
        return QuerySyntaxError(
            f"unexpected character {ch!r}", line, col, _expected(e, text, e.allowed)
        )
    if isinstance(e, UnexpectedToken):
        tok = e.token
        expected = _expected(e, text, e.expected)
        if tok.type == "$END":
            if tok.end_line is None:  # no token at all: only comments
                return QuerySyntaxError("empty query", 1, 1, ("SELECT",))
            # Lark's $END borrows the last token's position; point just past that token.
            return QuerySyntaxError(
                "unexpected end of query", tok.end_line, tok.end_column, expected
            )
        if "identifier" in expected and re.fullmatch(r"[A-Za-z_]+", str(tok)):
            # a reserved word where a name may stand (`SELECT x AS union`)
            return QuerySyntaxError(
                f"unexpected {str(tok)!r}: {str(tok).upper()} is a reserved word; quote it "
                f'("{tok}") to use it as a name',
                line,
                col,
                expected,
            )
        return QuerySyntaxError(f"unexpected {str(tok)!r}", line, col, expected)
    if isinstance(e, UnexpectedEOF):
        return QuerySyntaxError(
            "unexpected end of query", line, col, _expected(e, text, e.expected)
        )
    return QuerySyntaxError(str(e).splitlines()[0], line, col)
