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
