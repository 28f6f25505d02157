"""The package's floors: each subpackage imports only those below it, nothing imports in a circle, and
algorithms import neither each other nor Dask. Imports are read from the source (``ast``), lazy ones
inside functions included, so a cycle hidden in a function body counts."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dagrl"

LAYERS = ("spaces", "envs", "core", "nn", "replay", "algos", "runtime", "policies", "dashboard", "clusters", "app")
"""Lowest first. ``spaces`` reads observation spaces (images, packed mixed observations); ``envs`` makes
environments and knows no fragment; ``core`` is what an algorithm is written in (fragments, roles, the
role context, the graph spec); ``dashboard`` is the RL page, a plugin of Dask's dashboard; ``app`` is
what a user runs."""

APART = {"nn": "envs", "clusters": "dashboard"}
"""Floors that never import the one named though it lies below: networks read spaces, not the envs that
make them; clusters name the RL page as their scheduler's preload (a module name), never import it."""


def modules(root: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The dagrl modules ``path`` imports, anywhere in it; ``from pkg import name`` counts as the
    submodule ``pkg.name`` where there is one, else as ``pkg``."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(resolve(a.name) for a in node.names if a.name.split(".")[0] == "dagrl")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "dagrl":
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in known else resolve(node.module))
    found.discard(None)
    return found


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(path, known) - {name} for name, path in known.items()}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module from a higher floor than its own."""
    out = []
    for name, targets in graph.items():
        here = layer(name)
        if here is None:
            continue
        for target in sorted(targets):
            there = layer(target)
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                out.append(f"{name} ({here}) imports {target} ({there})")
    return out


def test_every_module_lives_on_a_floor():
    top = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and not p.name.endswith(".egg-info"))
    assert top == sorted(["__init__.py", "__main__.py", *LAYERS])


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_each_floor_imports_only_those_below():
    assert upward(import_graph()) == []


def test_floors_kept_apart_do_not_import_each_other():
    graph = import_graph()
    crossing = [
        f"{name} imports {target}"
        for name, targets in graph.items()
        for target in sorted(targets)
        if layer(name) in APART and APART[layer(name)] == layer(target)
    ]
    assert crossing == []


LOADED_BY_NAME = {
    "dagrl.__main__",  # python -m dagrl
    "dagrl.dashboard",  # a scheduler preload (scheduler_preload)
    "dagrl.envs.mpe",  # an env module, named in graph files (env.id: dagrl.envs.mpe:...)
}
"""Modules that nothing in the package imports, yet run: besides these, the packages themselves and the
algorithm modules (``algorithm: ppo`` in a graph file)."""


def test_every_module_is_imported_by_another_or_loaded_by_name():
    graph = import_graph()
    imported = set().union(*graph.values())
    orphans = [
        name
        for name, path in modules().items()
        if name not in imported
        and name not in LOADED_BY_NAME
        and path.name != "__init__.py"
        and not (name.startswith("dagrl.algos.") and not name.startswith("dagrl.algos.common"))
    ]
    assert orphans == []


def test_algorithms_share_through_common_only():
    graph = import_graph()
    crossing = [
        f"{name} imports {target}"
        for name, targets in graph.items()
        if name.startswith("dagrl.algos.") and not name.startswith("dagrl.algos.common")
        for target in targets
        if target.startswith("dagrl.algos.") and not target.startswith("dagrl.algos.common")
    ]
    assert crossing == []


@pytest.mark.parametrize(
    "files, found",
    [
        ({"a.py": "def f():\n    from dagrl import b\n", "b.py": "import dagrl.a\n"}, [["dagrl.a", "dagrl.b"]]),
        ({"a.py": "from dagrl.b import x\n", "b.py": "x = 1\n"}, []),
    ],
)
def test_the_cycle_check_finds_a_lazy_cycle(tmp_path, files, found):
    root = tmp_path / "dagrl"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, text in files.items():
        (root / name).write_text(text)
    assert cycles(import_graph(root)) == found


def test_the_floor_check_finds_an_import_from_above(tmp_path):
    root = tmp_path / "dagrl"
    for pkg in ("core", "app"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "core" / "graph.py").write_text("def f():\n    from dagrl.app.cli import main\n")
    (root / "app" / "cli.py").write_text("main = None\n")
    assert upward(import_graph(root)) == ["dagrl.core.graph (core) imports dagrl.app.cli (app)"]
