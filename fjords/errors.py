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
