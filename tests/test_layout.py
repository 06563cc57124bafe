"""The package's shape: imports point one way and no module imports itself back.

daemon -> pipeline -> groth16 -> backends / circuits -> formats -> algebra, with errors, logs, stackprof and
paths below everything (the result printer, ``stdout``, above them), the exit codes (constants alone: the
errors name theirs) below those, and the CLI on top. Every import counts, also those inside functions: a
lazy import that closes a cycle is still a cycle a reader has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cuzk_mp"
RANK = {"__main__": 10, "cli": 9, "cli_verbs": 8, "daemon": 7, "pipeline": 6, "groth16": 5, "backends": 4,
        "circuits": 4, "formats": 3, "algebra": 2, "stdout": 2, "errors": 1, "exit_codes": 0, "logs": 1, "paths": 1,
        "intervals": 1, "stackprof": 1, "": 0}


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: the package, node.level - 1 steps up, then the module
                anchor = pkg[: len(pkg) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in mods else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in mods and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_layer_is_ranked() -> None:
    assert {_layer(m) for m in _graph()} <= set(RANK), "a new top-level module needs a place in RANK"


def test_imports_point_down() -> None:
    wrong = sorted((m, d) for m, deps in _graph().items() for d in deps
                   if _layer(m) != _layer(d) and RANK[_layer(d)] >= RANK[_layer(m)])
    assert not wrong, f"imports against the layering: {wrong}"


def test_no_import_cycles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_a_cycle(tmp_path: Path) -> None:
    """The scanner finds imports inside functions (a cycle hidden in a lazy import is still found)."""
    mods = {"cuzk_mp.x.a": tmp_path / "a.py", "cuzk_mp.x.b": tmp_path / "b.py"}
    mods["cuzk_mp.x.a"].write_text("def f():\n    from .b import g\n")
    mods["cuzk_mp.x.b"].write_text("from .a import f\n")
    assert _imports("cuzk_mp.x.a", mods["cuzk_mp.x.a"], mods) == {"cuzk_mp.x.b"}
    assert _imports("cuzk_mp.x.b", mods["cuzk_mp.x.b"], mods) == {"cuzk_mp.x.a"}
