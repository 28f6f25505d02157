"""Graphs and clusters by name (`dagrl run ppo-cartpole --cluster local`), as the shipped files or your own."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dagrl.app import catalog
from dagrl.app.cli import main
from dagrl.core.schema import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGRL_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path / "config"


def test_a_bare_name_finds_the_shipped_file_with_or_without_yaml(user_dir):
    assert catalog.resolve("graphs", "ppo-cartpole", "GRAPH") == str(ROOT / "graphs" / "ppo-cartpole.yaml")
    assert catalog.resolve("clusters", "slurm.yaml", "--cluster") == str(ROOT / "clusters" / "slurm.yaml")


def test_a_path_is_taken_as_it_is(user_dir, tmp_path):
    assert catalog.resolve("graphs", "graphs/ppo-cartpole.yaml", "GRAPH") == "graphs/ppo-cartpole.yaml"
    assert catalog.resolve("graphs", f"{tmp_path}/nope.yaml", "GRAPH") == f"{tmp_path}/nope.yaml"
    assert catalog.resolve("clusters", None, "--cluster") is None


def test_your_own_file_hides_a_shipped_one_of_the_same_name(user_dir):
    (user_dir / "clusters").mkdir(parents=True)
    mine = user_dir / "clusters" / "local.yaml"
    mine.write_text("# my desktop\nkind: local\nworkers: 3\n")
    assert catalog.resolve("clusters", "local", "--cluster") == str(mine)
    assert catalog.entries("clusters")["local"] == mine
    assert "slurm" in catalog.entries("clusters")


def test_an_unknown_name_is_one_error_naming_the_closest_ones_not_all(user_dir):
    with pytest.raises(ConfigError) as err:
        catalog.resolve("graphs", "ppo-cartpol", "GRAPH")
    text = str(err.value)
    assert "ppo-cartpol: no such file" in text and "did you mean ppo-cartpole" in text, text
    assert "sac-halfcheetah" not in text and "\n" not in text and len(text) <= 300
    with pytest.raises(ConfigError, match="`dagrl graphs` lists them"):
        catalog.resolve("graphs", "qqqqqqqq", "GRAPH")


def test_every_shipped_graph_says_in_one_line_what_it_is(user_dir):
    from dagrl.core.graph import DESCRIPTION_CHARS

    described = {name: catalog.describe(path) for name, path in catalog.entries("graphs").items()}
    assert len(described) > 30
    for name, text in described.items():
        assert text and "\n" not in text and len(text) <= DESCRIPTION_CHARS, name


def test_a_description_of_several_lines_is_refused_naming_the_key(tmp_path):
    from dagrl.app.graphs import load_graph

    graph = tmp_path / "g.yaml"
    graph.write_text("description: |\n  two\n  lines\nalgorithm: ppo\nenv: {id: CartPole-v1}\n")
    with pytest.raises(ConfigError, match="description: one line"):
        load_graph(graph)


def test_the_command_line_says_its_version_and_lists_its_benchmarks(capsys):
    import dagrl

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"dagrl {dagrl.__version__}"
    assert main(["bench"]) == 0
    listed = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert "ppo-cartpole" in listed and "CartPole" in listed["ppo-cartpole"]
    assert not any(name.startswith("_") or name.startswith("-") for name in listed)
    assert main(["bench", "ppo-cartpol"]) == 2
    assert "did you mean ppo-cartpole?" in capsys.readouterr().err


def test_dagrl_graphs_and_clusters_list_names_and_what_they_are(user_dir, capsys):
    assert main(["graphs"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^ppo-cartpole-single +PPO on CartPole-v1 in one process", out, re.M), out
    assert main(["clusters"]) == 0
    assert "local" in capsys.readouterr().out.split()


def test_run_by_names(user_dir, tmp_path):
    argv = ["run", "ppo-cartpole-single", "--cluster", "local", "--quiet"]
    assert main([*argv, "--set", f"runs_dir={tmp_path}", "--set", "stop.iterations=1"]) == 0
    (run,) = tmp_path.iterdir()
    assert (run / "config.yaml").exists()


def test_the_wheel_ships_graphs_and_clusters(tmp_path):
    """A plain `pip install` (no checkout) finds them under <prefix>/share/dagrl."""
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("dagrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for kind in catalog.KINDS:
        shipped = {Path(n).name for n in names if f"/data/share/dagrl/{kind}/" in n}
        assert shipped == {p.name for p in (ROOT / kind).glob("*.yaml")}, kind
