"""The import graph of docs/architecture.md, checked on the source.

- Packages: every import between two of ``edgesplit``'s packages (or top-level modules) goes
  along an edge ``ALLOWED`` declares, and every declared edge is used, so the declaration is
  the truth and not a permission slip. The declared graph has no cycle.
- Modules: no cycle among the imports that run while a module is imported (module and class
  bodies). A cycle that needs an import inside a function is allowed: that is the usual,
  deliberate way to break one (a registry's lazy loader, a module importing the one that
  imports it only when called), and the package graph already keeps any cycle inside one
  package. Imports under ``TYPE_CHECKING`` never run and make no cycle.
- No module imports another package's private (``_``) modules or names, and none imports
  relatively.
- The README's tree lists exactly the packages there are, and docs/architecture.md shows this
  graph and a layer table it agrees with.

The reading of the source is in ``import_graph.py``, tested here on small synthetic trees.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from import_graph import (
    GRAPH_BEGIN,
    GRAPH_END,
    Scan,
    cycles,
    docs_graph,
    docs_layers,
    layer_disagreements,
    module_graph,
    node_of,
    private_reaches,
    readme_files,
    readme_problems,
    readme_tree,
    render,
    scan,
    undeclared,
    unused,
    where,
)

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "edgesplit"

# package -> the packages it may import; lowest first. Only edges the code uses (the test
# below fails on one it does not), so adding an import across packages means adding its edge
# here and in docs/architecture.md, where the reason can be read. ``edgesplit`` is the facade
# (edgesplit/__init__.py); nothing imports it.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "units": {"errors"},
    "registry": {"errors"},
    "validation": {"errors"},
    "data": {"errors", "registry"},
    "models": {"errors", "registry", "data"},  # data: the cache folder, the tokenizer
    "graph": {"errors", "units", "models"},  # models: a built-in model captured by name
    "hardware": {"errors", "registry", "units", "validation", "data", "graph"},  # data: cache
    "quant": {"errors", "data", "graph"},  # data: the evaluation sets the quality meter reads
    "plan": {"errors", "registry", "validation", "data", "graph", "hardware", "quant"},
    "transport": {"errors", "hardware"},  # hardware: a Link to shape, the thread pool to free
    "runtime": {"errors", "registry", "data", "graph", "hardware", "quant", "plan", "transport"},
    # the split LLM over all of them: models for causal LMs by name, data for the checkpoint
    # cache, runtime and transport for the stage server and the client
    "llm": {"errors", "data", "models", "graph", "hardware", "quant", "plan", "transport",
            "runtime"},
    "train": {"errors", "data", "models", "graph", "hardware", "quant", "plan", "transport",
              "runtime"},
    "nas": {"errors", "registry", "units", "data", "graph", "hardware", "plan"},
    "report": {"errors", "models", "graph", "hardware", "plan", "llm", "nas"},
    "cli": {"errors", "units", "data", "models", "graph", "hardware", "plan", "transport",
            "runtime", "llm", "train", "nas", "report"},
    "edgesplit": {"graph"},  # the facade's lazy split_point
}


@functools.cache
def _tree() -> Scan:
    return scan(SRC)


def _module_paths() -> list[str]:
    return sorted(str(p.relative_to(SRC)) for p in _tree().modules.values())


def _of(path: str) -> Scan:
    """The scan of one module of the tree (its imports and relative imports only)."""
    tree = _tree()
    (module,) = [m for m, p in tree.modules.items() if str(p.relative_to(SRC)) == path]
    return Scan(tree.src, tree.modules, [i for i in tree.imports if i.source == module],
                [r for r in tree.relative if r[0] == module])


@pytest.mark.parametrize("path", _module_paths())
def test_imports_follow_the_graph_and_stay_public(path):
    one = _of(path)
    problems = undeclared(one, ALLOWED) + private_reaches(one)
    problems += [f"{where(one, m, line)}: relative import (write edgesplit.<package>...)"
                 for m, line in one.relative]
    assert not problems, ("\n".join(problems) + "\n(a new dependency: declare it in ALLOWED "
                          "and docs/architecture.md, if the layering allows it)")


def test_every_declared_edge_is_used():
    problems = unused(_tree(), ALLOWED)
    assert not problems, "\n".join(problems) + "\n(remove it from ALLOWED and the docs)"


def test_every_package_is_declared():
    nodes = {node_of(m) for m in _tree().modules}
    assert nodes == ALLOWED.keys(), (f"undeclared: {sorted(nodes - ALLOWED.keys())}; "
                                     f"declared but absent: {sorted(ALLOWED.keys() - nodes)}")


def test_the_declared_graph_has_no_cycle():
    assert not cycles(ALLOWED)


def test_no_module_cycle_at_import_time():
    found = cycles(module_graph(_tree().imports, {"top"}))
    assert not found, "modules that import each other while being imported:\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_readme_tree_lists_every_package_and_only_those():
    entries = readme_tree((REPO / "README.md").read_text())
    problems = readme_problems(entries, _tree().modules) + readme_files(entries, SRC)
    assert not problems, "\n".join(problems)


def test_docs_show_the_declared_graph():
    text = (REPO / "docs" / "architecture.md").read_text()
    assert docs_graph(text) == render(ALLOWED), (
        f"docs/architecture.md's import graph should read:\n{render(ALLOWED)}")


def test_docs_layer_table_agrees_with_the_graph():
    text = (REPO / "docs" / "architecture.md").read_text()
    problems = layer_disagreements(ALLOWED, docs_layers(text))
    assert not problems, "\n".join(problems)


NAS_SYSTEMS = ("jmsnas", "splitnets", "adaptivenet")


def _nas_part(module: str) -> str | None:
    """``core`` for a module of ``nas/core/``, the system for one of a system's packages,
    ``nas`` for the package's own ``__init__``; None for a module outside ``nas``."""
    parts = module.split(".")
    if parts[:2] != ["edgesplit", "nas"]:
        return None
    return parts[2] if len(parts) > 2 else "nas"


def test_nas_is_a_core_and_three_systems():
    """Every module of ``nas`` lives in ``nas/core/`` or one of the systems' packages; only
    the package's ``__init__`` sits at its root."""
    stray = sorted(m for m in _tree().modules
                   if _nas_part(m) not in (None, "nas", "core", *NAS_SYSTEMS))
    assert not stray, f"modules at nas/'s root: {stray} (move them into nas/core/ or a system)"


def test_nas_systems_share_only_the_core():
    """docs/architecture.md's NAS package: a shared core and three systems over it. A system
    imports the core and itself, never another system; the core imports no system; the
    package's ``__init__`` re-exports the core only."""
    tree = _tree()
    allowed = {"core": {"core"}, "nas": {"core"},
               **{system: {"core", system} for system in NAS_SYSTEMS}}
    problems = [f"{where(tree, i.source, i.line)}: {_nas_part(i.source)} imports {i.target}"
                for i in tree.imports if _nas_part(i.source) is not None
                and _nas_part(i.target) is not None
                and _nas_part(i.target) not in allowed[_nas_part(i.source)]]
    assert not problems, ("\n".join(problems) + "\n(move what two systems need into "
                          "nas/core/)")


LLM_PARTS = ("model", "planning", "stage", "generate", "api")  # lowest first


def _llm_part(module: str) -> int | None:
    """The rank of an ``llm`` module's sub-package in LLM_PARTS; -1 for ``edgesplit.llm``
    itself (its ``__init__``, which re-exports the parts), None outside ``llm``."""
    parts = module.split(".")
    if parts[:2] != ["edgesplit", "llm"]:
        return None
    return LLM_PARTS.index(parts[2]) if len(parts) > 2 else -1


def test_llm_parts_import_only_those_before_them():
    """docs/architecture.md's llm package: a sub-package per job, each importing only the
    parts before it in LLM_PARTS (and itself), never the package's re-exports."""
    tree = _tree()
    problems = [f"{where(tree, i.source, i.line)}: {i.source} imports {i.target}"
                for i in tree.imports
                if (src := _llm_part(i.source)) is not None and src >= 0
                and (dst := _llm_part(i.target)) is not None and not 0 <= dst <= src]
    assert not problems, ("\n".join(problems) + "\n(a part imports only the parts before it; "
                          "move what two parts need into the lower one)")


# --- the checker on small synthetic trees ------------------------------------------------------

def _write(root: Path, files: dict[str, str]) -> Path:
    """A tree ``root/edgesplit/...`` of the given modules (text), each package with an
    ``__init__.py``; returns the ``edgesplit`` folder."""
    src = root / "edgesplit"
    for name, text in {"__init__.py": "", **files}.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(src).parents:
            (src / parent / "__init__.py").touch()
        path.write_text(text)
    return src


def test_checker_finds_an_undeclared_edge_and_where(tmp_path):
    src = _write(tmp_path, {"low/a.py": "def f():\n    from edgesplit.high.b import g\n",
                            "high/b.py": "from edgesplit.low.a import f\n"})
    tree = scan(src)
    assert undeclared(tree, {"high": {"low"}, "low": set()}) == [
        "low/a.py:2: low imports edgesplit.high.b.g, but low -> high is not a declared edge"]
    assert not undeclared(tree, {"high": {"low"}, "low": {"high"}})


def test_checker_finds_a_declared_edge_nothing_uses(tmp_path):
    src = _write(tmp_path, {"low/a.py": "x = 1\n", "high/b.py": "import edgesplit.low.a\n",
                            "top.py": "x = 2\n"})
    tree = scan(src)
    assert unused(tree, {"high": {"low", "top"}, "low": set()}) == [
        "high -> top is declared but nothing in high imports top"]
    assert not unused(tree, {"high": {"low"}})


def test_checker_counts_typing_and_deferred_imports_as_package_edges(tmp_path):
    src = _write(tmp_path, {
        "low/a.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from edgesplit.high import B\n"),
        "high/__init__.py": "class B: ...\n"})
    assert len(undeclared(scan(src), {"low": set(), "high": set()})) == 1


def test_checker_finds_a_top_level_module_cycle_but_not_a_deferred_one(tmp_path):
    cyclic = {"p/a.py": "from edgesplit.p import b\n", "p/b.py": "from edgesplit.p.a import x\n"}
    src = _write(tmp_path / "top", cyclic)
    assert cycles(module_graph(scan(src).imports, {"top"})) == [
        ["edgesplit.p.a", "edgesplit.p.b"]]
    deferred = {**cyclic, "p/b.py": "def f():\n    from edgesplit.p.a import x\n"}
    tree = scan(_write(tmp_path / "deferred", deferred))
    assert not cycles(module_graph(tree.imports, {"top"}))
    assert cycles(module_graph(tree.imports, {"top", "deferred"}))
    typing = {**cyclic, "p/b.py": "if TYPE_CHECKING:\n    from edgesplit.p.a import x\n"}
    assert not cycles(module_graph(scan(_write(tmp_path / "typing", typing)).imports,
                                   {"top", "deferred"}))


def test_checker_finds_a_cycle_through_a_package_init(tmp_path):
    # the package runs a.py, which needs a name the package defines only after that import
    src = _write(tmp_path, {"p/__init__.py": "from edgesplit.p.a import f\nX = 1\n",
                            "p/a.py": "from edgesplit.p import X\n"})
    assert cycles(module_graph(scan(src).imports, {"top"})) == [["edgesplit.p", "edgesplit.p.a"]]


def test_checker_finds_class_body_imports_run_at_import_time(tmp_path):
    src = _write(tmp_path, {"p/a.py": "class A:\n    from edgesplit.p import b\n",
                            "p/b.py": "import edgesplit.p.a\n"})
    assert cycles(module_graph(scan(src).imports, {"top"}))


def test_checker_finds_private_and_relative_imports(tmp_path):
    src = _write(tmp_path, {"p/_impl.py": "_X = 1\nY = 2\n",
                            "p/a.py": "from edgesplit.p._impl import _X\nfrom . import b\n",
                            "p/b.py": "Z = 3\n",
                            "q/c.py": ("from edgesplit.p._impl import Y\n"
                                       "from edgesplit.p.b import Z as _Z\n"
                                       "def f():\n    from edgesplit.p.a import _hidden\n")})
    tree = scan(src)
    assert private_reaches(tree) == [
        "q/c.py:1: edgesplit.p._impl.Y reaches into p's private _impl; export what is needed "
        "from a public module",
        "q/c.py:4: edgesplit.p.a._hidden reaches into p's private _hidden; export what is "
        "needed from a public module"]
    assert tree.relative == [("edgesplit.p.a", 2)]


def test_checker_finds_a_cycle_in_a_declared_graph():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert not cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}})


README = """\
intro
```
src/edgesplit/
  errors.py        the exceptions
  low/             low things: a.py, plots/ (figures)
  gone/            a package that was removed
tests/             tests
```
"""


def test_checker_compares_the_readme_tree_with_the_packages(tmp_path):
    src = _write(tmp_path, {"errors.py": "", "units.py": "", "low/a.py": "",
                            "low/plots/p.py": "", "high/proto/x.py": ""})
    entries = readme_tree(README)
    assert entries["low/"] == "low things: a.py, plots/ (figures)"
    assert readme_problems(entries, scan(src).modules) == [
        "high/ is in src/edgesplit but not in the README's tree",
        "units.py is in src/edgesplit but not in the README's tree",
        "high/proto/ is in src/edgesplit but neither an entry of the README's tree nor named as "
        "proto/ in its parent's entry",
        "the README's tree lists gone/, which src/edgesplit does not have"]
    assert readme_files({"low/": "a.py and b.py"}, src) == [
        "the README's low/ entry names b.py, which is not in src/edgesplit/low/"]


def test_checker_compares_the_docs_with_the_declared_graph():
    allowed = {"errors": set(), "data": {"errors"}, "cli": {"data", "errors"}}
    docs = (f"text\n{GRAPH_BEGIN}\n```text\n{render(allowed)}\n```\n{GRAPH_END}\n"
            "| 0 | `errors` | x | y |\n| 1 | `data` | x | y |\n| 2 | `cli` | x | y |\n")
    assert docs_graph(docs) == "errors -> (nothing)\ndata   -> errors\ncli    -> data, errors"
    assert not layer_disagreements(allowed, docs_layers(docs))
    assert layer_disagreements({**allowed, "data": {"errors", "cli"}}, docs_layers(docs)) == [
        "data (layer 1) may import cli (layer 2), a higher layer"]
    assert layer_disagreements({**allowed, "nas": set()}, {"errors": 0, "data": 1}) == [
        "cli is in the declared graph but not in the layer table",
        "nas is in the declared graph but not in the layer table"]
