"""The code's shape matches docs/ARCHITECTURE.md: the package map, imports pointing down, no cycles.

The package map table in docs/ARCHITECTURE.md is the source of truth: it has
one row per package (``broker/jobs/``) and per top-level module
(``broker/market.py``), and its layer column gives each a number. A module
belongs to the row of its nearest package (a subpackage has its own row).

Imports are read with ``ast``, never by importing the code: every
``import broker...`` / ``from broker... import`` / ``import policies...`` in
every module, at module level, inside functions (lazy) and under
``TYPE_CHECKING`` alike. ``from pkg import name`` counts as an import of
``pkg.name`` when that is a module, else of ``pkg``. Importing ``a.b.c`` also
runs ``a/__init__`` and ``a/b/__init__``; those implicit edges are not
counted (every submodule would otherwise form a cycle with its package).

Known exceptions are listed below, each with why it is there and how to
drop it; an entry that no longer matches the code fails too, so the lists
only shrink.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SOURCE_DIRS = ("broker", "policies")

KNOWN_UPWARD: dict[tuple[str, str], str] = {
    # (importing module, imported module): why, and how to remove the entry.
}
"""Imports of a higher layer that the code has today."""

KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {
    ("broker.cli.main", "broker.cli.jobs"): (
        "main() imports the job commands (lazily) to register them on the `cli` group they import"
    ),
}
"""Import edges left out of the cycle check, each closing a cycle the code has today."""

DOMAINS = ("broker.jobs", "broker.money", "broker.nodes")
ABOVE_DOMAINS = ("broker.api", "broker.client", "broker.cli", "broker.daemon", "broker.wiring")

PRINCIPLE_CITE = re.compile(r"\bprinciples?\s+(\d+(?:(?:\s*,\s*|\s+and\s+|\s*-\s*)\d+)*)", re.IGNORECASE)
PRINCIPLE_ITEM = re.compile(r"^(\d+)\.\s+\*\*(.+?)\*\*")


# -- the tree ---------------------------------------------------------------------------
def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def python_files() -> tuple[Path, ...]:
    files: list[Path] = []
    for top in SOURCE_DIRS:
        files += [p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]
    return tuple(sorted(files))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in python_files()}


def packages() -> list[Path]:
    """Every package directory (one with ``__init__.py``) under the source directories."""
    return sorted(p.parent for p in python_files() if p.name == "__init__.py")


def expected_entries() -> set[str]:
    """What the map must list: each package but ``broker`` itself, and each module directly in ``broker/``."""
    out = {_rel(d) + "/" for d in packages() if d != ROOT / "broker"}
    out |= {_rel(p) for p in python_files() if p.parent == ROOT / "broker"}
    return out


# -- the document -----------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    path: str
    layer: int
    line: int


@cache
def map_rows() -> dict[str, Row]:
    """The package map: the table whose header starts with ``| Path |``."""
    rows: dict[str, Row] = {}
    header: list[str] | None = None
    for number, line in enumerate(DOC.read_text().splitlines(), 1):
        if not line.startswith("|"):
            if header is not None and rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            if cells and cells[0].lower() == "path":
                header = [c.lower() for c in cells]
            continue
        if set("".join(cells)) <= set("-: "):
            continue  # the separator row
        path = cells[0].strip("`")
        found = re.match(r"\s*(\d+)", cells[header.index("layer")])
        assert found, f"docs/ARCHITECTURE.md:{number}: the row of {path} has no layer number"
        assert path not in rows, f"docs/ARCHITECTURE.md:{number}: {path} is listed twice"
        rows[path] = Row(path, int(found.group(1)), number)
    assert rows, "docs/ARCHITECTURE.md has no package map (a table whose header starts with '| Path |')"
    return rows


def row_of(path: Path) -> Row | None:
    """The row a source file belongs to: its own, else its nearest listed package's."""
    rel = _rel(path)
    best: Row | None = None
    for row in map_rows().values():
        if rel == row.path or (row.path.endswith("/") and rel.startswith(row.path)):
            if best is None or len(row.path) > len(best.path):
                best = row
    return best


def layer_of(module: str) -> int:
    row = row_of(modules()[module])
    assert row is not None, f"{module} is in no row of the package map"
    return row.layer


@cache
def principles() -> dict[int, str]:
    """Number -> title of the numbered list under '## Principles'."""
    out: dict[int, str] = {}
    inside = False
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            inside = line.strip().lower() == "## principles"
            continue
        found = PRINCIPLE_ITEM.match(line) if inside else None
        if found:
            out[int(found.group(1))] = found.group(2)
    return out


# -- imports ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    lazy: bool

    def where(self) -> str:
        return f"{_rel(modules()[self.source])}:{self.line}"


def _ours(name: str) -> bool:
    return name.split(".")[0] in SOURCE_DIRS


def _resolve(name: str) -> str | None:
    """The module `name` names, or its nearest enclosing module in the tree."""
    while name:
        if name in modules():
            return name
        name = name.rpartition(".")[0]
    return None


def _walk(node: ast.AST, lazy: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield child, inner
        yield from _walk(child, inner)


COMPILED = {"broker.slurm._slurm_native"}
"""Modules compiled on the machine (broker/slurm/native_build.py): leaves that import nothing of ours."""


@cache
def imports_of(module: str) -> tuple[Import, ...]:
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []
    for node, lazy in _walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules() else origin for a in node.names]
        for name in names:
            if not _ours(name) or name in COMPILED:
                continue
            target = _resolve(name)
            assert target is not None, f"{_rel(path)}:{node.lineno} imports {name}, which is not in the tree"
            out.append(Import(module, target, node.lineno, lazy))
    return tuple(out)


def all_imports() -> Iterator[Import]:
    for module in modules():
        yield from imports_of(module)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# -- (a) the map is the tree ------------------------------------------------------------
def test_package_map_lists_exactly_the_packages_and_top_level_modules() -> None:
    listed = set(map_rows())
    expected = expected_entries()
    missing = sorted(expected - listed)
    absent = sorted(listed - expected)
    uncovered = sorted(_rel(p) for p in python_files() if row_of(p) is None and _rel(p) not in missing)
    problems = [f"{m} is in the tree but not in the package map of docs/ARCHITECTURE.md" for m in missing]
    problems += [f"{a} is in the package map of docs/ARCHITECTURE.md but not in the tree" for a in absent]
    problems += [f"{u} belongs to no row of the package map" for u in uncovered]
    assert not problems, "\n".join(problems)


# -- (b) imports point down -------------------------------------------------------------
def test_imports_point_down() -> None:
    upward: dict[tuple[str, str], list[Import]] = {}
    for imp in all_imports():
        if layer_of(imp.target) > layer_of(imp.source):
            upward.setdefault((imp.source, imp.target), []).append(imp)
    problems = [
        f"{imp.where()}: {imp.source} (layer {layer_of(imp.source)}) imports {imp.target} "
        f"(layer {layer_of(imp.target)}){' lazily' if imp.lazy else ''}; imports must point down "
        "(docs/ARCHITECTURE.md, principle 14)"
        for pair, found in sorted(upward.items())
        if pair not in KNOWN_UPWARD
        for imp in found
    ]
    problems += [
        f"{source} no longer imports {target} upwards: remove it from KNOWN_UPWARD"
        for source, target in sorted(KNOWN_UPWARD)
        if (source, target) not in upward
    ]
    assert not problems, "\n".join(problems)


# -- (c) the domains never import what sits on top of them -------------------------------
def test_domains_do_not_import_transport_cli_daemon_or_wiring() -> None:
    problems = [
        f"{imp.where()}: {imp.source} imports {imp.target}; the domains ({', '.join(DOMAINS)}) never "
        f"import {', '.join(ABOVE_DOMAINS)}"
        for imp in all_imports()
        if _under(imp.source, DOMAINS) and _under(imp.target, ABOVE_DOMAINS)
    ]
    assert not problems, "\n".join(problems)


# -- (d) no import cycles ---------------------------------------------------------------
def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    """Lazy (function-level) imports count too: a cycle closed lazily is still a cycle in the design."""
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    where: dict[tuple[str, str], list[Import]] = {}
    for imp in all_imports():
        if imp.source == imp.target or (imp.source, imp.target) in KNOWN_CYCLE_EDGES:
            continue
        graph[imp.source].add(imp.target)
        where.setdefault((imp.source, imp.target), []).append(imp)
    problems = []
    for component in _cycles(graph):
        members = set(component)
        edges = [
            f"{i.where()} {i.source} -> {i.target}{' (lazy)' if i.lazy else ''}"
            for (s, t), found in sorted(where.items())
            if s in members and t in members
            for i in found[:1]
        ]
        problems.append(f"import cycle between {', '.join(component)}:\n    " + "\n    ".join(edges))
    all_edges = {(i.source, i.target) for i in all_imports()}
    problems += [
        f"{s} no longer imports {t}: remove it from KNOWN_CYCLE_EDGES"
        for s, t in sorted(KNOWN_CYCLE_EDGES)
        if (s, t) not in all_edges
    ]
    assert not problems, "\n".join(problems)


# -- (e) every package says what it owns and may import ---------------------------------
def test_every_package_has_a_docstring_saying_what_it_may_import() -> None:
    problems = []
    for package in packages():
        init = package / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(), filename=str(init)))
        if not doc:
            problems.append(f"{_rel(init)} has no docstring (say what the package owns and what it may import)")
        elif "may import" not in doc.lower():
            problems.append(f"{_rel(init)}: its docstring does not say what the package may import ('May import: ...')")
    assert not problems, "\n".join(problems)


# -- (f) cited principles exist ---------------------------------------------------------
def _cited_files() -> list[Path]:
    files = list(python_files())
    files += [p for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts]
    files += [p for p in (ROOT / "contrib").rglob("*.py") if "__pycache__" not in p.parts]
    files += sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    return files


def test_principles_are_numbered_from_one() -> None:
    numbers = sorted(principles())
    assert numbers, "docs/ARCHITECTURE.md has no numbered '## Principles' list ('1. **Title.** ...')"
    assert numbers == list(range(1, len(numbers) + 1)), f"principles are numbered {numbers}, not 1..{len(numbers)}"


def test_every_cited_principle_exists() -> None:
    known = principles()
    problems = []
    for path in _cited_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for cite in PRINCIPLE_CITE.finditer(line):
                for n in map(int, re.findall(r"\d+", cite.group(1))):
                    if n not in known:
                        problems.append(
                            f"{_rel(path)}:{number} cites principle {n}; docs/ARCHITECTURE.md has no principle {n}"
                        )
    assert not problems, "\n".join(problems)


def test_test_modules_outside_packages_have_names_of_their_own() -> None:
    """pytest imports a test folder without __init__.py by file name: two test_x.py in two
    such folders stop the whole suite's collection ("import file mismatch")."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, Path] = {}
    for path in sorted(tests.rglob("test_*.py")):
        if (path.parent / "__init__.py").exists():
            continue
        assert path.name not in seen, f"{path} and {seen[path.name]} share a name; rename one"
        seen[path.name] = path
