"""domain/ imports nothing but the standard library and openai_harmony."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

DOMAIN = Path(__file__).resolve().parents[2] / "domain"
ALLOWED_THIRD_PARTY = {"openai_harmony"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_domain_imports_only_stdlib_and_harmony() -> None:
    files = sorted(DOMAIN.glob("*.py"))
    assert files, "no domain modules found"
    offenders = {}
    for path in files:
        bad = {
            name
            for name in _imports(path)
            if name not in sys.stdlib_module_names
            and name not in ALLOWED_THIRD_PARTY
            and name != "domain"
        }
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_domain_uses_no_clock_or_randomness() -> None:
    for path in sorted(DOMAIN.glob("*.py")):
        forbidden = _imports(path) & {
            "time",
            "datetime",
            "uuid",
            "random",
            "secrets",
            "os",
            "socket",
        }
        assert not forbidden, f"{path.name} imports {sorted(forbidden)}"
