"""A hostile-config corpus: every entry is refused with a ConfigError naming the key at fault
(the CLI: exit 2, one line, no traceback, at once), however it is wrong: nesting that would
recurse, files that are not files (devices, FIFOs, directories), unbounded numbers, MQTT URLs
and topic prefixes no client can use, query ids no URL can name, junk trace or stations files.

The loader runs in-process over the whole corpus (fast); `fjords-gateway run` (with and
without --check-config) runs in-process (`gateway.cli.main`) over a representative subset, and
as a real subprocess (exit code, stderr) for a good config and for config files that are no
files."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.config import MAX_COUNT, MAX_SECONDS, Config, ConfigError, ConfigFile
from gateway.daemon import Gateway
from tests.gateway.conftest import CliRun
from tests.support import ROOT

BIG = 2**62
DEEP = 10_000

#: (name, TOML text, what the message must say). `{tmp}` is the test's directory, which holds
#: `fifo` (a FIFO), `dir/` (a directory) and `file` (a regular file).
CORPUS: list[tuple[str, str, str]] = [
    # nesting: tomllib recurses per level
    ("deep-array", "a = " + "[" * DEEP + "]" * DEEP, "nested too deeply"),
    ("deep-inline-table", "a = " + "{b = " * DEEP + "1" + "}" * DEEP, "nested too deeply"),
    ("deep-table-header", "[" + "a." * DEEP + "a]", "nested more than 16 deep"),
    ("deep-spark-conf", "[spark]\nconf = " + "[" * 40 + "]" * 40, "[spark] conf"),
    # MQTT URLs, parsed strictly
    ("url-empty", '[mqtt]\nurl = ""', "[mqtt] url: empty"),
    ("url-blank", '[mqtt]\nurl = "   "', "[mqtt] url: empty"),
    ("url-port-too-big", '[mqtt]\nurl = "mqtt://h:99999"', "[mqtt] url: bad port"),
    ("url-port-zero", '[mqtt]\nurl = "mqtt://h:0"', "[mqtt] url: bad port"),
    ("url-port-word", '[mqtt]\nurl = "mqtt://h:abc"', "[mqtt] url: bad port"),
    ("url-port-empty", '[mqtt]\nurl = "mqtt://h:"', "[mqtt] url: bad port"),
    ("url-ftp", '[mqtt]\nurl = "ftp://h"', "[mqtt] url: unsupported MQTT URL scheme 'ftp'"),
    ("url-http", '[mqtt]\nurl = "http://h:1883"', "[mqtt] url: unsupported"),
    ("url-no-host", '[mqtt]\nurl = "mqtt://"', "[mqtt] url: no host"),
    ("url-port-only", '[mqtt]\nurl = "mqtt://:1883"', "[mqtt] url: no host"),
    ("url-credentials", '[mqtt]\nurl = "mqtt://u:secret@h"', "[mqtt] url: credentials"),
    ("url-path", '[mqtt]\nurl = "mqtt://h:1883/x?y=1"', "[mqtt] url:"),
    ("url-space", '[mqtt]\nurl = "mqtt://a b:1883"', "[mqtt] url: bad host"),
    ("url-bad-v6", '[mqtt]\nurl = "mqtt://[::zz]:1883"', "[mqtt] url:"),
    ("url-type", "[mqtt]\nurl = 5", "[mqtt] url: expected str"),
    # topic prefixes: the gateway publishes and subscribes under them
    ("prefix-hash", '[mqtt]\ntopic_prefix = "fj/#"', "[mqtt] topic_prefix: 'fj/#' contains"),
    ("prefix-plus", '[mqtt]\ntopic_prefix = "fj/+"', "[mqtt] topic_prefix: 'fj/+' contains"),
    ("prefix-hash-only", '[mqtt]\ntopic_prefix = "#"', "[mqtt] topic_prefix:"),
    ("prefix-nul", '[mqtt]\ntopic_prefix = "fj\\u0000x"', "[mqtt] topic_prefix: contains a NUL"),
    ("prefix-leading", '[mqtt]\ntopic_prefix = "/fj"', "[mqtt] topic_prefix: '/fj' has an empty"),
    ("prefix-trailing", '[mqtt]\ntopic_prefix = "fj/"', "[mqtt] topic_prefix: 'fj/' has an empty"),
    ("prefix-double", '[mqtt]\ntopic_prefix = "a//b"', "[mqtt] topic_prefix: 'a//b' has"),
    ("prefix-empty", '[mqtt]\ntopic_prefix = ""', "[mqtt] topic_prefix: empty"),
    ("prefix-long", f'[mqtt]\ntopic_prefix = "{"a" * 2000}"', "[mqtt] topic_prefix: longer"),
    ("sinks-prefix", '[sinks]\nmqtt_topic_prefix = "r/#"', "[sinks] mqtt_topic_prefix: 'r/#'"),
    # query ids: each must be a URL path segment, a topic level and a file name
    (
        "qid-slash",
        '[[queries]]\nsql = "S"\nid = "a/b"',
        "[[queries]] #1 id: 'a/b' is not a query id",
    ),
    ("qid-escape", '[[queries]]\nsql = "S"\nid = "../../escape"', "[[queries]] #1 id: '../../"),
    ("qid-dotdot", '[[queries]]\nsql = "S"\nid = "a..b"', "[[queries]] #1 id: 'a..b'"),
    ("qid-empty", '[[queries]]\nsql = "S"\nid = ""', "[[queries]] #1 id: '' is not"),
    ("qid-dot", '[[queries]]\nsql = "S"\nid = ".hidden"', "[[queries]] #1 id:"),
    ("qid-hash", '[[queries]]\nsql = "S"\nid = "q#1"', "[[queries]] #1 id:"),
    ("qid-space", '[[queries]]\nsql = "S"\nid = "a b"', "[[queries]] #1 id:"),
    ("qid-newline", '[[queries]]\nsql = "S"\nid = "a\\n"', "[[queries]] #1 id:"),
    ("qid-long", f'[[queries]]\nsql = "S"\nid = "{"a" * 65}"', "[[queries]] #1 id:"),
    (
        "qid-twice",
        '[[queries]]\nsql = "S"\nid = "q"\n[[queries]]\nsql = "T"\nid = "q"',
        "[[queries]] #2 id: 'q' is already #1's",
    ),
    # unknown keys, wrong types
    ("unknown-key", "[http]\nprot = 1", "[http] unknown key 'prot'"),
    ("unknown-section", "[htp]\nport = 1", "unknown section [htp]"),
    ("section-type", "sensors = 5", "[sensors]: expected object"),
    ("list-type", "serial = 5", "[serial]: expected array"),
    ("bool-type", '[state]\npersist = "yes"', "[state] persist: expected bool"),
    ("port-negative", "[http]\nport = -1", "[http] port: expected int >= 0"),
    ("port-float", "[http]\nport = 80.5", "[http] port: expected int, got float"),
    ("int-huge", "[http]\nmax_body_bytes = 99999999999999999999999", "[http] max_body_bytes"),
    # strings
    ("string-huge", f'[http]\ntoken = "{"x" * (1024 * 1024 + 1)}"', "[http] token: longer than"),
    ("string-nul", '[state]\ndir = "a\\u0000b"', "[state] dir: contains a NUL"),
    ("key-nul", '[tables]\n"a\\u0000" = "x.csv"', "[tables]: a key is too long or contains NUL"),
    ("key-huge", f'[tables]\n{"k" * 300} = "x.csv"', "[tables]: a key is too long"),
    ("sql-nul", '[[queries]]\nsql = "SELECT \\u0000"', "[[queries]] #1 sql: contains a NUL"),
    # paths that are not what their key says
    ("state-dir-file", '[state]\ndir = "{tmp}/file"', "[state] dir (--state-dir) "),
    ("state-dir-under-file", '[state]\ndir = "{tmp}/file/sub"', "{tmp}/file is not a directory"),
    ("sinks-dir-dev", '[sinks]\ndir = "/dev/null/x"', "[sinks] dir /dev/null/x: /dev/null is"),
    ("keys-file-fifo", '[sensors]\nkeys_file = "{tmp}/fifo"', "[sensors] keys_file"),
    ("keys-file-zero", '[sensors]\nkeys_file = "/dev/zero"', "[sensors] keys_file"),
    ("certfile-zero", '[mqtt]\ntls = true\ncertfile = "/dev/zero"', "[mqtt] certfile"),
    ("password-file-dir", '[mqtt]\npassword_file = "{tmp}/dir"', "[mqtt] password_file"),
    ("archive-dir-fifo", '[archive]\ndir = "{tmp}/fifo"', "[archive] dir "),
    ("archive-url-ftp", '[archive]\ndir = "ftp://h/a"', "[archive] dir: unsupported URL scheme"),
    ("archive-url-one-slash", '[archive]\ndir = "s3a:/b/a"', "[archive] dir: 's3a:/b/a' looks"),
    ("archive-file-url-fifo", '[archive]\ndir = "file://{tmp}/fifo"', "[archive] dir file://"),
    # the gateway's id names a directory of the archive
    ("gateway-id-slash", '[gateway]\nid = "../x"', "[gateway] id: '../x' is not a gateway id"),
    ("gateway-id-empty", '[gateway]\nid = ""', "[gateway] id: '' is not a gateway id"),
    ("table-fifo", '[tables]\nincidents = "{tmp}/fifo"', "[tables] incidents {tmp}/fifo: a FIFO"),
    ("table-dir", '[tables]\nincidents = "{tmp}/dir"', "[tables] incidents {tmp}/dir: a directory"),
    ("table-null", '[tables]\nincidents = "/dev/null"', "[tables] incidents /dev/null: a char"),
    (
        "table-missing",
        '[tables]\nincidents = "{tmp}/nope"',
        "[tables] incidents {tmp}/nope: No such",
    ),
    (
        "trace-fifo",
        '[replay]\ntrace = "{tmp}/fifo"\nstations = "{tmp}/file"',
        "[replay] trace (--trace) {tmp}/fifo: a FIFO",
    ),
    (
        "stations-dir",
        '[replay]\ntrace = "{tmp}/file"\nstations = "{tmp}/dir"',
        "[replay] stations (--stations) {tmp}/dir: a directory",
    ),
    ("speedup-inf", '[replay]\nspeedup = inf\ntrace = "t"\nstations = "s"', "[replay] speedup"),
    # [[hierarchies]]: a stream the daemon has, its columns, coarse to fine
    (
        "hierarchy-stream",
        '[[hierarchies]]\nstream = "trafic"\nlevels = ["segment", "station"]',
        "[[hierarchies]] #1 (trafic) stream: unknown stream 'trafic'; known: traffic, vehicles",
    ),
    (
        "hierarchy-column",
        '[[hierarchies]]\nstream = "traffic"\nlevels = ["segment", "lane"]',
        "[[hierarchies]] #1 (traffic) levels: 'lane' is not a column of the stream",
    ),
    (
        "hierarchy-one-level",
        '[[hierarchies]]\nstream = "traffic"\nlevels = ["segment"]',
        "[[hierarchies]] #1 (traffic) levels: a hierarchy needs at least two levels",
    ),
    (
        "hierarchy-twice",
        '[[hierarchies]]\nstream = "vehicles"\nlevels = ["pair", "length"]\n'
        '[[hierarchies]]\nstream = "traffic"\nlevels = ["segment", "station", "segment"]',
        "[[hierarchies]] #2 (traffic) levels: 'segment' is a level twice",
    ),
    (
        "hierarchy-key",
        '[[hierarchies]]\nstream = "traffic"\nlevel = ["a"]',
        "[[hierarchies]] #1 unknown key 'level'",
    ),
    (
        "hierarchy-type",
        '[[hierarchies]]\nstream = "traffic"\nlevels = "segment"',
        "[[hierarchies]] #1 levels: expected array",
    ),
]


def _numeric_fields() -> Iterator[tuple[str, str, Any]]:
    """(section, key, msgspec type) of every number a single-table section holds."""
    for section in msgspec.inspect.type_info(ConfigFile).fields:  # type: ignore[union-attr]
        t = section.type
        if isinstance(t, msgspec.inspect.UnionType):  # [mqtt], [simulation]: optional
            t = next(x for x in t.types if not isinstance(x, msgspec.inspect.NoneType))
        if not isinstance(t, msgspec.inspect.StructType):
            continue
        for f in t.fields:
            ft = f.type
            if isinstance(ft, msgspec.inspect.UnionType):
                ft = next(
                    (
                        x
                        for x in ft.types
                        if isinstance(x, msgspec.inspect.IntType | msgspec.inspect.FloatType)
                    ),
                    None,
                )
            if isinstance(ft, msgspec.inspect.IntType | msgspec.inspect.FloatType):
                yield section.name, f.name, ft


def _numeric_cases() -> Iterator[tuple[str, str, str]]:
    """Negative, unbounded and non-finite values for every duration, size and count; zero too
    where zero is not allowed."""
    for section, key, t in _numeric_fields():
        values = ["-1", "-inf", "inf", "nan", "1e308", str(BIG)]
        low = t.ge if t.ge is not None else t.gt
        if low is not None and (low > 0 or (t.gt is not None and t.gt >= 0)):
            values.append("0")
        for v in values:
            yield f"{section}.{key}={v}", f"[{section}]\n{key} = {v}", f"[{section}] {key}:"


ALL = CORPUS + list(_numeric_cases())


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("station\nx\n")
    return tmp_path


def _write(tmp: Path, text: str) -> Path:
    path = tmp / "gateway.toml"
    path.write_text(text.replace("{tmp}", str(tmp)))
    return path


def _load_and_check(path: Path) -> Config:
    """What `fjords-gateway run --config path` checks before it starts."""
    cfg = Config.load(path)
    cfg.check_paths()
    return cfg


@pytest.mark.parametrize(("name", "text", "message"), ALL, ids=[c[0] for c in ALL])
def test_the_loader_refuses_it_naming_the_key(
    tmp: Path, name: str, text: str, message: str
) -> None:
    path = _write(tmp, text)
    with pytest.raises(ConfigError) as e:
        _load_and_check(path)
    said = str(e.value)
    assert message.replace("{tmp}", str(tmp)) in said
    assert "\n" not in said.strip() and len(said) < 1000


def test_the_bounds_are_generous_and_every_number_is_covered() -> None:
    fields = {f"{s}.{k}" for s, k, _ in _numeric_fields()}
    assert {"sensors.retry_after_s", "http.max_body_bytes", "archive.sample_period_s"} <= fields
    assert MAX_SECONDS >= 10 * 365 * 86_400 and MAX_COUNT >= 2**40
    cfg = Config.from_dict(
        {
            "sensors": {"forget_offline_after_s": 9 * 365 * 86_400.0},
            "limits": {"max_state_bytes_per_query": 2**39},
        }
    )
    assert cfg.sensors.forget_offline_after_s == 9 * 365 * 86_400.0
    assert math.isfinite(cfg.sensors.forget_offline_after_s)


#: Files in place of the configuration itself (`{tmp}/...`, or a device).
FILES = [
    "/dev/zero",
    "/dev/null",
    "{tmp}/fifo",
    "{tmp}/dir",
    "{tmp}/big",
    "{tmp}/junk",
    "{tmp}/nope",
]


def _config_file(tmp: Path, name: str) -> str:
    if name.endswith("/big"):
        (tmp / "big").write_text("# " + "x" * (5 * 1024 * 1024) + "\n")
    if name.endswith("/junk"):
        (tmp / "junk").write_bytes(b"\xff\xfe\x00[http\x80" + bytes(range(256)))
    return name.replace("{tmp}", str(tmp))


@pytest.mark.parametrize("name", FILES)
def test_a_config_file_that_is_no_file_is_refused_without_reading_it(tmp: Path, name: str) -> None:
    path = _config_file(tmp, name)
    with pytest.raises(ConfigError) as e:
        Config.load(path)
    assert path in str(e.value)


# -- the real command ----------------------------------------------------------------------------

#: (corpus entry, with --check-config): `run` itself for some (the daemon would start next).
SUBSET = [
    ("deep-array", False),
    ("url-port-too-big", True),
    ("url-ftp", False),
    ("url-empty", True),
    ("prefix-hash", False),
    ("qid-escape", True),
    ("trace-fifo", True),
    ("sensors.retry_after_s=inf", False),
    ("history.keep_s=1e308", True),
    ("hierarchy-column", True),
    ("archive-url-ftp", False),
    ("gateway-id-slash", True),
]
SUBSET_CASES = [(*c, check) for name, check in SUBSET for c in ALL if c[0] == name]


RUN = ("run", "--no-state", "--http", "127.0.0.1:0")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """`fjords-gateway run` in a subprocess: its exit code and stderr as an operator sees them."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *RUN, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,  # a FIFO read would block for ever: the test fails instead of hanging
    )


def _refused(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    line = next((ln for ln in done.stderr.splitlines() if message in ln), None)
    assert line is not None, f"no line says {message!r}: {done.stderr}"


@pytest.mark.parametrize(
    ("name", "text", "message", "check"), SUBSET_CASES, ids=[c[0] for c in SUBSET_CASES]
)
def test_the_command_exits_2_with_one_line(
    tmp: Path,
    cli: CliRun,
    name: str,
    text: str,
    message: str,
    check: bool,
) -> None:
    path = _write(tmp, text)
    done = cli(*RUN, "--config", str(path), *(["--check-config"] if check else []))
    _refused(done, message.replace("{tmp}", str(tmp)))


@pytest.mark.parametrize("name", ["/dev/zero", "{tmp}/fifo"])
def test_the_command_refuses_a_config_that_is_no_file(tmp: Path, name: str) -> None:
    path = _config_file(tmp, name)
    _refused(_run("--config", path), f"cannot read config file {path}")


STATIONS = "station,latitude,longitude,segment\ns1,34.1,-118.2,A\n"
TRACE = "time,station,speed\n0,s1,60\n300,s1,61\n"

#: (name, trace, stations, what the message says): given with --trace and --stations (None:
#: a FIFO; a path: that file).
REPLAY_FILES: list[tuple[str, str | bytes | None, str | bytes | None, str]] = [
    ("trace-fifo", None, STATIONS, "[replay] trace (--trace) {trace}: a FIFO"),
    ("stations-fifo", TRACE, None, "[replay] stations (--stations) {stations}: a FIFO"),
    ("trace-dev-null", "/dev/null", STATIONS, "[replay] trace (--trace) /dev/null: a char"),
    ("trace-dev-zero", "/dev/zero", STATIONS, "[replay] trace (--trace) /dev/zero: a char"),
    ("stations-dir", TRACE, "{tmp}/dir", "[replay] stations (--stations) {tmp}/dir: a dir"),
    ("trace-empty", "", STATIONS, "[replay] trace (--trace) {trace}: {trace}: missing column"),
    ("trace-columns", "when,where\n1,2\n", STATIONS, "[replay] trace (--trace) {trace}:"),
    ("trace-numbers", "time,station,speed\nx,s1,y\n", STATIONS, "must be numbers"),
    ("trace-inf", "time,station,speed\ninf,s1,1\n", STATIONS, "non-finite number"),
    ("trace-junk", b"time,station,speed\n\xff\xfe\x00\x80", STATIONS, "[replay] trace (--trace)"),
    ("stations-empty", TRACE, "", "[replay] stations (--stations) {stations}: {stations}: miss"),
    ("stations-columns", TRACE, "id,lat\ns1,1\n", "[replay] stations (--stations) {stations}:"),
    ("stations-numbers", TRACE, "station,latitude\ns1,north\n", "latitude is not a number"),
    ("stations-nan", TRACE, "station,latitude\ns1,nan\n", "latitude is not finite"),
    ("stations-slash", TRACE, "station\na/b\n", "station 'a/b' cannot be a sensor id"),
    ("stations-wildcard", TRACE, "station\n#\n", "station '#' cannot be a sensor id"),
    ("stations-junk", TRACE, b"\x00\xff" * 100, "[replay] stations (--stations)"),
    ("no-common-station", TRACE, "station\ns9\n", "no station has both attributes and readings"),
]


def _replay_file(tmp: Path, name: str, content: str | bytes | None) -> str:
    if content is None:
        return str(tmp / "fifo")
    if isinstance(content, str) and content.startswith(("/dev/", "{tmp}")):
        return content.replace("{tmp}", str(tmp))
    path = tmp / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


@pytest.mark.parametrize(
    ("name", "trace", "stations", "message"), REPLAY_FILES, ids=[c[0] for c in REPLAY_FILES]
)
async def test_trace_and_stations_it_cannot_replay_are_config_errors(
    tmp: Path, name: str, trace: Any, stations: Any, message: str
) -> None:
    """What `run --trace T --stations S` does before the daemon starts (in-process here)."""
    from gateway.sources import configure_sources

    cfg = Config()
    cfg.trace = _replay_file(tmp, "trace.csv", trace)
    cfg.stations = _replay_file(tmp, "stations.csv", stations)
    with pytest.raises(ConfigError) as e:
        cfg.check_paths()
        configure_sources(Gateway(cfg))
    assert message.format(trace=cfg.trace, stations=cfg.stations, tmp=tmp) in str(e.value)


@pytest.mark.parametrize("name", ["trace-fifo", "trace-dev-null", "stations-junk"])
def test_run_refuses_trace_and_stations_it_cannot_replay(tmp: Path, cli: CliRun, name: str) -> None:
    _, trace, stations, message = next(c for c in REPLAY_FILES if c[0] == name)
    t, s = _replay_file(tmp, "trace.csv", trace), _replay_file(tmp, "stations.csv", stations)
    _refused(cli(*RUN, "--trace", t, "--stations", s), message.format(trace=t, stations=s, tmp=tmp))


def test_check_config_says_a_good_config_is_valid(tmp: Path) -> None:
    path = _write(tmp, '[mqtt]\nurl = "mqtt://[::1]:1884"\ntopic_prefix = "site/fj"\n')
    done = _run("--config", str(path), "--check-config")
    assert done.returncode == 0, done.stderr
    assert "is valid" in done.stderr


def test_speedup_must_be_finite(tmp: Path, cli: CliRun) -> None:
    t, s = _replay_file(tmp, "t.csv", TRACE), _replay_file(tmp, "s.csv", STATIONS)
    _refused(cli(*RUN, "--trace", t, "--stations", s, "--speedup", "nan"), "--speedup")


def test_the_replay_loaders_never_open_a_fifo(tmp: Path) -> None:
    """`simulate-motes --trace FIFO` too: refused at once, not blocked on."""
    from sensors.motes.replay import TraceFormatError, load_stations, load_trace

    for load in (load_trace, load_stations):
        with pytest.raises(TraceFormatError, match="not a regular file"):
            load(tmp / "fifo")


@pytest.mark.parametrize("content", [b"\xff\xfe\x00junk", b"", b"a,b\n1\n2,3,4\n", b"\x00" * 100])
def test_a_table_file_it_cannot_read_is_a_config_error_naming_the_table(
    tmp: Path, content: bytes
) -> None:
    """Loaded, or refused as a ConfigError naming the table: never another exception."""
    path = tmp / "incidents.csv"
    path.write_bytes(content)
    cfg = Config.from_dict({"tables": {"incidents": str(path)}})
    try:
        Gateway(cfg)
    except ConfigError as e:
        assert str(e).startswith("[tables] incidents: ")
    else:
        assert not content.startswith(b"\xff"), "a file that is not UTF-8 was loaded"
