"""``dagrl bench report``: the generated tables of BENCHMARKS.md and benchmarks/RESULTS.md are what their JSON
results give."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "report.py"


def report(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_every_generated_table_in_benchmarks_md_matches_its_json():
    done = report("--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "BENCHMARKS.md: 13 generated tables match their JSON" in done.stdout
    assert "benchmarks/RESULTS.md: 30 generated tables match their JSON" in done.stdout


def test_a_figure_typed_into_a_generated_table_is_found(tmp_path, monkeypatch):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import report as generator
    finally:
        sys.path.remove(str(SCRIPT.parent))
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert generator.render(text) == text
    start = text.index("<!-- table: sampling -->")
    row = text.index("| dagrl, 1 sampler actor |", start)
    end = text.index("\n", row)
    edited = text[:row] + "| dagrl, 1 sampler actor | 99,999 | 1.2 |" + text[end:]
    copy = tmp_path / "RESULTS.md"
    copy.write_text(edited)
    monkeypatch.setattr(generator, "REPORTS", [copy])
    monkeypatch.setattr(generator, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["report.py", "--check"])
    assert generator.main() == 1
    monkeypatch.setattr(sys, "argv", ["report.py"])
    assert generator.main() == 0
    assert copy.read_text() == text  # rewritten from the JSON


def test_the_short_report_stays_short():
    words = len((ROOT / "BENCHMARKS.md").read_text().split())
    assert words <= 2500, f"BENCHMARKS.md has {words} words; the detail belongs in benchmarks/RESULTS.md"
