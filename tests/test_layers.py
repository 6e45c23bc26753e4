"""The package's rooms and the order they import in (README.md, Layout): a module may import
from its own room or from rooms below it, never above, and no import cycle exists, not
even through imports inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "llcinfer"

# top to bottom; a room is a subpackage or a list of top-level modules
LAYERS = [
    ["cli"],
    ["ray_serve"],
    ["serve"],
    ["controllers"],
    ["bench"],
    ["api", "__init__"],
    ["engine"],
    ["speculative"],
    ["planner"],
    ["executor"],
    ["sparse"],
    ["kv"],
    ["kernels"],
    ["weights"],
    ["hw"],
    ["model"],
    ["jit", "paths", "settings", "dtypes", "errors"],
]
RANK = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        rel = p.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that ``name`` imports anywhere in its text."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            stems = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            subs = [f"{stem}.{a.name}" for a in node.names if f"{stem}.{a.name}" in modules]
            stems = subs + ([stem] if len(subs) < len(node.names) else [])
        else:
            continue
        for s in stems:
            while s and s not in modules:
                s = s.rpartition(".")[0]
            if s and s != name:
                found.add(s)
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def test_every_module_has_a_room():
    missing = sorted({_room(m) for m in _modules()} - set(RANK))
    assert not missing, f"rooms missing from LAYERS (and README's layout): {missing}"


def test_imports_point_down():
    bad = []
    for mod, targets in _graph().items():
        for t in targets:
            if RANK[_room(t)] < RANK[_room(mod)]:
                bad.append(f"{mod} -> {t}")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = _graph()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(", ".join(c) for c in cycles)


def test_every_package_is_installed():
    """pyproject.toml lists the packages setuptools installs: a room missing there would be
    missing from a non-editable install."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
