"""The examples in dagrl's docstrings run and show what they print."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import dagrl

MODULES = sorted(m.name for m in pkgutil.walk_packages(dagrl.__path__, "dagrl.") if m.name != "dagrl.__main__")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (output above)"


def test_the_modules_hold_examples():
    finder = doctest.DocTestFinder()
    examples = sum(len(t.examples) for n in MODULES for t in finder.find(importlib.import_module(n)))
    assert examples >= 30, examples
