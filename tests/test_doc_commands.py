"""Every ``dagrl`` command line the docs show parses, and every graph they name exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from dagrl.app.catalog import resolve
from dagrl.app.cli import parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "notebooks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`(dagrl [^`]+)`")
GRAPH_PATH = re.compile(r"\bgraphs/([\w.-]+\.yaml)\b")
TAKES_GRAPH = {"run", "submit", "graph", "sweep", "pbt", "tune"}
PLACEHOLDER = re.compile(r"\b(GRAPH|RUN|RUN_DIR|NAME|KEY|FILE|DIR|ADDRESS|HEAD|COMMAND)\b|\.\.\.|<\w+>")


def commands(text: str) -> list[str]:
    """The ``dagrl`` command lines of a page: in shell blocks (continuations joined, comments cut, ``;``
    splitting two) and in inline code."""
    found = []
    for lang, body in FENCE.findall(text):
        if lang not in ("bash", "sh", "shell", ""):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            for part in line.split(";"):
                part = part.split(" #", 1)[0].strip()
                if part.startswith("dagrl "):
                    found.append(part)
    # inline: a whole command line (the command and an argument), not a mention such as `dagrl tune`
    found += [m for m in INLINE.findall(text) if any(not t.startswith("-") for t in m.split()[2:])]
    return [c for c in found if not PLACEHOLDER.search(c) and "$" not in c]


CASES = [(page, line) for page in DOCS for line in commands(page.read_text())]


def test_the_docs_show_commands_to_check():
    assert len(CASES) > 40 and {line.split()[1] for _, line in CASES} >= {"run", "eval", "export", "sweep", "pbt"}


@pytest.mark.parametrize(("page", "line"), CASES, ids=[f"{p.name}:{c[:60]}" for p, c in CASES])
def test_a_command_in_the_docs_parses_and_names_a_graph_that_exists(page, line):
    argv = shlex.split(line)[1:]
    try:
        args, rest = parser().parse_known_args(argv)
    except SystemExit:
        pytest.fail(f"{page.relative_to(ROOT)}: `{line}` does not parse")
    assert not rest or args.command == "bench", f"{page.relative_to(ROOT)}: `{line}`: unknown {rest}"
    graph = getattr(args, "graph", None)
    if args.command in TAKES_GRAPH and graph and not graph.startswith(("runs/", "examples/")):
        if "/" in graph:
            assert (ROOT / graph).exists(), f"{page.relative_to(ROOT)}: `{line}`: no {graph}"
        else:
            assert resolve("graphs", graph, "GRAPH"), f"{page.relative_to(ROOT)}: `{line}`"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_graph_file_a_page_names_exists(page):
    missing = [name for name in GRAPH_PATH.findall(page.read_text()) if not (ROOT / "graphs" / name).exists()]
    assert not missing, f"{page.relative_to(ROOT)} names {missing}"


def test_the_design_page_stays_short():
    """The architecture page is the short form; the detail lives in the docstrings of the modules it names."""
    words = len((ROOT / "docs" / "architecture.md").read_text().split())
    assert words <= 4000, f"docs/architecture.md has {words} words"
    for module in ("dagrl/runtime/executor.py", "dagrl/policies/__init__.py", "dagrl/replay/__init__.py"):
        assert "Design notes" in (ROOT / module).read_text(), module
