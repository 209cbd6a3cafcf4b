"""Errors a user of the runtime can get back, with enough detail to fix their input."""

from __future__ import annotations


class FjordsError(Exception):
    """Base of every error the runtime raises on purpose."""


class QueryError(FjordsError):
    """A query that parses but cannot be planned (unknown stream, column, construct...)."""


class QuerySyntaxError(QueryError):
    """A query that does not parse; says where (1-based line and column) and what was expected."""

    def __init__(self, message: str, line: int, column: int, expected: tuple[str, ...] = ()):
        self.message = message
        self.line = line
        self.column = column
        self.expected = tuple(expected)
        where = f"line {line}, column {column}"
        hint = f"; expected one of: {', '.join(self.expected)}" if self.expected else ""
        super().__init__(f"{message} at {where}{hint}")

    def to_dict(self) -> dict[str, object]:
        return {
            "error": self.message,
            "line": self.line,
            "column": self.column,
            "expected": list(self.expected),
        }


class SchemaError(FjordsError):
    """A tuple or table that does not fit its declared schema."""


class QueryTypeError(QueryError):
    """An expression whose kinds do not fit (text plus a number, a number as a condition...);
    names the expression and, when known, where it starts (1-based line and column)."""

    def __init__(
        self, message: str, expression: str, line: int | None = None, column: int | None = None
    ) -> None:
        self.message = message
        self.expression = expression
        self.line = line
        self.column = column
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"{message}: in `{expression}`{where}")

    def to_dict(self) -> dict[str, object]:
        return {
            "error": str(self),
            "expression": self.expression,
            "line": self.line,
            "column": self.column,
        }


class LimitExceeded(QueryError):
    """A query that would pass one of the gateway's limits (fjords.limits.Limits): refused when
    planned if it can be known then, else the query fails when it reaches the limit."""

    def __init__(self, limit: str, value: object, maximum: object, what: str) -> None:
        self.limit, self.value, self.maximum = limit, value, maximum
        super().__init__(f"{what}: {value} is over the limit of {maximum} ({limit})")


class QueryPlanError(QueryError):
    """A query that parses but is refused by planning: an unknown name, a clause that would be
    silently ignored. Says where (1-based line and column of the offending token, when known) so
    an editor can point at it; for an unknown name, `names` lists the ones that exist."""

    def __init__(
        self,
        message: str,
        line: int | None = None,
        column: int | None = None,
        names: tuple[str, ...] = (),
    ) -> None:
        self.message = message
        self.line = line
        self.column = column
        self.names = tuple(names)
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"{message}{where}")

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"error": str(self), "line": self.line, "column": self.column}
        if self.names:
            out["names"] = list(self.names)
        return out


class UnknownNameError(QueryPlanError):
    """An unknown column, table or alias; the message lists what exists and the nearest match."""

    def __init__(
        self,
        kind: str,
        name: str,
        names: tuple[str, ...] | list[str],
        pos: tuple[int, int] | None = None,
        where: str = "",
    ) -> None:
        import difflib

        self.kind, self.name = kind, name
        close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
        if not close:  # `Speed` for `speed`: case slips are the commonest typo
            close = [n for n in names if n.lower() == name.lower()][:1]
        self.suggestion = close[0] if close else None
        hint = f"; did you mean {self.suggestion!r}?" if self.suggestion else ""
        listed = ", ".join(names) if names else "none"
        line, column = pos if pos is not None else (None, None)
        super().__init__(
            f"unknown {kind} {name!r}{where}{hint} ({kind}s: {listed})", line, column, tuple(names)
        )


class ClauseError(QueryPlanError):
    """A clause that would change nothing (HAVING without groups, a window on a plain filter...)
    or that an engine cannot honour: refused rather than silently ignored."""

    def __init__(self, message: str, pos: tuple[int, int] | None = None) -> None:
        line, column = pos if pos is not None else (None, None)
        super().__init__(message, line, column)


class EngineUnavailable(QueryError):
    """An engine (Spark) or feature (plots) whose optional dependencies are not installed; says
    which extra to install. A client error (HTTP 400): the request names what is missing."""

    def __init__(self, what: str, extra: str, module: str) -> None:
        self.what, self.extra, self.module = what, extra, module
        super().__init__(
            f"{what} needs {module}, which is not installed: pip install 'fjords-gateway[{extra}]'"
        )


class EngineFailed(FjordsError):
    """An engine (Spark) failed while answering, for a reason outside the query (a segment it
    could not read, a lost executor): the answer is a 502 naming it, and may be asked again."""
