"""`[[mqtt.streams]]`: a declaration that cannot work is a configuration error naming the entry
and the key (exit code 2 from `run`), and the example configuration's declarations are valid."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.config import Config, ConfigError
from gateway.daemon import Gateway
from tests.support import ROOT

TASMOTA = """
[mqtt]
[[mqtt.streams]]
name = "climate"
topic = "tele/+/SENSOR"          # the + level is the sensor id
sensor_id_level = 1
format = "json"
time_path = "Time"
[mqtt.streams.columns]
temperature = { path = "AM2301.Temperature", type = "float" }
humidity = { path = "AM2301.Humidity", type = "float", unit = "%" }
"""


def stream(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "climate",
        "topic": "tele/+/SENSOR",
        "sensor_id_level": 1,
        "columns": {"temperature": {"path": "AM2301.Temperature"}},
    }
    return {**base, **changes}


def load(*streams: dict[str, Any], **top: Any) -> Config:
    return Config.from_dict({"mqtt": {"streams": list(streams)}, **top})


def test_the_tasmota_example_declares_a_stream(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(TASMOTA)
    cfg = Config.load(path)
    assert cfg.simulation is None  # real devices: no simulated ones
    (spec,) = cfg.plain_streams()
    assert spec.name == "climate" and spec.levels == ("tele", "+", "SENSOR")
    assert spec.time_path == ("Time",)
    assert [c.path for c in spec.columns] == [("AM2301", "Temperature"), ("AM2301", "Humidity")]
    gw = Gateway(cfg)
    schema = gw.fjord.streams["climate"].info.schema
    assert schema.names == ("time", "sensor", "temperature", "humidity")
    assert (
        schema.fields[3].unit == "%" and gw.fjord.streams["climate"].info.sensor_field == "sensor"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sensor_id_level": 3}, r"#1 \(climate\) sensor_id_level: 3 is out of range"),
        ({"sensor_id_level": 2}, r"sensor_id_level: level 2 of topic 'tele/\+/SENSOR' is 'SENSOR'"),
        ({"sensor_id_level": -1}, r"sensor_id_level: expected int >= 0"),
        ({"topic": "tele/x/SENSOR"}, r"sensor_id_level: .* it has no '\+' level"),
        ({"topic": "tele/+/#", "sensor_id_level": 2}, r"sensor_id_level: 2 is out of range"),
        ({"topic": "tele/a+/SENSOR"}, r"topic: 'tele/a\+/SENSOR': '\+' must be a whole level"),
        ({"topic": "tele/#/x"}, r"topic: .*'#' must be the whole last level"),
        (
            {"topic": "+/sensors/+/data", "sensor_id_level": 0},
            r"topic: .* overlaps the gateway's own",
        ),
        ({"columns": {"t": {"path": "a..b"}}}, r"columns\.t\.path: 'a\.\.b' has an empty key"),
        ({"columns": {"t": {"path": "a[0]"}}}, r"columns\.t\.path: .*write list items as a\.0\.b"),
        ({"columns": {"t": {"path": ""}}}, r"columns\.t\.path: an empty path"),
        (
            {"columns": {"t": {"path": "a", "type": "double"}}},
            r"columns\.t\.type: .*'double' \(known: float",
        ),
        ({"columns": {"t": {"pth": "a"}}}, r"columns\.t: unknown key pth"),
        ({"columns": {"t": {"type": "int"}}}, r"columns\.t: missing required key path"),
        ({"columns": {"time": {"path": "a"}}}, r"columns\.time: 'time' is a column of every"),
        ({"columns": {"temp C": {"path": "a"}}}, r"columns\.temp C: 'temp C' is not a column name"),
        ({"columns": {}}, r"columns: declare at least one column"),
        ({"time_path": "Time..x"}, r"time_path: 'Time\.\.x' has an empty key"),
        ({"time_zone": "Mars/Olympus"}, r"time_zone: unknown time zone"),
        ({"name": "traffic"}, r"name: 'traffic' is already a stream or table"),
        ({"name": "my-stream"}, r"name: 'my-stream' is not a stream name"),
        ({"format": "xml"}, r"\[mqtt\] streams\[0\]\.format: invalid enum value 'xml'"),
        ({"max_depth": 0}, r"\[mqtt\] streams\[0\]\.max_depth: expected int >= 1"),
    ],
)
def test_a_declaration_that_cannot_work_is_a_clear_error(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(stream(**changes))


def test_names_are_unique_across_streams_and_tables() -> None:
    with pytest.raises(ConfigError, match=r"#2 \(climate\) name: 'climate' is already"):
        load(stream(), stream(topic="other/+"))
    with pytest.raises(ConfigError, match=r"name: 'rooms' is already"):
        load(stream(name="rooms"), tables={"rooms": "rooms.csv"})


def test_run_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.toml"
    path.write_text(TASMOTA.replace("sensor_id_level = 1", "sensor_id_level = 7"))
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "[[mqtt.streams]] #1 (climate) sensor_id_level: 7 is out of range" in err


def test_the_example_configs_streams_are_valid() -> None:
    """The commented [[mqtt.streams]] of gateway.example.toml, uncommented, load."""
    text = (ROOT / "gateway.example.toml").read_text()
    start = text.index("# [[mqtt.streams]]")
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith("# ") and line != "#":
            break
        line = line[2:]
        if re.match(r"\[|[a-z_]+ = ", line):
            lines.append(line.split("  #", 1)[0])
    specs = Config.from_dict(tomllib.loads("[mqtt]\n" + "\n".join(lines))).plain_streams()
    assert [s.name for s in specs] == ["climate", "zigbee"]
    assert [c.name for c in specs[1].columns] == ["temperature", "battery", "occupancy"]
