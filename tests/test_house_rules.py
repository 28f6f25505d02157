"""Rules that keep the code livable: algorithms never import dask or the distribution layers; the
worker list is read one way."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dagrl"
ALGOS = PACKAGE / "algos"
EXAMPLES = PACKAGE.parent / "examples"
FORBIDDEN = ("dask", "distributed", "dagrl.runtime", "dagrl.policies", "dagrl.clusters", "dagrl.app")


def imported_modules(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_algorithms_do_not_import_dask_or_runtime():
    files = sorted([*ALGOS.glob("*.py"), *EXAMPLES.glob("*.py")])
    assert any(f.name == "ppo.py" for f in files) and any(f.name == "a2c.py" for f in files)
    offenders = {
        f.name: sorted(m for m in imported_modules(f) if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN))
        for f in files
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_the_check_itself_catches_an_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\nfrom distributed import Client\n")
    assert "distributed" in imported_modules(bad)


def scheduler_info_calls(path: pathlib.Path) -> list[int]:
    """Lines of ``path`` calling ``<anything>.scheduler_info(...)``."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "scheduler_info"
    ]


def test_the_worker_list_is_read_through_dagrl_clusters_workers():
    """``client.scheduler_info()`` returns the client's cached identity, which the client's periodic
    refresh empties of workers now and then (``dagrl.runtime.workers.workers`` says more): a liveness check
    that read it took live roles as lost."""
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    offenders = {str(f.relative_to(PACKAGE)): scheduler_info_calls(f) for f in files}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_worker_list_check_itself_finds_a_call(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(client):\n    return client.scheduler_info(n_workers=-1)['workers']\n")
    assert scheduler_info_calls(bad) == [2]


def test_what_dagrl_exports_stays_itself_after_every_module_is_imported():
    """Importing a submodule sets it as an attribute of its package: a ``dagrl/evaluation.py`` replaced
    the ``@evaluation`` decorator, and ``from dagrl import evaluation`` in an algorithm file failed with
    "'module' object is not callable" once ``dagrl eval`` had imported that module."""
    import importlib
    import pkgutil
    import types

    import dagrl

    for info in pkgutil.walk_packages(dagrl.__path__, "dagrl."):
        if not info.name.endswith("__main__"):  # that one runs the command line
            importlib.import_module(info.name)
    shadowed = [name for name in dagrl.__all__ if isinstance(getattr(dagrl, name), types.ModuleType)]
    assert not shadowed
