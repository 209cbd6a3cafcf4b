"""The archive of a fleet: each gateway writes its own `gateway=<id>/date=<day>/` tree of one
root, every row carries its gateway and every segment names gateway, stream and schema version
in its Parquet metadata; the root may be a `file://` URL, or an object store (here pyarrow's
in-memory mock filesystem), where a segment is one object and nothing temporary is ever seen."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from pyarrow._fs import _MockFileSystem

import gateway.archive as archive
from fjords.runtime.fjord import Fjord
from gateway import archive_layout as layout
from gateway.archive import ArchiveWriter, error_reason, segments
from gateway.archive_reader import ArchiveHistory
from gateway.config import Config
from gateway.daemon import TRAFFIC_SCHEMA, Gateway
from tests.support import async_eventually

DAY = 86_400.0


def rows(n: int, start: float = 0.0, step: float = 1.0, speed: float = 1.0) -> list[tuple]:
    return [(start + i * step, f"st{i % 3}", speed, 34.0, -118.0, "S1") for i in range(n)]


def fjord() -> Fjord:
    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    return f


async def archive_rows(directory: Any, gateway: str, data: list[tuple], **kw: Any) -> ArchiveWriter:
    f = fjord()
    async with ArchiveWriter(f, "traffic", directory, gateway=gateway, **kw) as arch:
        for t in data:
            f.push("traffic", t)
        f.run_until_idle()
    return arch


async def test_two_gateways_write_two_trees_of_one_root(tmp_path: Path) -> None:
    a_rows = rows(30, start=DAY - 10)  # across midnight: 10 rows on day 0, 20 on day 1
    b_rows = rows(12, start=5 * DAY, speed=2.0)
    a = await archive_rows(tmp_path, "gw-a", a_rows, segment_rows=10, segment_seconds=1e9)
    b = await archive_rows(tmp_path, "gw-b", b_rows, segment_rows=10, segment_seconds=1e9)
    assert (a.rows_written, b.rows_written) == (30, 12)
    storage = layout.Storage(tmp_path)
    assert layout.gateways(storage, "traffic") == ["gw-a", "gw-b"]
    found_a = layout.segments(storage, "traffic", "gw-a")
    assert [(s.date, s.first) for s in found_a] == [
        ("1970-01-01", 0),  # the date of a segment's earliest reading
        ("1970-01-02", 1),
        ("1970-01-02", 2),
    ]
    assert [(s.date, s.first) for s in layout.segments(storage, "traffic", "gw-b")] == [
        ("1970-01-06", 0),
        ("1970-01-06", 1),
    ]
    for gw, data in (("gw-a", a_rows), ("gw-b", b_rows)):
        got = []
        for s in layout.segments(storage, "traffic", gw):
            table = pq.read_table(s.path)
            assert table.schema.names == ["gateway", *TRAFFIC_SCHEMA.names]
            assert table.column("gateway").to_pylist() == [gw] * table.num_rows
            meta = pq.read_metadata(s.path).metadata
            assert meta[b"fjords.gateway"] == gw.encode()
            assert meta[b"fjords.stream"] == b"traffic"
            assert meta[b"fjords.schema_version"] == layout.schema_version(TRAFFIC_SCHEMA).encode()
            assert layout.declared_schema(meta) == [(f.name, f.type) for f in TRAFFIC_SCHEMA.fields]
            got += [tuple(r.values())[1:] for r in table.to_pylist()]
        assert got == data
    # The whole root read as one dataset: every row attributed to its gateway.
    whole = pq.read_table(tmp_path / "traffic", partitioning=None)
    counts: dict[str, int] = {}
    for g in whole.column("gateway").to_pylist():
        counts[g] = counts.get(g, 0) + 1
    assert counts == {"gw-a": 30, "gw-b": 12}


async def test_numbers_continue_after_the_gateways_highest_and_legacy_ones(tmp_path: Path) -> None:
    archive.write_segment(tmp_path / "traffic", 0, TRAFFIC_SCHEMA, rows(3))
    archive.write_segment(tmp_path / "traffic", 1, TRAFFIC_SCHEMA, rows(3))
    first = await archive_rows(tmp_path, "gw-a", rows(4), segment_rows=2)
    assert (first.first_seq, first.seq) == (2, 4)
    other = await archive_rows(tmp_path, "gw-b", rows(2))
    assert other.first_seq == 2  # another gateway's numbers are its own
    again = ArchiveWriter(fjord(), "traffic", tmp_path, gateway="gw-a")
    assert again.first_seq == 4
    assert len(segments(tmp_path / "traffic")) == 2 + 2 + 1


def test_a_gateway_id_that_names_no_directory_is_refused(tmp_path: Path) -> None:
    for bad in ("", "../x", "a/b", ".hidden", "x" * 64):
        with pytest.raises(ValueError, match="gateway id"):
            ArchiveWriter(fjord(), "traffic", tmp_path, gateway=bad)


async def test_a_file_url_root_works_end_to_end(tmp_path: Path) -> None:
    """`[archive] dir = "file:///..."` in a config file: kept as a URL, written, and read back
    by snapshots (the archive's part of the range) and /status names the gateway."""
    conf = tmp_path / "gateway.toml"
    root = tmp_path / "arch"
    conf.write_text(
        f'[gateway]\nid = "edge-7"\n[archive]\ndir = "file://{root}"\nsegment_rows = 20\n'
        "segment_seconds = 1e8\n[history]\nkeep_s = 60\n[runtime]\nmax_lag_seconds = 1.0\n"
    )
    cfg = Config.load(conf)
    assert cfg.archive.dir == f"file://{root}" and cfg.gateway.id == "edge-7"
    cfg.check_paths()
    data = rows(200, step=10.0)
    async with Gateway(cfg) as gw:
        from gateway.status_page import status

        assert status(gw)["gateway"] == "edge-7"
        for t in data:
            gw.fjord.push("traffic", t)
            gw.fjord.run_until_idle()
        arch = gw.archives["traffic"]
        await async_eventually(lambda: arch.rows_written, lambda n: n >= 180)
        body = gw.snapshot("SELECT COUNT(*) AS n FROM traffic")
        to = gw.fjord.streams["traffic"].router.progress.watermark
        assert body["complete"] is True
        assert body["rows"] == [{"n": sum(1 for t in data if t[0] < to)}]
    parts = sorted((root / "traffic" / "gateway=edge-7").glob("date=*/part-*.parquet"))
    assert sum(pq.read_metadata(p).num_rows for p in parts) == len(data)


class Recording(pafs.FileSystemHandler):
    """pyarrow's in-memory mock filesystem as an object store: records every object written
    and every listing, can refuse uploads (`refuse`: the error to raise), and has no rename."""

    def __init__(self) -> None:
        self.fs = _MockFileSystem()
        self.outputs: list[str] = []
        self.listed: list[str] = []
        self.refuse: Exception | None = None
        self.refuse_listing: Exception | None = None
        self.lock = threading.Lock()

    def get_type_name(self) -> str:
        return "recording-mock"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return other is self

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        if self.refuse_listing is not None:
            raise self.refuse_listing
        infos = self.fs.get_file_info(selector)
        with self.lock:
            self.listed += [i.path for i in infos]
        return infos

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.fs.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        raise AssertionError(f"an object store has no rename: move({src!r}, {dest!r})")

    def copy_file(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        if self.refuse is not None:
            raise self.refuse
        with self.lock:
            self.outputs.append(path)
        return self.fs.open_output_stream(path)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        raise AssertionError("segments are never appended to")


def test_object_store_storage_names() -> None:
    storage = layout.Storage("s3a://bucket/fleet", fs=pafs.PyFileSystem(Recording()))
    assert (storage.root, storage.scheme, storage.local) == ("bucket/fleet", "s3a", False)
    assert storage.spark_url() == "s3a://bucket/fleet"


async def test_an_object_store_gets_one_object_per_segment_and_no_temporary_one() -> None:
    handler = Recording()
    storage = layout.Storage("s3://bucket/fleet", fs=pafs.PyFileSystem(handler))
    data = rows(50)
    f = fjord()
    async with ArchiveWriter(f, "traffic", storage, gateway="gw-s3", segment_rows=10) as arch:
        for t in data[:25]:
            f.push("traffic", t)
        f.run_until_idle()
        await async_eventually(lambda: arch.rows_written, lambda n: n >= 20)
        for t in data[25:]:
            f.push("traffic", t)
        f.run_until_idle()
        # The gateway's own reader, through the storage: every reading, whatever its time.
        history = ArchiveHistory({"traffic": arch})
        await async_eventually(lambda: arch.rows_written, lambda n: n == 50)
        arch.first_seq = arch.seq  # as if written by an earlier run: read whole
        got = history.readings("traffic", 0.0, 1e9, 0.0, frozenset(TRAFFIC_SCHEMA.names))
        assert got is not None and got.complete and got.count == 50
        assert sorted(got.tuples()) == sorted(data)
    found = layout.segments(storage, "traffic", "gw-s3")
    assert [s.first for s in found] == [0, 1, 2, 3, 4]
    assert handler.outputs == [s.path for s in found]  # one object each, under its final name
    names = [p.rsplit("/", 1)[-1] for p in handler.listed]
    assert names and not [n for n in names if n.startswith((".", "_"))]
    meta = pq.read_metadata(storage.open_input(found[0].path)).metadata
    assert meta[b"fjords.gateway"] == b"gw-s3"


async def test_an_object_store_refusing_uploads_is_retried_and_counted_by_reason() -> None:
    handler = Recording()
    storage = layout.Storage("s3://bucket/fleet", fs=pafs.PyFileSystem(handler))
    handler.refuse = OSError("AWS Error ACCESS_DENIED during PutObject operation: Access Denied")
    f = fjord()
    async with ArchiveWriter(
        f, "traffic", storage, gateway="gw-s3", segment_rows=5, retry_seconds=0.01
    ) as arch:
        for t in rows(10):
            f.push("traffic", t)
        f.run_until_idle()
        await async_eventually(lambda: arch.write_errors, lambda n: n >= 2, interval=0.01)
        assert arch.failing is not None and arch.failing.reason == "permission"
        assert arch.health() and "Access Denied" in arch.health()[0]
        handler.refuse = pa.ArrowInvalid("the store said something odd")
        n = arch.write_errors
        await async_eventually(lambda: arch.write_errors, lambda m: m > n, interval=0.01)
        assert arch.failing is not None and arch.failing.reason == "storage"
        handler.refuse = None
        await async_eventually(lambda: arch.rows_written, lambda n: n == 10)
        assert arch.failing is None and arch.health() == []
    assert arch.errors["permission"] >= 2 and arch.errors["storage"] >= 1
    assert set(arch.errors) == {"permission", "storage"}


@pytest.mark.parametrize(
    "error, reason",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no_space"),
        (OSError(errno.EROFS, "Read-only file system"), "read_only"),
        (OSError("AWS Error ACCESS_DENIED during PutObject"), "permission"),
        (OSError("HTTP 403 Forbidden"), "permission"),
        (OSError("AWS Error NETWORK_CONNECTION during PutObject: curlCode: 7"), "unreachable"),
        (OSError("Quota exceeded"), "no_space"),
        (OSError("something else"), "io"),
        (pa.ArrowInvalid("bad"), "storage"),
        (pa.ArrowNotImplementedError("no"), "storage"),
    ],
)
def test_error_reasons_of_disks_and_object_stores(error: Exception, reason: str) -> None:
    assert error_reason(error) == reason


async def test_two_gateways_in_one_root_each_write_their_own_tree(tmp_path: Path) -> None:
    """Two daemons (in-process) with different `[gateway] id`, one archive root."""
    configs = []
    for gid in ("cabinet-1", "cabinet-2"):
        cfg = Config.from_dict({"gateway": {"id": gid}, "archive": {"dir": str(tmp_path)}})
        configs.append(cfg)
    sent = {"cabinet-1": rows(7), "cabinet-2": rows(5, start=2 * DAY)}
    async with Gateway(configs[0]) as one, Gateway(configs[1]) as two:
        for gw in (one, two):
            for t in sent[gw.gateway_id]:
                gw.fjord.push("traffic", t)
    storage = layout.Storage(tmp_path)
    assert layout.gateways(storage, "traffic") == ["cabinet-1", "cabinet-2"]
    for gid, data in sent.items():
        found = layout.segments(storage, "traffic", gid)
        table = pa.concat_tables(pq.read_table(s.path) for s in found)
        assert set(table.column("gateway").to_pylist()) == {gid}
        assert table.drop_columns(["gateway"]).to_pylist() == [
            dict(zip(TRAFFIC_SCHEMA.names, t, strict=True)) for t in data
        ]


def test_a_root_whose_filesystem_cannot_be_opened_is_a_config_error(tmp_path: Path) -> None:
    """hdfs:// without libhdfs (as here): one line naming the key, not a traceback."""
    from gateway.config import ConfigError

    cfg = Config.from_dict({"archive": {"dir": "hdfs://namenode:8020/fjords"}})
    with pytest.raises(ConfigError, match=r"^\[archive\] dir: .*cannot open its filesystem") as e:
        Gateway(cfg)
    assert "\n" not in str(e.value)


def test_spark_over_a_remote_root_needs_a_state_dir() -> None:
    from gateway.queries import _local_root

    assert _local_root("/srv/a") == "/srv/a" and _local_root("file:///srv/a") == "/srv/a"
    assert _local_root("s3a://bucket/a") is None and _local_root("hdfs://nn/a") is None


async def test_a_store_that_cannot_list_makes_a_snapshot_incomplete_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = Recording()
    storage = layout.Storage("s3://bucket/fleet", fs=pafs.PyFileSystem(handler))
    f = fjord()
    async with ArchiveWriter(f, "traffic", storage, gateway="gw-s3", segment_rows=5) as arch:
        for t in rows(10):
            f.push("traffic", t)
        f.run_until_idle()
        await async_eventually(lambda: arch.rows_written, lambda n: n == 10)
        history = ArchiveHistory({"traffic": arch})
        handler.refuse_listing = OSError("AWS Error NETWORK_CONNECTION during ListObjectsV2")
        for _ in range(2):
            got = history.readings("traffic", 0.0, 1e9, 1e9, frozenset(TRAFFIC_SCHEMA.names))
            assert got is not None and not got.complete
            assert got.skipped == (arch.gateway_dir,) and got.count == 0
        assert history.list_failures == {"traffic": 2}
        assert sum("cannot list the segments" in r.getMessage() for r in caplog.records) == 1
        handler.refuse_listing = None
        got = history.readings("traffic", 0.0, 1e9, 1e9, frozenset(TRAFFIC_SCHEMA.names))
        assert got is not None and got.complete and got.count == 10
