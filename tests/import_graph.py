"""edgesplit's import graph read from the source (parsed, never imported), and the checks
``test_architecture.py`` runs on it, written against any tree so they can be tested on small
synthetic ones.

Two graphs come out of one scan:

- the *package graph*: a node per top-level package or module of ``edgesplit`` (``graph``,
  ``errors``; ``edgesplit`` itself for the facade ``edgesplit/__init__.py``), an edge when any
  module of one imports anything of the other, at any depth: an import inside a function or
  under ``TYPE_CHECKING`` is a dependency all the same;
- the *module graph*: a node per module, an edge to the module an import loads (``from
  edgesplit.graph import ir`` loads ``edgesplit.graph.ir``; ``from edgesplit.graph import
  LayerGraph`` loads the package's ``__init__``; a name that is both is read as the submodule),
  each edge marked by when it runs: ``top`` (while the importing module is itself imported:
  module and class bodies, ``try``/``if`` included), ``deferred`` (inside a function: runs
  when called) or ``typing`` (under ``if TYPE_CHECKING:``: never runs). The parent packages
  Python imports first are not edges: a package importing its own submodules, which import
  their siblings, is the normal shape and no cycle at run time.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = "edgesplit"


@dataclass(frozen=True)
class Import:
    """One name an ``edgesplit`` module imports from ``edgesplit``."""

    source: str  # the importing module, dotted
    target: str  # the module this loads (a package: its __init__), dotted
    name: str  # what was written, dotted (module + imported name): the private check reads it
    line: int
    when: str  # "top", "deferred" or "typing" (see the module docstring)


def modules(src: Path) -> dict[str, Path]:
    """Every module under ``src`` (the ``edgesplit`` folder) by dotted name, a package by its
    own name (its ``__init__.py``); generated ``_pb2`` modules left out."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        parts = (ROOT, *path.relative_to(src).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def node_of(module: str) -> str:
    """The package-graph node of a dotted module: its top-level package or module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def resolve(name: str, known: Container[str]) -> str:
    """The module that importing the dotted ``name`` loads: its longest known prefix."""
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Scanner(ast.NodeVisitor):
    """Collects the imports of one module with when each runs; relative ones apart."""

    def __init__(self, module: str, known: Container[str]):
        self.module, self.known, self.when = module, known, "top"
        self.found: list[Import] = []
        self.relative: list[int] = []

    def _under(self, when: str, nodes: Iterable[ast.AST]) -> None:
        outer, self.when = self.when, when if self.when != "typing" else "typing"
        for node in nodes:
            self.visit(node)
        self.when = outer

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        self._under("deferred", ast.iter_child_nodes(node))

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._under("typing", node.body)
        self._under(self.when, node.orelse)

    def _add(self, name: str, line: int) -> None:
        if name == ROOT or name.startswith(ROOT + "."):
            self.found.append(Import(self.module, resolve(name, self.known), name, line,
                                     self.when))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.relative.append(node.lineno)
            return
        for alias in node.names:
            self._add(f"{node.module}.{alias.name}", node.lineno)


@dataclass(frozen=True)
class Scan:
    """Every module of a tree and every ``edgesplit`` import in it."""

    src: Path
    modules: dict[str, Path]
    imports: list[Import]
    relative: list[tuple[str, int]]  # (module, line) of each relative import


def scan(src: Path) -> Scan:
    found = modules(src)
    imports, relative = [], []
    for module, path in found.items():
        scanner = _Scanner(module, found.keys())
        scanner.visit(ast.parse(path.read_text(), str(path)))
        imports += scanner.found
        relative += [(module, line) for line in scanner.relative]
    return Scan(src, found, imports, relative)


def package_edges(imports: Iterable[Import]) -> dict[tuple[str, str], Import]:
    """Each package-graph edge used, with the first import that uses it."""
    edges: dict[tuple[str, str], Import] = {}
    for imp in imports:
        pair = (node_of(imp.source), node_of(imp.target))
        if pair[0] != pair[1]:
            edges.setdefault(pair, imp)
    return edges


def where(scan: Scan, module: str, line: int) -> str:
    """``graph/ir.py:12``: a place in the tree, for messages."""
    return f"{scan.modules[module].relative_to(scan.src)}:{line}"


def undeclared(scan: Scan, allowed: Mapping[str, Iterable[str]]) -> list[str]:
    """One line per import along an edge ``allowed`` does not declare."""
    return [f"{where(scan, imp.source, imp.line)}: {node_of(imp.source)} imports {imp.name}, "
            f"but {node_of(imp.source)} -> {node_of(imp.target)} is not a declared edge"
            for imp in scan.imports
            if node_of(imp.target) != node_of(imp.source)
            and node_of(imp.target) not in allowed.get(node_of(imp.source), ())]


def unused(scan: Scan, allowed: Mapping[str, Iterable[str]]) -> list[str]:
    """One line per declared edge no import uses (the declaration must say what is true)."""
    used = package_edges(scan.imports)
    return [f"{pkg} -> {dep} is declared but nothing in {pkg} imports {dep}"
            for pkg, deps in allowed.items() for dep in sorted(deps) if (pkg, dep) not in used]


def private_reaches(scan: Scan) -> list[str]:
    """One line per import of another package's private (``_``) module or name."""
    problems = []
    for imp in scan.imports:
        parts = imp.name.split(".")[2:]  # below the target package
        private = [p for p in parts if p.startswith("_") and not p.startswith("__")]
        if private and node_of(imp.target) != node_of(imp.source):
            problems.append(f"{where(scan, imp.source, imp.line)}: {imp.name} reaches into "
                            f"{node_of(imp.target)}'s private {private[0]}; export what is "
                            "needed from a public module")
    return problems


def module_graph(imports: Iterable[Import], when: Iterable[str]) -> dict[str, set[str]]:
    """The module graph of the imports that run ``when`` (a set of "top", "deferred",
    "typing")."""
    when = set(when)
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.when in when and imp.target != imp.source:
            graph.setdefault(imp.source, set()).add(imp.target)
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (or a node with an edge to
    itself), each sorted: every cycle lies inside one (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


# --- the layout the README and docs/architecture.md state -------------------------------------

def layout_names(found: Mapping[str, Path]) -> tuple[set[str], set[str]]:
    """(top-level names as the README's tree writes them: ``errors.py``, ``graph/``; nested
    packages: ``nas/adaptivenet/``)."""
    top, nested = set(), set()
    for module, path in found.items():
        parts = module.split(".")[1:]
        if not parts:
            continue
        name = "/".join(parts) + ("/" if path.name == "__init__.py" else ".py")
        if len(parts) == 1:
            top.add(name)
        elif name.endswith("/"):
            nested.add(name)
    return top, nested


def readme_tree(text: str) -> dict[str, str]:
    """The entries of the README's ``src/edgesplit/`` tree: name -> its description (lines
    indented deeper continue the entry above)."""
    lines = text.splitlines()
    start = lines.index("src/edgesplit/") + 1
    entries: dict[str, str] = {}
    name = ""
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        match = re.match(r"  (\S+)\s*(.*)", line)
        if match:
            name = match[1]
            entries[name] = match[2]
        else:
            entries[name] += " " + line.strip()
    return entries


def readme_problems(entries: Mapping[str, str], found: Mapping[str, Path]) -> list[str]:
    """What the tree leaves out or names that is not there. A nested package may instead be
    named as ``sub/`` in its parent's entry (``plots/`` under ``report/``)."""
    top, nested = layout_names(found)
    problems = [f"{n} is in src/edgesplit but not in the README's tree" for n in sorted(top)
                if n not in entries]
    for name in sorted(nested - entries.keys()):
        parent, sub = name[:-1].rsplit("/", 1)
        if not re.search(rf"(?<![\w/]){sub}/", entries.get(parent + "/", "")):
            problems.append(f"{name} is in src/edgesplit but neither an entry of the README's "
                            f"tree nor named as {sub}/ in its parent's entry")
    problems += [f"the README's tree lists {n}, which src/edgesplit does not have"
                 for n in entries if n not in top | nested]
    return problems


def readme_files(entries: Mapping[str, str], src: Path) -> list[str]:
    """Each ``name.py`` an entry of a package names must exist in that package (below it)."""
    return [f"the README's {name} entry names {file}, which is not in src/edgesplit/{name}"
            for name, text in entries.items() if name.endswith("/")
            for file in sorted(set(re.findall(r"\b\w+\.py\b", text)))
            if not any((src / name).rglob(file))]


def docs_layers(text: str) -> dict[str, int]:
    """docs/architecture.md's layer table: package -> its layer."""
    layers = {}
    for match in re.finditer(r"^\| (\d+) \| ([^|]*) \|", text, re.MULTILINE):
        for name in re.findall(r"`(\w+)`", match[2]):
            layers[name] = int(match[1])
    return layers


GRAPH_BEGIN = "<!-- import graph: begin (tests/docs/test_architecture.py checks it) -->"
GRAPH_END = "<!-- import graph: end -->"


def render(allowed: Mapping[str, Iterable[str]]) -> str:
    """The declared graph as docs/architecture.md shows it, one node a line, in order."""
    width = max(map(len, allowed)) + 1
    return "\n".join(f"{pkg:<{width}}-> {', '.join(sorted(deps)) or '(nothing)'}"
                     for pkg, deps in allowed.items())


def docs_graph(text: str) -> str:
    """The fenced block between the import graph markers of docs/architecture.md ("" when
    they are missing)."""
    if GRAPH_BEGIN not in text:
        return ""
    block = text.split(GRAPH_BEGIN, 1)[1].split(GRAPH_END, 1)[0]
    return "\n".join(line for line in block.strip().splitlines()[1:-1])  # inside the fence


def layer_disagreements(allowed: Mapping[str, Iterable[str]],
                        layers: Mapping[str, int]) -> list[str]:
    """Declared edges that climb the layer table (a package imports only its own layer or
    lower ones), and nodes on one side only (the facade ``edgesplit`` has no layer)."""
    nodes = set(allowed) - {ROOT}
    problems = [f"{n} is in the declared graph but not in the layer table"
                for n in sorted(nodes - layers.keys())]
    problems += [f"the layer table lists {n}, which the declared graph does not have"
                 for n in sorted(layers.keys() - nodes)]
    problems += [f"{pkg} (layer {layers[pkg]}) may import {dep} (layer {layers[dep]}), "
                 "a higher layer" for pkg, deps in allowed.items() for dep in sorted(deps)
                 if pkg in layers and dep in layers and layers[dep] > layers[pkg]]
    return problems


