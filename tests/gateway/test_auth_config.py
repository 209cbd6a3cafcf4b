"""`[sensors] keys_file` and `require_mac`: what each combination means, and the errors (exit 2,
naming the key and the file or line) for what cannot be honoured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import Config, ConfigError
from sensors.auth import derive_key
from tests.daemon import Daemon
from tests.support import ROOT, eventually

MASTER = bytes(range(16))


def _keys(tmp_path: Path, text: str | None = None) -> Path:
    path = tmp_path / "motes.keys"
    path.write_text(f"* {MASTER.hex()}\n" if text is None else text)
    return path


def test_keys_make_macs_required_by_default(tmp_path: Path) -> None:
    cfg = Config.from_dict({"sensors": {"keys_file": "motes.keys"}}, base=_keys(tmp_path).parent)
    assert cfg.require_mac and cfg.keyring is not None
    assert cfg.keyring.key_for("S1") == derive_key(MASTER, "S1")
    relaxed = Config.from_dict(
        {"sensors": {"keys_file": str(_keys(tmp_path)), "require_mac": False}}
    )
    assert not relaxed.require_mac and relaxed.keyring is not None
    assert not Config.from_dict({}).require_mac


@pytest.mark.parametrize(
    ("sensors", "keys", "expected"),
    [
        ({"require_mac": True}, None, "[sensors] require_mac = true needs keys_file"),
        ({"keys_file": "missing.keys"}, None, "missing.keys: not a regular file"),
        ({"keys_file": "motes.keys"}, "S1 abcd\n", "motes.keys:1: key must be 16 bytes"),
        ({"keys_file": "motes.keys"}, "S1 zz\n", "motes.keys:1: key is not hex"),
        ({"keys_file": "motes.keys"}, "# nothing\n", "holds no keys"),
        ({"keys_file": "."}, None, "not a regular file"),
    ],
)
def test_bad_keys_are_config_errors(
    tmp_path: Path, sensors: dict[str, object], keys: str | None, expected: str
) -> None:
    if keys is not None:
        _keys(tmp_path, keys)
    with pytest.raises(ConfigError) as e:
        Config.from_dict({"sensors": sensors}, base=tmp_path)
    assert "[sensors] " in str(e.value) and expected in str(e.value)


def test_the_daemon_exits_2_naming_the_key_and_the_line(tmp_path: Path) -> None:
    _keys(tmp_path, f"S1 {MASTER.hex()}\nS1 {MASTER.hex()}\n")
    config = tmp_path / "gateway.toml"
    config.write_text('[sensors]\nkeys_file = "motes.keys"\n')
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "[sensors] keys_file" in done.stderr and "motes.keys:2" in done.stderr


def test_embedded_motes_get_their_keys_and_no_keys_is_a_warning(tmp_path: Path) -> None:
    """`make run`'s simulated fleet, with a keys file: every message is sealed and admitted."""
    keyed = tmp_path / "keyed"
    keyed.mkdir()
    keys = _keys(keyed)
    small = "[simulation]\nstations = 4\nsegments = 2\ntraffic_pair = false\n"
    with Daemon(keyed, f'{small}[sensors]\nkeys_file = "{keys}"\n') as gw:
        eventually(
            lambda: len(gw.get("/sensors")["sensors"]),
            lambda n: n == 4,
            message="the fleet registers",
        )
        assert gw.metric("fjords_auth_rejected_total") == 0
        assert "not authenticated" not in gw.tail()
    plain = tmp_path / "plain"
    plain.mkdir()
    with Daemon(plain, small) as gw:
        eventually(lambda: len(gw.get("/sensors")["sensors"]), lambda n: n == 4)
        assert "mote messages are not authenticated" in gw.tail()
