"""simple_spread as the MAPPO authors' code runs it (``dagrl.envs.mpe``): against mpe2's ``simple_spread_v3``
from the same seeds, only when a push moves an agent and where landmarks start differ."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mpe2")

from mpe2 import simple_spread_v3  # noqa: E402

from dagrl.envs.mpe import LANDMARK_SPAN, simple_spread_mappo  # noqa: E402

KWARGS = {"N": 3, "max_cycles": 25, "local_ratio": 0.5}
NOOP, RIGHT = 0, 2  # mpe2's discrete moves: 2 pushes +x


def positions(env):
    world = env.unwrapped.world
    return np.array([e.state.p_pos for e in world.agents]), np.array([e.state.p_pos for e in world.landmarks])


def test_same_seed_same_agents_landmarks_drawn_in_the_narrower_span():
    ours, theirs = simple_spread_mappo(**KWARGS), simple_spread_v3.parallel_env(**KWARGS)
    widest = 0.0
    for seed in range(50):
        obs, _ = ours.reset(seed=seed)
        ref, _ = theirs.reset(seed=seed)
        (agents, marks), (ref_agents, ref_marks) = positions(ours), positions(theirs)
        np.testing.assert_array_equal(agents, ref_agents)
        np.testing.assert_allclose(marks, LANDMARK_SPAN * ref_marks)
        assert obs.keys() == ref.keys() and all(obs[a].shape == ref[a].shape for a in obs)
        widest = max(widest, np.abs(ref_marks).max())
    assert widest > LANDMARK_SPAN  # mpe2's landmarks do go where these never start


def test_a_push_moves_its_agent_in_the_step_it_is_taken():
    """One push right (force 5, dt 0.1, mass 1), then nothing: the velocity is 0.5, then 0.5 x 0.75. Here
    the agent moves by each step's new velocity (0.05, then 0.0375); in mpe2 by the one before (0, then 0.05)."""
    moves = {}
    for name, make in (("ours", simple_spread_mappo), ("mpe2", simple_spread_v3.parallel_env)):
        env = make(**KWARGS)
        env.reset(seed=0)
        agents, _ = positions(env)
        apart = min(np.linalg.norm(a - b) for i, a in enumerate(agents) for b in agents[i + 1 :])
        assert apart > 0.5  # no contact forces: the push alone moves agent_0
        track = [agents[0, 0]]
        for action in (RIGHT, NOOP):
            env.step({a: action if a == "agent_0" else NOOP for a in env.agents})
            track.append(positions(env)[0][0, 0])
        moves[name] = np.diff(track)
        assert env.unwrapped.world.agents[0].state.p_vel[0] == pytest.approx(0.375)
    np.testing.assert_allclose(moves["ours"], [0.05, 0.0375])
    np.testing.assert_allclose(moves["mpe2"], [0.0, 0.05], atol=1e-12)


def test_rewards_follow_local_ratio_as_mpe2s_do():
    """The guide's conversion to MAPPO's units rests on the reward being mpe2's; recomputed from positions."""
    env = simple_spread_mappo(**KWARGS)
    for seed in range(5):
        env.reset(seed=seed)
        while env.agents:
            rewards = env.step({a: env.action_space(a).sample() for a in env.agents})[1]
            agents, marks = positions(env)
            touch = 2 * env.unwrapped.world.agents[0].size  # agents collide closer than the sum of their sizes
            cover = sum(np.linalg.norm(agents - m, axis=1).min() for m in marks)
            for i, agent in enumerate(env.possible_agents):
                hits = sum(np.linalg.norm(agents[i] - b) < touch for j, b in enumerate(agents) if j != i)
                assert rewards[agent] == pytest.approx(0.5 * -cover + 0.5 * -hits)
