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


async def test_what_is_on_its_way_when_the_links_are_held_still_reaches_the_archive(
    tmp_path, monkeypatch
) -> None:
    """The writer falls behind and the gateway stops reading its links, but the readings it had
    already taken in (a link's inbound queue, the proxies' intake, the stream's queue: up to a
    queue bound each) still arrive, and are archived, not dropped: the CI's full fleet lost
    18,389 of 417,312 readings here while a slow disk held its writer back."""
    import threading

    import pyarrow.parquet as pq

    import gateway.archive as archive

    real = archive._write_many
    disk = threading.Event()

    def slow_disk(*a, **kw):
        disk.wait(timeout=60)
        return real(*a, **kw)

    monkeypatch.setattr(archive, "_write_many", slow_disk)
    cfg = Config()
    cfg.archive.dir = str(tmp_path)
    cfg.archive.segment_rows = 10
    cfg.archive.max_pending_rows = 100
    cfg.queue_bound = 64
    cfg.simulation = None
    gw = Gateway(cfg)
    sent = 0

    def push(n: int) -> None:
        nonlocal sent
        for _ in range(n):
            gw.fjord.push("traffic", (float(sent), "s1", 50.0, 34.0, -118.0, "S1"))
            sent += 1
        gw.fjord.run_until_idle()

    async with gw.archives["traffic"] as arch:
        while not gw.intake_full():
            push(1)
        for _ in range(3):  # what the link, the proxies and the stream still hold
            push(cfg.queue_bound)
        assert arch.stats()["rows_dropped"] == 0
        disk.set()
    assert arch.stats()["rows_dropped"] == 0
    assert arch.stats()["rows_written"] == sent
    assert sum(pq.read_metadata(p).num_rows for p in archive.segments(tmp_path / "traffic")) == sent
