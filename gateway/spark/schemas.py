"""Fjord schemas as Spark types and back (Fjord types: int, float, str, bool)."""

from __future__ import annotations

from typing import Any

from fjords.schema import Field, Schema


def spark_type(kind: str) -> Any:
    """The Spark SQL type of a Fjord field type."""
    from pyspark.sql import types as T

    return {
        "int": T.LongType(),
        "float": T.DoubleType(),
        "str": T.StringType(),
        "bool": T.BooleanType(),
    }[kind]


def spark_schema(schema: Schema) -> Any:
    """A Spark StructType for a Fjord schema."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in schema.fields])


def fjord_schema(struct: Any, time: str | None = "time") -> Schema:
    """A Fjord schema for a Spark StructType (or anything with .fields of name/dataType)."""
    fields = []
    for f in struct.fields:
        t = f.dataType.typeName()
        kind = (
            "int"
            if t in ("long", "integer", "short", "byte")
            else "float"
            if t in ("double", "float", "decimal")
            else "bool"
            if t == "boolean"
            else "str"
        )
        fields.append(Field(f.name, kind))
    names = [f.name for f in fields]
    return Schema(fields, time=time if time in names else None)
