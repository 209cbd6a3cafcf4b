"""Import `firmware_sim` from this checkout: an editable install may map it to another clone
(the package lives in the folder firmware-sim/, which a plain sys.path entry cannot name)."""

from __future__ import annotations

import firmware_sim

from tests.support import ROOT

_HERE = str(ROOT / "firmware-sim")
if _HERE not in firmware_sim.__path__:
    firmware_sim.__path__.insert(0, _HERE)
