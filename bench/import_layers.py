"""The project's import graph, layer by layer: upward edges, cycles, imports inside functions.

    .venv/bin/python bench/import_layers.py [--json] [--edges]

The layers, lowest first: the library ``cast_rl`` (everything but ``cast_rl.cli``) < ``actors``
(Ray actor shells and groups) < ``launchers`` (drivers) < ``cast_rl.cli``.  A module may import
its own layer or a lower one; the library imports no ``ray`` either.  grimp builds the graph
(every import, at any level); an import counts as *module-level* unless its statement sits in
a function body (``if TYPE_CHECKING:`` and ``try:`` blocks at module level count as
module-level).  Cycles are strongly connected components of the module graph, and of the graph
with every module squashed into its ``cast_rl`` subpackage (``cast_rl.rollout``, ...).

Prints the module-level edges between layers, the upward imports, the cycles and the count of
imports inside functions; the last stdout line is one JSON object of these figures.  The same
figures are asserted in ``tests/test_layers.py``; ``make lint`` checks the contracts with
import-linter (``[tool.importlinter]`` in pyproject.toml).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grimp
import networkx as nx

PACKAGES = ("cast_rl", "actors", "launchers")
LAYERS = ("library", "actors", "launchers", "cli")
RANK = {name: i for i, name in enumerate(LAYERS)}


def layer_of(module: str) -> str | None:
    """The layer a first-party module belongs to; None for a third-party one."""
    top = module.split(".")[0]
    if module == "cast_rl.cli" or module.startswith("cast_rl.cli."):
        return "cli"
    if top == "cast_rl":
        return "library"
    if top in ("actors", "launchers"):
        return top
    return None


def function_import_lines(path: Path) -> set[int]:
    """Line numbers of the import statements that sit inside a function body."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    lines.add(inner.lineno)
    return lines


def _node(module: str, squash: bool) -> str:
    return ".".join(module.split(".")[:2]) if squash else module


@dataclass
class Edge:
    importer: str
    imported: str
    module_level: bool


@dataclass
class Report:
    edges: list[Edge]
    function_imports: int
    function_imports_by_package: dict[str, int] = field(default_factory=dict)

    def upward(self, module_level_only: bool = False) -> list[Edge]:
        """Edges from a lower layer to a higher one, and the library's imports of ray."""
        out = []
        for e in self.edges:
            if module_level_only and not e.module_level:
                continue
            src, dst = layer_of(e.importer), layer_of(e.imported)
            to_ray = src == "library" and e.imported.split(".")[0] == "ray"
            if to_ray or (src is not None and dst is not None and RANK[dst] > RANK[src]):
                out.append(e)
        return out

    def cycles(self, module_level_only: bool = False, squash: bool = False) -> list[list[str]]:
        """Strongly connected components (more than one node) among first-party modules.

        With ``squash`` every module counts as its subpackage (``cast_rl.rollout.group`` as
        ``cast_rl.rollout``, ``actors.learner`` as itself); a package's own ``__init__``
        importing its children is not a cycle.
        """
        g = self._graph(module_level_only, squash)
        return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)

    def cycle_edges(self, cycle: list[str], squash: bool = False) -> list[Edge]:
        """The module edges that make up one (squashed) cycle."""
        members = set(cycle)
        return [
            e
            for e in self.edges
            if _node(e.importer, squash) in members
            and _node(e.imported, squash) in members
            and _node(e.importer, squash) != _node(e.imported, squash)
        ]

    def _graph(self, module_level_only: bool, squash: bool) -> nx.DiGraph:
        g = nx.DiGraph()
        for e in self.edges:
            if module_level_only and not e.module_level:
                continue
            if layer_of(e.importer) is None or layer_of(e.imported) is None:
                continue
            a, b = _node(e.importer, squash), _node(e.imported, squash)
            if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
                g.add_edge(a, b)
        return g

    def layer_matrix(self) -> Counter[tuple[str, str]]:
        """Module-level import counts from layer to layer (and to ray)."""
        counts: Counter[tuple[str, str]] = Counter()
        for e in self.edges:
            src = layer_of(e.importer)
            if src is None or not e.module_level:
                continue
            dst = layer_of(e.imported) or ("ray" if e.imported.split(".")[0] == "ray" else None)
            if dst is not None:
                counts[(src, dst)] += 1
        return counts

    def figures(self) -> dict:
        return {
            "upward_any_level": len(self.upward()),
            "upward_module_level": len(self.upward(module_level_only=True)),
            "module_cycles_any_level": self.cycles(),
            "module_cycles_module_level": self.cycles(module_level_only=True),
            "subpackage_cycles_any_level": self.cycles(squash=True),
            "imports_inside_functions": self.function_imports,
            "imports_inside_functions_by_package": self.function_imports_by_package,
        }


def build(root: Path) -> Report:
    """The import graph of the first-party packages under ``root``."""
    sys.path.insert(0, str(root))
    try:
        graph = grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)
    finally:
        sys.path.remove(str(root))
    fn_lines: dict[str, set[int]] = {}
    by_package: Counter[str] = Counter()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            fn_lines[".".join(parts)] = lines = function_import_lines(path)
            by_package[package] += len(lines)
    edges = []
    for importer in sorted(m for m in graph.modules if layer_of(m) is not None):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            details = graph.get_import_details(importer=importer, imported=imported)
            inside = fn_lines.get(importer, set())
            module_level = any(d["line_number"] not in inside for d in details)
            edges.append(Edge(importer, imported, module_level))
    return Report(edges, sum(by_package.values()), dict(by_package))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--edges", action="store_true", help="list every module-level edge")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    report = build(args.root)
    figures = report.figures()
    if not args.json:
        print("module-level imports, layer -> layer (count):")
        for (src, dst), n in sorted(report.layer_matrix().items()):
            mark = ""
            if (dst == "ray" and src == "library") or (dst in RANK and RANK[dst] > RANK[src]):
                mark = "   <-- UPWARD"
            print(f"  {src:>9} -> {dst:<9} {n:4d}{mark}")
        if args.edges:
            for e in report.edges:
                if e.module_level:
                    print(f"  {e.importer} -> {e.imported}")
        print(f"upward imports (any level): {figures['upward_any_level']}")
        for e in report.upward():
            level = "module" if e.module_level else "function"
            print(f"  {e.importer} -> {e.imported} ({level}-level)")
        for key in ("module_cycles_module_level", "module_cycles_any_level"):
            print(f"{key.replace('_', ' ')}: {len(figures[key])}")
            for cycle in figures[key]:
                print("  " + " <-> ".join(cycle))
        print(f"subpackage cycles (any level): {len(figures['subpackage_cycles_any_level'])}")
        for cycle in figures["subpackage_cycles_any_level"]:
            print("  " + " <-> ".join(cycle))
            for e in report.cycle_edges(cycle, squash=True):
                level = "module" if e.module_level else "function"
                print(f"    {e.importer} -> {e.imported} ({level}-level)")
        print(f"imports inside functions: {figures['imports_inside_functions']}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
