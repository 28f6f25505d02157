"""Random transitions shaped by an env's spaces: batches for measuring and checking learner updates
without an env (``dagrl bench cuda-graphs``, ``dagrl bench sac-pendulum``, the CUDA-graph tests)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from dagrl.replay.store import Sample


def random_sample(
    obs_space: gym.Space, act_space: gym.Space, n: int, seed: int = 0, terminal: float = 0.0,
    weights: np.ndarray | None = None,
) -> Sample:  # fmt: skip
    """``n`` transitions: observations uniform over a ``uint8`` space's values or standard normal, actions
    uniform over the action space (``Discrete``, or within a ``Box``'s bounds), standard normal rewards,
    each one terminal with probability ``terminal``; importance weights ``weights`` (default 1)."""
    rng = np.random.default_rng(seed)

    def observations() -> np.ndarray:
        if obs_space.dtype == np.uint8:
            return rng.integers(0, 256, (n, *obs_space.shape), dtype=np.uint8)
        return rng.standard_normal((n, *obs_space.shape)).astype(np.float32)

    if isinstance(act_space, gym.spaces.Discrete):
        action = rng.integers(0, int(act_space.n), n)
    else:
        action = rng.uniform(act_space.low, act_space.high, (n, *act_space.shape)).astype(np.float32)
    data = {
        "obs": observations(), "action": action, "reward": rng.standard_normal(n).astype(np.float32),
        "next_obs": observations(), "terminated": rng.random(n) < terminal, "truncated": np.zeros(n, bool),
    }  # fmt: skip
    return Sample(data, np.arange(n), np.ones(n, np.float32) if weights is None else weights)
