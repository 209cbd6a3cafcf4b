"""Import `firmware_sim` from this checkout: an editable install may map it to another clone
(the package lives in the folder firmware-sim/, which a plain sys.path entry cannot name).

`image`: the AVR protocol firmware, built once per run (skips without the toolchain, fails
under CI=true)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import firmware_sim
import pytest

from tests.support import ROOT, require, require_binary

if TYPE_CHECKING:
    from firmware_sim.loop import Image

_HERE = str(ROOT / "firmware-sim")
if _HERE not in firmware_sim.__path__:
    firmware_sim.__path__.insert(0, _HERE)


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    require_binary("avr-gcc", "gcc-avr")
    require_binary("simavr", "simavr")
    from firmware_sim.loop import build_image, toolchain_missing

    missing = toolchain_missing()
    require(not missing, f"{', '.join(missing)} (Debian packages libsimavr-dev, gcc)")
    return build_image(tmp_path_factory.mktemp("avr"))
