"""Queries of the project's SQL dialect on Apache Spark: batch over archives and traces, and
Structured Streaming over the gateway's Parquet archive.

pyspark is imported lazily, so compiling a query (and its errors) needs no JVM. The compiler is
too (PEP 562): every `fjords-gateway` command builds a parser that names the `spark` commands,
and a mote fleet or a config check should not pay for loading the SQL front end.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.spark.compiler import SparkQuery, SparkUnsupportedError, compile_query
    from gateway.spark.session import SparkConfig, get_session

__all__ = ["SparkConfig", "SparkQuery", "SparkUnsupportedError", "compile_query", "get_session"]

_HOME = {
    "SparkQuery": "gateway.spark.compiler",
    "SparkUnsupportedError": "gateway.spark.compiler",
    "compile_query": "gateway.spark.compiler",
    "SparkConfig": "gateway.spark.session",
    "get_session": "gateway.spark.session",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
