"""What a role-state factory is given: its identity, its seed, its device and a way to make envs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Episodes", "RoleContext"]


@dataclass
class Episodes:
    """Episodes that finished during a fragment call; the runtime reads these from sampler outputs.

    A fragment output that carries an ``episodes: Episodes`` attribute and an ``env_steps: int``
    attribute is counted in the run's progress, metrics and stop conditions.
    """

    returns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.returns)


@dataclass
class RoleContext:
    """Identity and environment of one role instance, built by the runtime for the state factory.

    Examples
    --------
    >>> ctx = RoleContext("sampler", index=0, replicas=1, seed=3, env_id="CartPole-v1", num_envs=2)
    >>> envs = ctx.make_envs()
    >>> envs.num_envs
    2
    """

    role: str
    index: int
    replicas: int
    seed: int
    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    num_envs: int = 1
    device: str = "cpu"
    observation_space: Any = None
    action_space: Any = None
    path: str | None = None
    """Directory for this replica's on-disk data (e.g. a replay store); ``None``: keep it in RAM."""
    memory_bytes: int | None = None
    """RAM this replica may use for data (``roles.<role>.memory`` in the graph), if given."""

    def make_envs(self) -> Any:
        """A gymnasium vector env of ``num_envs`` copies, autoreset in the same step.

        When an episode ends, ``step`` returns the first observation of the next one and puts the
        last observation of the finished one in ``info["final_obs"]``.
        """
        import gymnasium as gym

        return gym.make_vec(
            self.env_id,
            num_envs=self.num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
            **self.env_kwargs,
        )
