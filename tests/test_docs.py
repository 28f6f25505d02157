"""The documentation's own sources: what MkDocs' strict build cannot catch."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')
LOOSE = re.compile(r"-\s*-\s*8\s*<\s*-\s*-")
"""A snippet marker however spaced: a Python formatter turns ``--8<--`` in a ``python`` fence into
``--8 < --``, which pymdownx.snippets no longer reads, and the page shows the marker instead of the file."""


def includes(text: str) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if LOOSE.search(line)]


def test_every_snippet_include_in_the_docs_is_read_and_names_a_file():
    found = 0
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for n, line in includes(page.read_text()):
            m = INCLUDE.match(line)
            assert m, f"{page.relative_to(ROOT)}:{n}: pymdownx.snippets does not read {line!r}"
            assert (ROOT / m["path"]).is_file(), f"{page.relative_to(ROOT)}:{n}: no file {m['path']}"
            found += 1
    assert found >= 4  # the tutorial's algorithm and graph, BENCHMARKS.md, CHANGELOG.md


def test_the_check_tells_a_formatted_marker_from_a_read_one():
    assert [INCLUDE.match(line) is None for _, line in includes('--8 < --"examples/reinforce.py"\n')] == [True]
    assert [INCLUDE.match(line) is None for _, line in includes('--8<-- "examples/reinforce.py"\n')] == [False]
