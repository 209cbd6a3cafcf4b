"""Where a sensor's readings go in its stream's tuples, worked out once from its hello.

The hello's attributes that the stream has as columns are static (converted once, filled into
a template row); each announced reading field maps to its column; the sensor field holds the
sensor's id (a loop pair's: the pair id), which is also the sensor's key in the stream's
progress. A hello that does not fit its stream is refused here (`ProxyError`), before any
proxy exists for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fjords.errors import SchemaError
from fjords.schema import Schema, convert
from proxies.pair import PairJoin
from sensors.protocol import Hello

__all__ = ["ProxyError", "TupleLayout"]


class ProxyError(ValueError):
    """A sensor whose hello does not fit its stream (the reader logs it and skips the sensor)."""


@dataclass(frozen=True, slots=True)
class TupleLayout:
    """One sensor's tuple shape: a template row and where each reading value goes."""

    progress_key: object  # the sensor field's value: the sensor in the stream's progress
    static: dict[str, object]  # column -> value filled once (attributes, the sensor field)
    template: list[object]  # a row with the static columns filled, the rest None
    time_field: str
    time_i: int
    value_slots: list[tuple[int, int, str]]  # (position in a reading, row index, column type)
    value_field: str  # the reading's column (what demands filter and aggregate)
    value_i: int

    @classmethod
    def of(
        cls,
        hello: Hello,
        *,
        stream: str,
        schema: Schema,
        sensor_field: str | None,
        pair: PairJoin | None,
    ) -> TupleLayout:
        """The layout of `hello`'s readings in `stream`, or ProxyError if they do not fit."""
        sid = hello.sensor_id
        if schema.time is None:
            raise ProxyError(f"stream {stream!r} has no time field")
        static: dict[str, object] = {}
        key: object = sid
        try:
            if pair is not None:
                if sensor_field is None:
                    raise ProxyError(f"pair stream {stream!r} needs a sensor field (the pair id)")
                key = convert(pair.pair_id, schema.type_of(sensor_field), sensor_field)
                static[sensor_field] = key
            elif sensor_field is not None:
                key = convert(sid, schema.type_of(sensor_field), sensor_field)
                static[sensor_field] = key
            for name, attribute in hello.attributes.items():
                if name in schema and name not in static and name != schema.time:
                    static[name] = convert(attribute, schema.type_of(name), name)
        except SchemaError as exc:
            raise ProxyError(f"sensor {sid!r}: {exc}") from None
        template: list[object] = [None] * len(schema)
        for name, value in static.items():
            template[schema.index(name)] = value
        value_slots: list[tuple[int, int, str]] = []
        if pair is None:
            if not hello.schema:
                raise ProxyError(f"sensor {sid!r} announced no reading fields")
            for j, (name, _type) in enumerate(hello.schema):
                if name not in schema:
                    raise ProxyError(
                        f"sensor {sid!r} reads {name!r}, which stream {stream!r} "
                        f"does not have; its columns are {', '.join(schema.names)}"
                    )
                value_slots.append((j, schema.index(name), schema.type_of(name)))
            value_field = hello.schema[0][0]
        else:
            value_field = "speed" if "speed" in schema else schema.names[-1]
        return cls(
            progress_key=key,
            static=static,
            template=template,
            time_field=schema.time,
            time_i=schema.index(schema.time),
            value_slots=value_slots,
            value_field=value_field,
            value_i=schema.index(value_field),
        )
