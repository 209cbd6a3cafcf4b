"""The HTTP API's request bodies: their shapes (msgspec structs, a misspelt key is an error)
and their decoding, where every problem is a `BadRequest` with a message a client can act on."""

from __future__ import annotations

import codecs
import math
from datetime import UTC, datetime
from typing import Literal, TypeVar

import msgspec
from aiohttp import web

from gateway.sinks.spec import SinkSpec


class QueryRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of `POST /queries` (a misspelt key is an error, not a silently installed query)."""

    sql: str
    dry_run: bool = False
    publish: Literal["mqtt"] | None = None
    engine: Literal["fjords", "spark"] | None = None
    sinks: list[SinkSpec] | None = None  # result sinks (gateway/sinks/spec.py), saved with it
    since: float | str | None = None  # epoch seconds or ISO-8601: windows from then on first


class SnapshotRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The body of `POST /snapshot`: a query answered once, from the streams' history."""

    sql: str
    partial: bool = False  # include readings past the watermark (the answer says so)
    engine: Literal["fjords", "spark"] | None = None  # spark: the archive part on Spark


_Body = TypeVar("_Body", bound=msgspec.Struct)


class BadRequest(Exception):
    """A client error, answered as `{"error": message}` with `status`."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


async def decode_body(request: web.Request, shape: type[_Body]) -> _Body:
    """The request body as a `shape`; every decoding or type problem is a BadRequest."""
    raw = await request.read()
    charset = request.charset
    if charset and codecs_name(charset) != "utf-8":
        try:
            raw = raw.decode(codecs_name(charset)).encode("utf-8")
        except LookupError:
            raise BadRequest(f"unknown charset {charset!r}; send UTF-8") from None
        except UnicodeError:
            raise BadRequest(f"the body is not valid {charset}") from None
    try:
        return msgspec.json.decode(raw, type=shape)
    except UnicodeDecodeError:
        raise BadRequest("the body is not valid UTF-8") from None
    except msgspec.ValidationError as e:
        raise BadRequest(_explain(str(e))) from None
    except (msgspec.DecodeError, ValueError, RecursionError) as e:
        if "surrogate" in str(e):  # "\ud800" alone: no character, and no UTF-8 for it
            raise BadRequest(
                "a string holds a lone surrogate escape (e.g. \\ud800), which is not a "
                "character and has no UTF-8 form"
            ) from None
        raise BadRequest(f"malformed JSON: {e}") from None


def codecs_name(charset: str) -> str:
    """The codec's canonical name (`UTF8` -> `utf-8`), or the name itself when Python has none."""
    try:
        return codecs.lookup(charset).name
    except LookupError:
        return charset


def _explain(message: str) -> str:
    """msgspec's "Expected `bool`, got `str` - at `$.dry_run`" as "dry_run: expected bool, ..."."""
    text, _, where = message.partition(" - at ")
    text = text.replace("`", "")
    if text == "Expected object, got array" or text.startswith("Expected object, got"):
        return "the body must be a JSON object"
    text = text[:1].lower() + text[1:]
    field = where.strip("`").removeprefix("$").lstrip(".")
    return f"{field}: {text}" if field else text


def epoch_seconds(value: float | str | None) -> float | None:
    """`since` as epoch seconds: a number, or ISO-8601 (UTC unless it says otherwise)."""
    if value is None or isinstance(value, float | int):
        if value is not None and not math.isfinite(value):
            raise BadRequest("since: a finite number of epoch seconds, or ISO-8601")
        return value
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(
            f"since: {value!r} is neither epoch seconds nor ISO-8601 (e.g. 2026-12-01T09:10:00Z)"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
