"""PPO whose learner raises once, mid-run (``DAGRL_FAULT_DIR`` marker): a learner failure whose worker
survives, for the stream's rollback tests. Everything else is :mod:`dagrl.algos.ppo`'s own. Also an
env that hangs once, for a sampler loop that stops answering."""

from __future__ import annotations

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from dagrl import Manifest, fragment, iteration
from dagrl.algos import ppo
from dagrl.algos.common import actor_critic
from dagrl.algos.ppo import Config, learner, sampler  # the roles and config this algorithm runs
from tests.faulty import hang, once


class HangsOnce(CartPoleEnv):
    """CartPole whose ``step`` hangs once (in the whole test) after 300 steps of one env."""

    steps = 0

    def step(self, action):
        HangsOnce.steps += 1
        if HangsOnce.steps > 300 and once("step-hung"):
            hang(limit_s=120)
        return super().step(action)


gym.register("HangsOnce-v0", entry_point=HangsOnce, max_episode_steps=500)

FAIL_AT_UPDATE = 6


@fragment(role="learner")
def publish(state: ppo.LearnerState) -> actor_critic.Weights:
    return ppo.publish.fn(state)


@fragment(role="sampler")
def collect(state: actor_critic.SamplerState, weights: actor_critic.Weights) -> ppo.Rollout:
    return ppo.collect.fn(state, weights)


@fragment(role="learner")
def update(state: ppo.LearnerState, rollouts: list[ppo.Rollout]) -> ppo.Metrics:
    if state.updates >= FAIL_AT_UPDATE and once("learner-raised"):
        raise RuntimeError("the optimiser diverged")
    return ppo.update.fn(state, rollouts)


@iteration
def train_iteration():
    return update(collect(publish()))


ALGORITHM = Manifest(config=Config, roles=[sampler, learner], iteration=train_iteration)
