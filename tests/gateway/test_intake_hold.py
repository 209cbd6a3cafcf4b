"""The gateway tells its MQTT transports to stop reading while its bounded queues fill: reading
as fast as the socket allows moves a fleet's backlog from the broker into the archive's input
queue, which drops readings (11,178 of 417,312 in test_fleet_progress.py's full fleet)."""

from __future__ import annotations

from gateway.config import Config
from gateway.daemon import Gateway


def test_intake_full_when_a_stream_queue_is_half_full() -> None:
    gw = Gateway(Config())
    q = gw.fjord.streams["traffic"].queue
    assert not gw.intake_full()
    row = (0.0, "s1", 0.0, 0.0, "seg", 50.0)
    for _ in range(q.bound // 2):
        q.put(row)
    assert gw.intake_full()


def test_intake_full_while_an_archive_writer_is_behind(tmp_path) -> None:
    cfg = Config()
    cfg.archive.dir = str(tmp_path)
    gw = Gateway(cfg)
    arch = gw.archives["traffic"]
    assert not gw.intake_full()
    arch.op.pending_rows = arch.op.max_pending_rows
    assert gw.intake_full()
    arch.op.pending_rows = 0
    for _ in range(arch.input.bound // 2):
        arch.input.put((0.0,))
    assert gw.intake_full()


def test_mqtt_transports_are_given_the_hold(tmp_path) -> None:
    from gateway.config import MqttConfig
    from gateway.sources import configure_sources

    cfg = Config()
    cfg.mqtt = MqttConfig(url="mqtt://127.0.0.1:1")
    cfg.simulation = None
    gw = Gateway(cfg)
    configure_sources(gw)
    mqtt = [t for t in gw.links if type(t).__name__ == "MqttTransport"]
    assert mqtt and all(t.hold == gw.intake_full for t in mqtt)
