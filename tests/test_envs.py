"""Vector-env modes of a sampler and the costly CartPole used by the scaling benchmark."""

from __future__ import annotations

import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest

from dagrl.app.graphs import load_graph
from tests.helpers import dagrl_log, descendants, train
from tests.test_policies import LOSSES, first_iterations

COSTLY = "dagrl.envs:CostlyCartPole-v0"


def test_async_vector_envs_give_the_same_iterations_as_sync(graphs_dir):
    over = ["roles.sampler.envs=3", "hyperparameters.num_steps=16"]
    sync = first_iterations(load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml", over), None)
    subproc = first_iterations(
        load_graph(f"{graphs_dir}/ppo-cartpole-single.yaml", [*over, "roles.sampler.vector=async"]), None
    )
    for a, b in zip(sync, subproc, strict=True):
        assert a.env_steps == b.env_steps == 3 * 16
        np.testing.assert_array_equal(a.episodes.returns, b.episodes.returns)
        for key in LOSSES:
            assert a.metrics[key] == b.metrics[key], key


def test_async_vector_sampler_runs_on_dagrls_cluster_and_leaves_no_process(tmp_path):
    """Dask workers are daemonic processes; dagrl's worker preload lets samplers start env subprocesses."""
    before = set(descendants())
    summary, _ = train(
        "graphs/ppo-costly-cartpole.yaml", tmp_path,
        ["roles.sampler.replicas=2", "roles.sampler.vector=async", "env.kwargs.step_ms=0.2", "stop.iterations=4"],
    )  # fmt: skip
    assert summary["iterations"] == 4 and summary["env_steps"] >= 4 * 4 * 32
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and set(descendants()) - before:
        time.sleep(0.2)
    assert not set(descendants()) - before


STEPS_IN_A_FRESH_PROCESS = """
import resource, sys, time
import gymnasium as gym
import dagrl.envs  # noqa: F401
env = gym.make("dagrl.envs:CostlyCartPole-v0", step_ms=5.0, cost=sys.argv[1])
env.reset(seed=0)
before, t0 = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw, time.perf_counter()
for i in range(20):
    if env.step(i % 2)[2]:  # alternate pushes: the pole stays up for all 20 steps
        env.reset()
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before)
"""


@pytest.mark.parametrize("cost", ["sleep", "busy"])
def test_costly_cartpole_spends_its_step_cost(cost):
    """Each step takes its 5 ms; ``sleep`` gives the core up for them (a voluntary context switch a step),
    ``busy`` keeps it. Switches, not CPU seconds, are counted, in a process of its own: on a loaded
    machine a spinning thread gets only its share of a core, and beside other Python threads (a test
    session's) it gives the GIL up every switch interval."""
    done = subprocess.run(
        [sys.executable, "-c", STEPS_IN_A_FRESH_PROCESS, cost], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    wall, gave_up = done.stdout.split()
    assert float(wall) >= 20 * 0.005
    assert (int(gave_up) <= 2) if cost == "busy" else (int(gave_up) >= 20), gave_up


@pytest.mark.parametrize("cost", ["sleep", "busy"])
def test_costly_cartpole_at_no_cost_is_cartpole_and_never_waits(cost, monkeypatch):
    """``step_ms: 0`` steps as CartPole-v1 does, without a ``sleep(0)`` (~30 us of CPU a step)."""
    import dagrl.envs.registry as registry

    monkeypatch.setattr(registry.time, "sleep", lambda s: pytest.fail(f"slept {s}"))
    costly, plain = gym.make(COSTLY, step_ms=0, cost=cost), gym.make("CartPole-v1")
    np.testing.assert_array_equal(costly.reset(seed=3)[0], plain.reset(seed=3)[0])
    for i in range(20):  # alternate pushes: the pole stays up
        a, b = costly.step(i % 2), plain.step(i % 2)
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1:4] == b[1:4]


def test_costly_cartpole_rejects_unknown_cost():
    with pytest.raises(ValueError, match="cost must be one of sleep, busy"):
        gym.make(COSTLY, cost="spin")


def test_the_atari_preset_steps_as_gymnasiums_preprocessing_over_rgb_screens():
    """The preset's emulator renders grayscale screens only; gymnasium's wrappers over ALE's default RGB
    screens must give the same observations, rewards and episode ends, resets included."""
    pytest.importorskip("ale_py")
    from dagrl.envs.registry import make_atari

    runs = []
    for obs_type in ("grayscale", "rgb"):
        env = make_atari("Pong", obs_type=obs_type, max_num_frames_per_episode=600)  # episodes of 150 steps
        env.action_space.seed(3)
        obs, _ = env.reset(seed=7)
        steps = [obs]
        for _ in range(400):
            obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            steps += [obs, reward, terminated, truncated]
            if terminated or truncated:
                steps.append(env.reset()[0])
        runs.append(steps)
        env.close()
    assert len(runs[0]) == len(runs[1])
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert runs[0][0].shape == (4, 84, 84) and runs[0][0].dtype == np.uint8
    assert sum(1 for x in runs[0] if x is True) >= 2  # episodes ended, and the resets after them compared


def test_a_run_tells_how_much_of_its_samplers_time_the_envs_took(client, tmp_path):
    """Each sampler's seconds inside ``env.step`` are counted beside its fragments' seconds: in
    ``actors.json`` at the end, on the RL page's actor table (heartbeats) and in one log line per role."""
    from dagrl.runtime.report import in_env

    steps, envs, step_ms = 16, 2, 4.0
    with dagrl_log() as messages:
        summary, rundir = train(
            "graphs/ppo-costly-cartpole.yaml", tmp_path,
            ["policy=sync", "roles.sampler.replicas=2", f"roles.sampler.envs={envs}", "roles.sampler.vector=sync",
             f"env.kwargs.step_ms={step_ms}", f"hyperparameters.num_steps={steps}", "hyperparameters.update_epochs=1",
             "stop.iterations=3"],
            client,
        )  # fmt: skip
    actors = rundir.read_json("actors.json")
    samplers = [a for a in actors if a["role"] == "sampler"]
    assert len(samplers) == 2
    # summary.json comes last: whoever waits for it (dagrl submit's watchers) finds this account written
    assert (rundir.path / "actors.json").stat().st_mtime_ns <= (rundir.path / "summary.json").stat().st_mtime_ns
    for a in samplers:  # each vector step sleeps in every env in turn: at least envs x step_ms
        assert a["env_s"] >= 0.9 * summary["iterations"] * steps * envs * step_ms / 1e3
        assert a["env_s"] <= a["busy_s"]["collect"] and 0.5 < in_env(a) <= 1.0
        assert a["vector"] == ["sync"] and a["double_buffered"] == [False]  # in turn: nothing to overlap
    assert all(a["env_s"] == 0.0 and in_env(a) is None for a in actors if a["role"] == "learner")
    lines = [m for m in messages if "inside env.step" in m]
    assert len(lines) == 1 and lines[0].startswith("sampler: ") and "summed over 2" in lines[0]
    assert "on threads" not in lines[0]
    assert any(m.startswith("learner: busy ") and m.endswith(" % of the run") for m in messages), messages


@pytest.mark.parametrize(
    ("learner_s", "sampler_s", "pace"),
    [(9.7, 2.0, "learner"), (3.0, 9.5, "sampler"), (9.5, 9.6, None), (5.0, 4.0, None)],
)
def test_a_runs_last_lines_name_the_role_that_set_its_pace(tmp_path, learner_s, sampler_s, pace):
    """Each role's busy share of the run (its instances' mean), and the one role busy nearly all of it
    while no other was: the others waited on it."""
    from dagrl.app.training import time_in_roles
    from dagrl.runtime.rundir import RunDir

    class Finished:
        def actors(self):
            sampler = {"role": "sampler", "busy_s": {"collect": sampler_s}, "env_s": sampler_s / 2}
            return [sampler, dict(sampler), {"role": "learner", "busy_s": {"update": learner_s}, "env_s": 0.0}]

    with dagrl_log() as lines:
        time_in_roles(Finished(), RunDir.create(tmp_path, "pace"), wall_s=10.0)
    assert f"learner: busy {10 * learner_s:.0f} % of the run" in lines
    sampler = next(line for line in lines if line.startswith("sampler: "))
    assert sampler.endswith(f"busy {10 * sampler_s:.0f} % of the run (mean of its instances)"), sampler
    assert "50 % of its fragment time inside env.step" in sampler
    paced = [line for line in lines if "set the run's pace" in line]
    assert paced == ([f"{pace} set the run's pace (no other role was busy 90 % of it)"] if pace else []), lines
