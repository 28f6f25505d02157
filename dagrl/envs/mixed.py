"""The wrapper that packs an env's ``Dict`` (or ``Tuple``) observations holding an image into one
``uint8`` vector, laid out as :mod:`dagrl.spaces.mixed` says."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from dagrl.spaces.mixed import MixedBox, pack


class MixedObservation(gym.ObservationWrapper):
    """Packs an env's ``Dict`` observations into the ``uint8`` vector of :func:`mixed_space`."""

    def __init__(self, env: gym.Env, space: MixedBox):
        super().__init__(env)
        self.observation_space = space

    def observation(self, observation: dict[str, Any]) -> np.ndarray:
        return pack(self.observation_space, observation)
