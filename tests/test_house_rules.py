"""Rules that keep the code livable: algorithms never import dask or the distribution layers."""

from __future__ import annotations

import ast
import pathlib

ALGOS = pathlib.Path(__file__).resolve().parent.parent / "dagrl" / "algos"
FORBIDDEN = ("dask", "distributed", "dagrl.runtime", "dagrl.policies", "dagrl.clusters")


def imported_modules(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_algorithms_do_not_import_dask_or_runtime():
    files = sorted(ALGOS.glob("*.py"))
    assert any(f.name == "ppo.py" for f in files)
    offenders = {
        f.name: sorted(m for m in imported_modules(f) if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN))
        for f in files
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_the_check_itself_catches_an_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\nfrom distributed import Client\n")
    assert "distributed" in imported_modules(bad)
