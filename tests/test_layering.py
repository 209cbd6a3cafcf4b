"""The layers import downwards only: the runtime never imports the compiler, the lower packages
never import the gateway. Read from the source (every `import` and `from ... import`, also
inside functions and under TYPE_CHECKING), so an arrow up fails here before it tangles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (folder, what nothing in it may import)
RULES = [
    ("fjords/runtime", ("fjords.compile", "fjords.engine")),
    ("fjords", ("proxies", "sensors", "gateway", "firmware_sim")),
    ("proxies", ("gateway",)),
    ("sensors", ("gateway", "proxies")),
]


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize(("folder", "banned"), RULES, ids=[r[0] for r in RULES])
def test_no_import_goes_up(folder: str, banned: tuple[str, ...]) -> None:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, module in _imports(path):
            if any(module == b or module.startswith(b + ".") for b in banned):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_the_rules_see_imports() -> None:
    """The check reads what it should: the engine imports both halves."""
    modules = {m for _, m in _imports(ROOT / "fjords" / "engine.py")}
    assert "fjords.compile.planner" in modules and "fjords.runtime.fjord" in modules
