"""One semantic analysis of a parsed query, shared by both engines.

`analyze` resolves every name against the catalog, types every expression, checks every clause
and splits the WHERE clause, once; the result is a frozen `BoundQuery`. The Fjord planner
(`fjords.compile.planner`) builds operators from it and the Spark compiler
(`gateway.spark.compiler`) builds DataFrames from it: neither resolves a name again, so the two
engines cannot drift apart on names, output columns, join keys, filters or errors. Semantic
errors carry the line and column of the offending token and, for unknown names, the names that
exist.

The modules, in the order an analysis uses them: `scope` (names), `bind` (the analysis
itself: names, types), `clauses` (checks and rewrites), `filters` (WHERE split), `windows`,
`demand` (what the sensors must send), `union`; `bound` holds the results.
"""

from fjords.compile.analysis.bind import analyze, collect_aggregates
from fjords.compile.analysis.bound import (
    MAX_DURATION_S,
    RIGHT,
    STREAM,
    TABLE,
    UNION_TIME,
    WINDOW_COLUMNS,
    BoundQuery,
    BoundUnion,
    ColumnRef,
    StreamJoinSide,
    WindowSpec,
)
from fjords.compile.analysis.clauses import check_clauses
from fjords.compile.analysis.scope import output_name
from fjords.compile.analysis.union import analyze_union

__all__ = [
    "MAX_DURATION_S",
    "RIGHT",
    "STREAM",
    "TABLE",
    "UNION_TIME",
    "WINDOW_COLUMNS",
    "BoundQuery",
    "BoundUnion",
    "ColumnRef",
    "StreamJoinSide",
    "WindowSpec",
    "analyze",
    "analyze_union",
    "check_clauses",
    "collect_aggregates",
    "output_name",
]
