"""Queries of the project's SQL dialect on Apache Spark: batch over archives and traces, and
Structured Streaming over the gateway's Parquet archive.

pyspark is imported lazily, so compiling a query (and its errors) needs no JVM.
"""

from gateway.spark.compiler import SparkQuery, SparkUnsupportedError, compile_query
from gateway.spark.session import SparkConfig, get_session

__all__ = ["SparkConfig", "SparkQuery", "SparkUnsupportedError", "compile_query", "get_session"]
