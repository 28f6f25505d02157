"""``environment.yml`` holds every dependency of ``pyproject.toml`` and of its test extra."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {
    "torch": ["pytorch"],
    "dask[distributed]": ["dask", "distributed"],
    "opencv-python-headless": ["py-opencv"],
    "gymnasium[mujoco]": ["gymnasium", "mujoco"],
    "gymnasium[classic-control]": ["gymnasium", "pygame"],
    "mkdocstrings[python]": ["mkdocstrings-python"],
}
"""A pip requirement's conda-forge packages, where the names differ."""


def names(requirement: str) -> list[str]:
    key = re.match(r"[\w.\[\],-]+", requirement).group(0).lower()
    return CONDA_NAMES.get(key, [key.split("[")[0]])


def test_environment_yml_holds_every_dependency_of_pyproject_and_its_test_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted, todo = list(project["dependencies"]), list(extras["test"])
    while todo:  # the test extra names the other extras as dagrl[a,b,...]
        req = todo.pop()
        if req.startswith("dagrl["):
            todo += [r for extra in req[6:-1].split(",") for r in extras[extra]]
        else:
            wanted.append(req)
    deps = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    present = {re.match(r"[\w.-]+", d).group(0).lower() for d in [*deps, *pip] if isinstance(d, str)}
    missing = sorted({n for req in wanted for n in names(req)} - present)
    assert not missing, f"environment.yml lacks {missing}"
