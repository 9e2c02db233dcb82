"""The package's structure, as ``ARCHITECTURE.md`` draws it: no import cycles, imports point down.

Every import is counted, function-local ones included (a lazy import hides a cycle
from Python, not from a reader), by reading the source with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from recovery.config import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "recovery"
LAYERS = [
    "recovery.cli",
    "recovery.commands",
    "recovery.launch",
    "recovery.definitions",
    "recovery.example",
    "recovery.io",
    "recovery.defs",
    "recovery.orchestration",
    "recovery.dagster_history",
    "recovery.dagster_sqlite",
    "recovery.lib",
    "recovery.config",
]
"""From the top down: a module may import its own layer's modules or any layer below, never one above."""


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, known: set[str], root: Path = PACKAGE) -> set[str]:
    """The package modules a file imports (anywhere in it), resolved to known module names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            subs = [f"{base}.{a.name}" for a in node.names]
            # ``from pkg import mod`` depends on pkg.mod; ``from pkg import name`` on pkg itself
            names = [n if n in known else base for n in subs]
        for name in names:
            while name and name not in known:
                name = name.rsplit(".", 1)[0] if "." in name else ""
            if name and name != me:
                out.add(name)
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    known = set(files)
    return {m: imports_of(p, known, root) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer_of(module: str) -> int:
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    return len(LAYERS)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} -> {d}" for m, deps in graph.items() for d in deps if layer_of(d) < layer_of(m) and d != "recovery"
    )


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between the units under recovery/: ``recovery.lib.<x>`` and ``recovery.defs.<x>`` (a
    subpackage, or a module of its own), ``recovery.launch``, ``recovery.commands``, and so on."""

    def pkg(m: str) -> str:
        parts = m.split(".")
        if len(parts) < 2:
            return m
        return ".".join(parts[:3]) if parts[1] in ("lib", "defs") and len(parts) > 2 else ".".join(parts[:2])

    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(pkg(m), set()).update(pkg(d) for d in deps if pkg(d) != pkg(m))
    return out


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_the_packages_under_recovery():
    assert cycles(package_graph(import_graph())) == []


def test_imports_point_down_the_layers():
    assert upward_imports(import_graph()) == []


def test_a_planted_cycle_is_found(tmp_path: Path):
    pkg = tmp_path / "recovery"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "lib" / "__init__.py").write_text("")
    (pkg / "lib" / "a.py").write_text("def f():\n    from recovery.lib import b  # lazy, still a cycle\n")
    (pkg / "lib" / "b.py").write_text("from recovery.lib.a import f\n")
    (pkg / "cli.py").write_text("from recovery.lib import a\n")
    (pkg / "lib" / "c.py").write_text("import recovery.cli\n")
    graph = import_graph(pkg)
    assert cycles(graph) == [["recovery.lib.a", "recovery.lib.b"]]
    assert upward_imports(graph) == ["recovery.lib.c -> recovery.cli"]


def test_the_command_line_is_on_top_and_the_code_location_imported_only_by_launchers():
    graph = import_graph()
    assert not [m for m, deps in graph.items() if "recovery.cli" in deps]
    importers = {m for m, deps in graph.items() if "recovery.definitions" in deps}
    assert importers and all(layer_of(m) < layer_of("recovery.definitions") for m in importers), importers
