"""Every package folder is installed: the package list in pyproject.toml is kept by hand."""

from __future__ import annotations

import importlib
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = {
    "fjords": "fjords",
    "proxies": "proxies",
    "sensors": "sensors",
    "gateway": "gateway",
    "firmware-sim": "firmware_sim",
}


def _declared() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_declared() -> None:
    declared = _declared()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            dotted = ".".join((name, *rel.parts))
            assert dotted in declared, f"{dotted} missing from [tool.setuptools] packages"


def test_declared_packages_import() -> None:
    for name in _declared():
        importlib.import_module(name)
