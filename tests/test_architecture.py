"""The package layering of docs/architecture.md, checked on the source: every import inside
``edgesplit`` goes to the same package or to a lower layer (so packages form no cycle), and no
module reaches into another package's private (``_``) modules or names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "edgesplit"

# Lowest first; a package may import only from its own layer or lower ones. Keep this list and
# the table in docs/architecture.md in agreement.
LAYERS: list[set[str]] = [
    {"errors", "units", "registry", "validation"},  # the base: imports nothing of edgesplit
    {"data"},
    {"models"},
    {"graph"},
    {"hardware"},
    {"quant"},
    {"plan"},
    {"transport"},
    {"runtime"},
    {"train"},
    {"nas"},
    {"report"},
    {"cli"},
]
RANK = {pkg: rank for rank, layer in enumerate(LAYERS) for pkg in layer}


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "_pb2" not in p.name)


def _package(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0]


def _imports(path: Path) -> list[tuple[int, list[str]]]:
    """(line, dotted names) of every absolute edgesplit import, at any depth (lazy imports in
    functions count: they are dependencies all the same)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, [f"{node.module}.{a.name}" for a in node.names]))
        elif isinstance(node, ast.Import):
            found.append((node.lineno, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, ["<relative>"]))
    return [(line, [n for n in names if n.startswith("edgesplit.") or n == "<relative>"])
            for line, names in found]


def test_every_package_has_a_layer():
    packages = {_package(p) for p in _modules()} - {"__init__"}
    missing = sorted(packages - RANK.keys())
    assert not missing, f"add {missing} to LAYERS here and to docs/architecture.md"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_go_down_and_stay_public(path):
    package = _package(path)
    if package == "__init__":
        return  # edgesplit/__init__.py is the top-level facade
    problems = []
    for line, names in _imports(path):
        for name in names:
            if name == "<relative>":
                problems.append(f"line {line}: relative import (write edgesplit.<package>...)")
                continue
            parts = name.split(".")[1:]
            target = parts[0]
            if target == package:
                continue
            if RANK.get(target, -1) > RANK[package]:
                problems.append(f"line {line}: {package} (layer {RANK[package]}) imports "
                                f"{name} from the higher layer {target} ({RANK[target]})")
            private = [p for p in parts[1:] if p.startswith("_") and not p.startswith("__")]
            if private:
                problems.append(f"line {line}: {name} reaches into {target}'s private "
                                f"{private[0]}; export what is needed from a public module")
    assert not problems, "\n".join(problems)
