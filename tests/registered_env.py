"""Defines and registers an env under a plain id when imported, as a user's own package does: a process
that did not import this module does not know the id. Imported by one test only (tests/test_sweep.py)."""

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

ID = "SweepOnlyCartPole-v0"


class SweepOnlyCartPole(CartPoleEnv):
    """CartPole under another name."""


if ID not in gym.registry:
    gym.register(ID, entry_point=SweepOnlyCartPole, max_episode_steps=500)
