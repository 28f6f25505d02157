"""``wandb: {project: ...}``: every metrics row sent to Weights & Biases at its env steps, read back from
the offline run's own file; a resumed run continues the same W&B run; bad settings are refused first."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from dagrl.app.cli import main
from dagrl.app.graphs import load_graph
from dagrl.core.schema import ConfigError
from dagrl.runtime.rundir import RunDir

pytest.importorskip("wandb")

GRAPH = "graphs/ppo-cartpole-single.yaml"
OFFLINE = ["wandb.project=dagrl-test", "wandb.mode=offline", "wandb.group=tests", "stop.mean_return=null"]


def records(path: Path) -> list:
    """The records of a W&B run file (``run-<id>.wandb``): a 7-byte ``:W&B`` header, then LevelDB's log
    format, 32 KiB blocks of chunks (4-byte checksum, 2-byte length, 1-byte type: full, first, middle,
    last), each record one protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    block, pos, out, pending = 32768, 7, [], b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if pos + 7 + length > len(raw):  # a chunk still being written
            break
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pending = data
        elif kind in (3, 4):
            pending += data
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def history(run: Path) -> tuple[str, dict[int, dict], dict, dict]:
    """The W&B run id, ``{step: values}`` of every history row of every W&B file of ``run``, the config
    the run sent, and its summary."""
    (state,) = [json.loads((run / "wandb.json").read_text())]
    rows, config, summary = {}, {}, {}
    for path in sorted(run.glob("wandb/offline-run-*/run-*.wandb")):
        assert path.name == f"run-{state['id']}.wandb"  # one W&B run, whatever the number of processes
        for _ in range(100):  # W&B's own process may still be writing the file when finish() returns
            if (written := records(path)) and written[-1].WhichOneof("record_type") == "exit":
                break
            time.sleep(0.1)
        for r in written:
            kind = r.WhichOneof("record_type")
            if kind == "history":
                values = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                rows[r.history.step.num] = values
            elif kind == "summary":
                summary.update({u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in r.summary.update})
            elif kind == "run":
                config.update({u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in r.run.config.update})
    return state["id"], rows, config, summary


def test_every_metrics_row_reaches_wandb_at_its_env_steps_with_the_graph_as_config_and_the_summary(tmp_path):
    runs = tmp_path / "runs"
    args = [*OFFLINE, "stop.iterations=3", f"runs_dir={runs}"]
    assert main(["run", GRAPH, "--quiet", *[f"--set={a}" for a in args]]) == 0
    (run,) = runs.iterdir()
    _, rows, config, summary = history(run)
    metrics = RunDir(run).read_metrics()
    assert sorted(rows) == [m["env_steps"] for m in metrics] and len(metrics) == 3
    for m in metrics:
        sent = rows[m["env_steps"]]
        for key in ("iteration", "losses/approx_kl", "losses/value", "time_s"):
            assert sent[key] == pytest.approx(m[key], rel=1e-9), key
    assert summary["dagrl/stop_reason"] == "iterations" and summary["dagrl/iterations"] == 3
    at = (summary["dagrl/stopped_at/iteration"], summary["dagrl/stopped_at/env_steps"])
    assert at == (3, metrics[-1]["env_steps"])  # where the stop held (no iteration ran ahead of it here)
    assert summary["dagrl/mean_return"] == pytest.approx(json.loads((run / "summary.json").read_text())["mean_return"])
    assert config["algorithm"] == "ppo" and config["name"] == "ppo-cartpole-single"
    assert config["hyperparameters"]["num_steps"] == load_graph(GRAPH).config.num_steps


def test_a_resumed_run_goes_on_in_the_same_wandb_run_and_sends_each_env_step_once(tmp_path):
    runs = tmp_path / "runs"
    base = [*OFFLINE, "checkpoint.every=2", f"runs_dir={runs}"]
    assert main(["run", GRAPH, "--quiet", *[f"--set={a}" for a in [*base, "stop.iterations=5"]]]) == 0
    (run,) = runs.iterdir()
    first_id, before, *_ = history(run)
    checkpoints = RunDir(run).list_checkpoints()
    checkpoints[-1].unlink()  # iteration 5's checkpoint is lost: the resumed run redoes iteration 5
    assert main(["run", "--resume", str(run), "--quiet", "--set=stop.iterations=7"]) == 0
    run_id, rows, *_ = history(run)
    metrics = RunDir(run).read_metrics()
    assert run_id == first_id and len(list(run.glob("wandb/offline-run-*"))) == 2
    assert [m["iteration"] for m in metrics] == [1, 2, 3, 4, 5, 6, 7]
    assert sorted(rows) == [m["env_steps"] for m in metrics]  # iteration 5's steps once, as first sent
    assert rows[metrics[4]["env_steps"]] == before[metrics[4]["env_steps"]]


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("wandb.mode=cloud", r"wandb\.mode: expected .*online.*got 'cloud'"),
        ("wandb.project=' '", r"wandb: project must not be empty"),
        ("wandb.projet=x", r"wandb\.projet: unknown key"),
    ],
)
def test_bad_wandb_settings_are_refused_naming_the_key(override, says):
    with pytest.raises(ConfigError, match=says) as err:
        load_graph(GRAPH, [override])
    assert GRAPH in str(err.value)


def test_wandb_without_the_package_is_refused_before_anything_starts(monkeypatch):
    import dagrl.app.graphs

    monkeypatch.setattr(dagrl.app.graphs, "wandb_available", lambda: False)
    with pytest.raises(ConfigError, match=r"wandb\.project: set, but .*pip install 'dagrl\[wandb\]'"):
        load_graph(GRAPH, ["wandb.project=x"])


def test_wandb_online_without_an_api_key_stops_the_run_in_one_line_before_a_cluster_starts(
    tmp_path, monkeypatch, capsys
):
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no W&B settings of this machine's user
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    runs = tmp_path / "runs"
    graph = "graphs/ppo-cartpole-sync.yaml"  # a distributed graph: its cluster would start after this
    capsys.readouterr()
    assert main(["run", graph, "--quiet", "--set=wandb.project=dagrl-test", f"--set=runs_dir={runs}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dagrl: error: {graph}: wandb.project: dagrl-test:"), err
    assert "API key" in err[0] and "wandb.mode: offline" in err[0]
    assert not any(runs.iterdir())  # the run directory is gone with it


def test_a_sweeps_trials_go_to_one_wandb_group_per_setting_unless_the_graph_names_one():
    from dagrl.app.sweep import plan

    _, trials = plan(GRAPH, ["wandb.project=x"], ["hyperparameters.lr=1e-3,3e-3"], [1, 2])
    groups = [load_graph(GRAPH, list(t.overrides)).spec.wandb.group for t in trials]
    assert groups == ["ppo-cartpole-single:lr=1e-3"] * 2 + ["ppo-cartpole-single:lr=3e-3"] * 2  # seeds together
    _, trials = plan(GRAPH, ["wandb.project=x", "wandb.group=mine"], ["hyperparameters.lr=1e-3,3e-3"], [1])
    assert {load_graph(GRAPH, list(t.overrides)).spec.wandb.group for t in trials} == {"mine"}
    _, trials = plan(GRAPH, [], ["hyperparameters.lr=1e-3"], [1])
    assert load_graph(GRAPH, list(trials[0].overrides)).spec.wandb.group is None  # no W&B: nothing added
