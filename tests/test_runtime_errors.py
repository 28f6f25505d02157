"""Bad input met at run time, in one line: an env's NaN or inf, an env that raises, a memory budget or
a replay capacity the machine cannot hold (``--debug`` keeps the traceback)."""

from __future__ import annotations

import pytest

from dagrl.app.cli import main
from dagrl.core.context import EnvError

QUIET = ["--set", "stop.mean_return=null", "--set", "stop.iterations=50", "--quiet"]


def run(graph: str, env: str, tmp_path, *extra: str) -> int:
    return main(
        ["run", graph, "--set", f"env.id=tests.faulty:{env}", "--set", f"runs_dir={tmp_path}", *QUIET, *extra]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            "NanAfter-v0",
            r"env tests.faulty:NanAfter-v0 gave a non-finite observation \(nan\) at step \d+ of sampler\[0\]",
        ),
        ("RaisesAfter-v0", r"env tests.faulty:RaisesAfter-v0 raised in step\(\) on sampler\[0\]: RuntimeError: the "),
    ],
)
def test_an_env_gone_wrong_is_one_line_naming_env_sampler_and_step(graphs_dir, tmp_path, capsys, env, says):
    import re

    assert run(f"{graphs_dir}/ppo-cartpole-single.yaml", env, tmp_path) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("dagrl: training stopped: ") and re.search(says, line), line


def test_with_debug_the_env_error_keeps_its_traceback(graphs_dir, tmp_path):
    with pytest.raises(EnvError, match="raised in step"):
        main(["--debug", "run", f"{graphs_dir}/ppo-cartpole-single.yaml", "--set", "env.id=tests.faulty:RaisesAfter-v0",
              "--set", f"runs_dir={tmp_path}", *QUIET])  # fmt: skip


def test_an_env_that_keeps_raising_on_a_cluster_ends_in_its_error_line_alone(graphs_dir, tmp_path, capfd):
    """Each replacement's failure is one line, and so is the crash loop; no traceback from the driver or
    from the workers' Dask logs."""
    code = run(
        f"{graphs_dir}/ppo-cartpole-sync.yaml", "RaisesAfter-v0", tmp_path, "--set", "supervision.max_restarts=1"
    )
    assert code == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Compute Failed" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("dagrl: training stopped: crash loop: sampler[") and last.endswith(
        "RuntimeError: the physics engine lost its licence; last good checkpoint kept"
    ), last


def test_a_memory_budget_beyond_the_machines_ram_is_refused_before_anything_starts(graphs_dir, tmp_path, capsys):
    code = main(["run", f"{graphs_dir}/dqn-cartpole-apex.yaml", "--set", "roles.replay.memory=1PiB",
                 "--set", f"runs_dir={tmp_path}", "--quiet"])  # fmt: skip
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "roles.replay.memory" in line and "1PiB: more than this machine's" in line, line
    assert not list(tmp_path.iterdir()), "a run directory was made"
