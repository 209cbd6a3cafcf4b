"""What a client may ask of a query's result sinks (`"sinks": [...]` in `POST /queries`), and the
gateway-wide limits that bound it.

The body is typed with msgspec (a tagged union on `type`), so a misspelt key or a wrong type is a
400 naming it; what msgspec cannot say (a URL's scheme, a path that would leave the sinks
directory) is checked by `check()`. Specs are saved with the query (its options), so a restart
brings the sinks back exactly as they were asked for.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from fjords.errors import QueryError
from gateway.sinks.address_policy import AddressPolicy, Refused, redact_url

MiB = 1024 * 1024


class PolicyRefused(QueryError):
    """A webhook URL the address policy refuses (a 400, counted)."""


class _Spec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type"):
    """One sink of one query."""


class MqttSinkSpec(_Spec, tag="mqtt"):
    """The latest row of each result group, retained on `{prefix}/results/{id}/{group...}`."""

    retain: bool = True
    qos: Literal[0, 1, 2] = 1


class WebhookSinkSpec(_Spec, tag="webhook"):
    """Rows POSTed as JSON batches of at most `batch_rows`, sent `batch_ms` after the first row
    of a batch; `queue_rows` rows wait while the receiver is slow or down (then the oldest go)."""

    url: str
    batch_rows: Annotated[int, Meta(ge=1, le=10_000)] = 500
    batch_ms: Annotated[int, Meta(ge=0, le=60_000)] = 200
    queue_rows: Annotated[int, Meta(ge=1)] = 10_000


class FileSinkSpec(_Spec, tag="file"):
    """Append-only files under the sinks directory: `path` is a directory relative to it (the
    query id when omitted), files rotate after `rotate_mb` MiB or `rotate_s` seconds."""

    format: Literal["ndjson", "parquet"] = "ndjson"
    path: str | None = None
    rotate_mb: Annotated[float, Meta(gt=0, le=65_536)] = 64.0
    rotate_s: Annotated[float, Meta(gt=0)] = 3600.0
    batch_rows: Annotated[int, Meta(ge=1, le=100_000)] = 10_000
    batch_ms: Annotated[int, Meta(ge=0, le=60_000)] = 1000
    queue_rows: Annotated[int, Meta(ge=1)] = 100_000


SinkSpec = MqttSinkSpec | WebhookSinkSpec | FileSinkSpec


@dataclass
class SinkSettings:
    """Gateway-wide sink limits (`[sinks]` in the configuration, once wired; these defaults
    otherwise). `dir` None: `<state dir>/sinks`; no state directory either: no file sinks."""

    dir: str | None = None
    max_per_query: int = 8
    max_queue_rows: int = 100_000
    webhook_timeout_s: float = 10.0
    webhook_max_attempts: int = 5
    webhook_backoff_initial_s: float = 0.5
    webhook_backoff_max_s: float = 30.0
    mqtt_max_groups: int = 10_000
    mqtt_topic_prefix: str | None = None  # None: [mqtt] topic_prefix
    # What a webhook may reach besides public addresses, and then only that (names, shell
    # patterns, addresses, networks, maybe with a port: gateway/sinks/address_policy.py).
    webhook_hosts: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_config(cls, config: Any) -> SinkSettings:
        """From `config.sinks` (a `[sinks]` section, when the configuration has one), with the
        sinks directory defaulting to `<state dir>/sinks`."""
        section = getattr(config, "sinks", None)
        if isinstance(section, cls):
            settings = section
        elif section is None:
            settings = cls()
        else:
            fields = cls.__dataclass_fields__
            raw = section if isinstance(section, dict) else msgspec.structs.asdict(section)
            settings = cls(**{k: v for k, v in raw.items() if k in fields})
        return settings.resolved(config)

    def resolved(self, config: Any) -> SinkSettings:
        """These settings, the sinks directory defaulting to `<state dir>/sinks`."""
        if self.dir is None and getattr(config, "state_dir", None):
            return dataclasses.replace(self, dir=str(Path(config.state_dir).expanduser() / "sinks"))
        return self


def decode_specs(raw: object) -> list[SinkSpec]:
    """Saved (builtin) specs back into typed ones; a bad one raises QueryError."""
    if raw is None:
        return []
    try:
        return msgspec.convert(raw, list[SinkSpec])
    except msgspec.ValidationError as e:
        raise QueryError(f"sinks: {e}") from None


def to_builtins(specs: list[SinkSpec]) -> list[dict[str, Any]]:
    """For the saved options and `GET /queries/{id}` (every field, defaults included)."""
    return [msgspec.to_builtins(s) for s in specs]  # the tag ("type") included


def redacted(options: dict[str, Any]) -> dict[str, Any]:
    """A query's options fit to show: credentials in webhook URLs as `***` (`redact_url`)."""
    sinks = options.get("sinks")
    if not isinstance(sinks, list) or not any(isinstance(s, dict) and "url" in s for s in sinks):
        return options
    shown = [
        {**s, "url": redact_url(str(s["url"]))} if isinstance(s, dict) and "url" in s else s
        for s in sinks
    ]
    return {**options, "sinks": shown}


def check(
    specs: list[SinkSpec],
    settings: SinkSettings,
    *,
    have_mqtt: bool,
    policy: AddressPolicy | None = None,
) -> None:
    """What the types cannot say; raises QueryError (a 400) naming the sink. `policy`: where
    webhooks may go (default: `settings.webhook_hosts`, no own port)."""
    if len(specs) > settings.max_per_query:
        raise QueryError(f"sinks: at most {settings.max_per_query} sinks per query")
    seen: set[tuple] = set()
    for i, spec in enumerate(specs):
        where = f"sinks[{i}]"
        if isinstance(spec, MqttSinkSpec):
            if not have_mqtt:
                raise QueryError(
                    f"{where}: an mqtt sink needs a broker: this gateway has no [mqtt] section"
                )
            key: tuple = ("mqtt",)
        elif isinstance(spec, WebhookSinkSpec):
            if policy is None:
                try:
                    policy = AddressPolicy.from_entries(settings.webhook_hosts)
                except ValueError as e:
                    raise QueryError(f"[sinks] webhook_hosts: {e}") from None
            try:
                policy.check_url(spec.url)
            except Refused as e:
                raise PolicyRefused(f"{where}.url {redact_url(spec.url[:200])!r}: {e}") from None
            if spec.queue_rows > settings.max_queue_rows:
                raise QueryError(f"{where}.queue_rows: at most {settings.max_queue_rows}")
            key = ("webhook", spec.url)
        else:
            if settings.dir is None:
                raise QueryError(
                    f"{where}: a file sink needs a sinks directory (a state directory, or "
                    "[sinks] dir)"
                )
            if spec.queue_rows > settings.max_queue_rows:
                raise QueryError(f"{where}.queue_rows: at most {settings.max_queue_rows}")
            if spec.path is not None:
                relative_path(spec.path, where)
                resolve_under(settings.dir, spec.path)  # a symlink out of it, too
            key = ("file", spec.path, spec.format)
        if key in seen:
            raise QueryError(f"{where}: the same sink twice")
        seen.add(key)


def relative_path(text: str, where: str = "path") -> PurePosixPath:
    """A request's path: relative, no `..`, no empty or odd parts. (Symlinks are checked again
    when resolved under the sinks directory: `resolve_under`.)"""
    if not text or len(text) > 512 or "\x00" in text or "\\" in text:
        raise QueryError(f"{where}.path: a relative path of at most 512 characters, without \\")
    p = PurePosixPath(text)
    if p.is_absolute() or any(part in ("..", ".") for part in p.parts) or text.startswith("~"):
        raise QueryError(
            f"{where}.path: must be relative to the sinks directory, without '..', got {text!r}"
        )
    return p


def resolve_under(root: str | Path, relative: str) -> Path:
    """`relative` under `root`, refusing one that escapes it (through a symlink too)."""
    base = Path(root).expanduser().resolve()
    target = (base / relative_path(relative)).resolve()
    if not target.is_relative_to(base):
        raise QueryError(f"path {relative!r} leads outside the sinks directory")
    return target
