"""The import graph of the installed package has no cycle (issue 30).

The graph is built from the SOURCE of the package Python imports, found through
``privguard.__path__`` and ``privguard.integrations.__path__``, so the test reads the same
files whether ``privguard.integrations`` lives under ``privguard/`` or in a top-level folder
mapped onto it, and whether the package is an editable install or a wheel.

Every import counts (module level, function level, ``importlib.import_module("…")`` with a
literal name); only imports under ``if TYPE_CHECKING:`` are exempt. ``from a import b`` is
an edge to ``a.b`` when ``a.b`` is a module, otherwise to ``a``. A submodule's implicit
import of its parent package is not an edge (every submodule has one; a cycle through a
package shows up as that package's ``__init__`` importing the module that imports it).
"""
from __future__ import annotations

import ast
import itertools
import os
from pathlib import Path

import privguard
import privguard.integrations


def _module_files() -> dict[str, Path]:
    """Map every module name of the installed privguard to its source file."""
    roots = [("privguard", Path(p)) for p in privguard.__path__]
    roots += [("privguard.integrations", Path(p)) for p in privguard.integrations.__path__]
    integrations_dirs = {r.resolve() for name, r in roots if name == "privguard.integrations"}
    found: dict[str, Path] = {}
    for prefix, root in roots:
        for directory, subdirs, files in os.walk(root):
            here = Path(directory)
            # The integrations folder is walked under its own name (it may sit elsewhere).
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__"
                                and (here / d).resolve() not in integrations_dirs)
            parts = here.relative_to(root).parts
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                name = ".".join((prefix, *parts) + (() if f == "__init__.py" else (f[:-3],)))
                found[name] = here / f
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(imported name, line) for every import in ``tree`` outside ``if TYPE_CHECKING:``."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            # "a:b": the module a.b when it is one, else the module a (resolved by the caller).
            out.extend((f"{base}:{a.name}", node.lineno) for a in node.names)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("import_module", "__import__")))):
            out.append((node.args[0].value, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """module → {imported privguard module: first line of that import}."""
    files = _module_files()
    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, line in _imports(tree, module, path.name == "__init__.py"):
            base, _, member = name.partition(":")
            target = f"{base}.{member}" if f"{base}.{member}" in files else base
            while target and target not in files:  # ``import privguard.x.y``: its modules
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One concrete cycle (a list of modules, first repeated last) per strongly connected
    component with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    cycles = []
    for component in components:
        members = set(component)
        # Shortest path back to the first module, inside the component (breadth first).
        first = component[0]
        previous: dict[str, str] = {}
        frontier = [first]
        while frontier and first not in previous:
            following = []
            for node in frontier:
                for child in sorted(graph[node]):
                    if child in members and child not in previous:
                        previous[child] = node
                        following.append(child)
            frontier = following
        path = [first]
        node = previous[first]
        while node != first:
            path.append(node)
            node = previous[node]
        path.append(first)
        cycles.append(path[::-1])
    return cycles


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " → ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)) + (
        f" → {cycle[-1]}")


def test_the_graph_reads_the_installed_package():
    graph = import_graph()
    # Both roots were read, and the edges are real: the façade imports the ledger, the Ray
    # executor imports the tuners' executor protocol.
    assert "privguard._ledger._ledger" in graph["privguard"]
    assert "privguard.tuning._executors" in graph["privguard.integrations.ray"]
    assert "privguard.integrations.opacus" in graph


def test_find_cycles_finds_a_cycle():
    # The detector itself can fail: a three-module loop and a two-module loop are found.
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"e": 1}, "e": {"d": 1},
             "f": {"a": 1}}
    assert sorted(map(tuple, find_cycles(graph))) == [("a", "b", "c", "a"), ("d", "e", "d")]


def test_type_checking_imports_are_exempt_and_function_level_ones_count():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from privguard._ledger._ledger import Ledger\n"
        "def f():\n    from privguard.integrations import ray\n"
        "    import importlib; importlib.import_module('privguard._cli._cli')\n")
    names = [n for n, _ in _imports(tree, "privguard._accounting._results", False)]
    assert not [n for n in names if n.startswith("privguard._ledger._ledger")]
    assert "privguard.integrations:ray" in names and "privguard._cli._cli" in names


def test_no_import_cycle():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(c, graph) for c in cycles)


def test_backend_ray_finds_the_integration_tuning_does_not_import():
    # The cycle tuning/_executors.py ↔ integrations/ray.py is broken by the entry point
    # "privguard.executors": backend="ray" still works in a process that never imported the
    # Ray integration, and tuning/_executors.py names it nowhere.
    import subprocess
    import sys

    import pytest

    pytest.importorskip("ray")
    code = ("import sys\nfrom privguard.tuning._executors import resolve\n"
            "assert 'privguard.integrations.ray' not in sys.modules\n"
            "print(type(resolve('ray')).__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "privguard.integrations.ray"
    assert "privguard.integrations" not in import_graph()["privguard.tuning._executors"]
