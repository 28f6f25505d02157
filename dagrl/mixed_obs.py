"""Observations holding an image beside other values: a ``Dict`` of camera pixels and a state vector.

Gymnasium's ``AddRenderObservation(render_only=False)`` gives such a ``Dict``; so do robots with a
camera and joint sensors. Samplers, Dask, replay and the learner carry one array per observation, so
:class:`MixedObservation` lays every part out in one flat ``float32`` vector (images channels-first,
pixel values 0-255 as they are; other parts as gymnasium flattens them: a ``Discrete`` one-hot) and
records where each part lies in a :class:`MixedBox`. The networks' :class:`MixedEncoder` cuts the
vector apart again: a Nature CNN for each image, the other parts as they are, all concatenated (what
Stable-Baselines3's ``CombinedExtractor`` does for its ``MultiInputPolicy``).

The price of one array: pixels travel as ``float32``, 4 x the bytes of ``uint8`` images alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.networks import NatureCNN, is_image


@dataclass(frozen=True)
class Part:
    """Where one entry of a ``Dict`` observation lies in the flat vector."""

    key: str
    start: int
    size: int
    image: tuple[int, int, int] | None = None
    """``(C, H, W)`` for an image, else ``None`` (the entry flattened)."""
    channels_last: bool = False
    """The env gives this image ``(H, W, C)``; it is turned channels-first when packed."""


class MixedBox(gym.spaces.Box):
    """A flat ``float32`` Box whose :attr:`parts` say where each entry of the env's ``Dict`` lies."""

    def __init__(self, parts: tuple[Part, ...], low: np.ndarray, high: np.ndarray):
        super().__init__(low, high, dtype=np.float32)
        self.parts = parts

    @property
    def images(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if p.image is not None)

    def __repr__(self) -> str:
        inner = ", ".join(f"{p.key}: {'image ' + str(p.image) if p.image else p.size}" for p in self.parts)
        return f"MixedBox({inner})"


def _as_image(space: gym.Space) -> tuple[tuple[int, int, int], bool] | None:
    """``((C, H, W), channels_last)`` if ``space`` is an image the CNN takes, else ``None``."""
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8 or len(space.shape) != 3:
        return None
    if is_image(space):
        return tuple(space.shape), False
    h, w, c = space.shape
    chw = gym.spaces.Box(0, 255, (c, h, w), np.uint8)
    return ((c, h, w), True) if c <= 4 and is_image(chw) else None


def mixed_space(space: gym.Space) -> MixedBox | None:
    """The packed form of a ``Dict`` observation space with at least one image entry, else ``None``.

    >>> space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8),
    ...                          "state": gym.spaces.Box(-1, 1, (5,))})
    >>> mixed_space(space)
    MixedBox(pixels: image (3, 64, 64), state: 5)
    >>> mixed_space(space).shape
    (12293,)
    """
    if not isinstance(space, gym.spaces.Dict):
        return None
    parts, lows, highs, start = [], [], [], 0
    for key, sub in space.spaces.items():
        image = _as_image(sub)
        if image is not None:
            shape, last = image
            size = int(np.prod(shape))
            parts.append(Part(key, start, size, shape, last))
            lows.append(np.zeros(size, np.float32))
            highs.append(np.full(size, 255, np.float32))
        else:
            flat = gym.spaces.flatten_space(sub)
            if not isinstance(flat, gym.spaces.Box):
                return None  # no fixed size: vector_observations refuses it by name
            size = int(np.prod(flat.shape))
            parts.append(Part(key, start, size))
            lows.append(flat.low.astype(np.float32).ravel())
            highs.append(flat.high.astype(np.float32).ravel())
        start += size
    if not any(p.image for p in parts):
        return None
    return MixedBox(tuple(parts), np.concatenate(lows), np.concatenate(highs))


class MixedObservation(gym.ObservationWrapper):
    """Packs an env's ``Dict`` observations into the flat vector of :func:`mixed_space`."""

    def __init__(self, env: gym.Env, space: MixedBox):
        super().__init__(env)
        self.observation_space = space
        self._spaces = env.observation_space.spaces

    def observation(self, observation: dict[str, Any]) -> np.ndarray:
        out = np.empty(self.observation_space.shape, np.float32)
        for p in self.observation_space.parts:
            value = observation[p.key]
            if p.image is None:
                value = gym.spaces.flatten(self._spaces[p.key], value)
            elif p.channels_last:
                value = np.moveaxis(value, -1, 0)
            out[p.start : p.start + p.size] = np.asarray(value, np.float32).ravel()
        return out


class MixedEncoder(nn.Module):
    """Cuts a :class:`MixedBox` vector apart: a :class:`NatureCNN` for each image, the other entries as
    they are; the outputs concatenated (width :attr:`features`).

    >>> space = mixed_space(gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
    ...                                      "speed": gym.spaces.Box(-1, 1, (2,))}))
    >>> enc = MixedEncoder(space)
    >>> enc(torch.zeros(3, space.shape[0])).shape, enc.features
    (torch.Size([3, 514]), 514)
    """

    def __init__(self, space: MixedBox):
        super().__init__()
        self.parts = space.parts
        self.cnns = nn.ModuleDict({p.key: NatureCNN(p.image[0], p.image[1:]) for p in space.images})
        self.features = sum(self.cnns[p.key].features if p.image else p.size for p in space.parts)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.flatten(1)
        out = []
        for p in self.parts:
            x = obs[:, p.start : p.start + p.size]
            out.append(self.cnns[p.key](x.reshape(-1, *p.image)) if p.image else x.float())
        return torch.cat(out, dim=-1)
