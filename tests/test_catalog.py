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


def test_an_unknown_name_is_one_error_listing_the_known_ones(user_dir):
    with pytest.raises(ConfigError) as err:
        catalog.resolve("graphs", "ppo-cartpol", "GRAPH")
    assert "ppo-cartpol: no such file" in str(err.value) and "ppo-cartpole-sync" in str(err.value)


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
