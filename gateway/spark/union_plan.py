"""A compiled UNION ALL on Spark (`SparkUnion`): its branches' DataFrames, cut to the union's
columns and `union`ed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fjords.compile.analysis import BoundUnion
from fjords.compile.sql import ast
from gateway.spark.errors import SparkUnsupportedError
from gateway.spark.query_plan import SparkQuery
from gateway.spark.schemas import spark_type

if TYPE_CHECKING:  # pyspark is imported lazily: compiling (and its errors) needs no JVM
    from pyspark.sql import DataFrame


@dataclass
class SparkUnion:
    """A UNION ALL on Spark: each bound branch compiled as a query of its own, their result
    DataFrames cut to the union's columns, named and typed as the union's, and `union`ed.

    Batch (`run`) takes any branches; streaming (`stream_stage`/`finish`, as StreamingJob
    drives a query) takes row-by-row branches without a table join, which stay one stateless
    streaming DataFrame. Rows come in no particular order (the Fjord's come in time order)."""

    sql: str | None
    bound: BoundUnion
    branches: list[SparkQuery]

    @property
    def columns(self) -> tuple[str, ...]:
        return self.bound.columns

    @property
    def stream(self) -> str:
        return self.branches[0].stream

    @property
    def windowed(self) -> bool:
        return self.bound.windowed

    @property
    def window(self) -> tuple[float, float] | None:
        return self.branches[0].window

    @property
    def table(self) -> str | None:
        """None: a streaming union joins no table (`run` fetches each branch's own)."""
        return None

    @property
    def query(self) -> ast.Union:
        return self.bound.union

    def _cut(self, df: DataFrame) -> DataFrame:
        """A branch's result as the union's row: its leading columns, renamed and cast."""
        from pyspark.sql import functions as F

        cols = []
        for i, name in enumerate(self.columns):
            kind = self.bound.types[i] if i < len(self.bound.types) else "float"
            c = F.col(f"`{df.columns[i]}`")
            cols.append((c if kind == "null" else c.cast(spark_type(kind))).alias(name))
        return df.select(*cols)

    def run(self, streams: Mapping[str, DataFrame], table: Callable[[str], DataFrame]) -> DataFrame:
        """The union over batch DataFrames: `streams` by name, `table(name)` a table's."""
        out = None
        for q in self.branches:
            t = table(q.table) if q.table is not None else None
            df = self._cut(q.finish(q.stream_stage(streams[q.stream]), t))
            out = df if out is None else out.union(df)
        return out  # type: ignore[return-value]

    def _streamable(self) -> None:
        if self.windowed or any(q.table is not None for q in self.branches):
            raise SparkUnsupportedError(
                "a UNION ALL of windowed aggregates or of table joins runs on Spark as a batch "
                "job only (spark batch / replay --engine spark); run it on the Fjord (the "
                "default engine) to stream it",
                self.bound.union.union_pos[0] if self.bound.union.union_pos else None,
            )
        if len({q.stream for q in self.branches}) > 1:
            raise SparkUnsupportedError(
                "a Spark job reads one stream's archive; this UNION ALL reads several: run it "
                "on the Fjord (the default engine)",
                self.bound.union.union_pos[0] if self.bound.union.union_pos else None,
            )

    def stream_stage(self, df: DataFrame, *, watermark: str | None = None) -> DataFrame:
        """Streaming (or a one-stream batch): the branches' filters and projections, unioned."""
        self._streamable()
        out = None
        for q in self.branches:
            part = self._cut(q.stream_stage(df, watermark=watermark))
            out = part if out is None else out.union(part)
        return out  # type: ignore[return-value]

    def finish(self, partials: DataFrame, table: DataFrame | None = None) -> DataFrame:
        return partials
