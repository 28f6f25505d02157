"""Observations holding an image beside other values: a ``Dict`` of camera pixels and a state vector.

Gymnasium's ``AddRenderObservation(render_only=False)`` gives such a ``Dict``; so do robots with a
camera and joint sensors. A ``Tuple`` holding an image is taken the same way, its entries keyed
``"0"``, ``"1"``, ... Samplers, Dask, replay and the learner carry one array per observation, so
:class:`~dagrl.envs.mixed.MixedObservation` lays every part out in one flat ``uint8`` vector and records
where each part lies in a :class:`MixedBox`:

* first the entries that are not images, as gymnasium flattens them (a ``Discrete`` one-hot), each
  value a ``float32`` written as its 4 bytes;
* then each image, channels first (stacked frames folded into the channels: :mod:`dagrl.spaces.images`),
  one byte per pixel as the env gives it;
* then zero bytes up to a multiple of 4, so that any row of a batch starts on a ``float32`` boundary.

Images therefore travel, and are stored in replay, at one byte a pixel (zarr compresses them as it
does Atari frames), and the other values bit for bit. The networks' :class:`MixedEncoder` cuts the
vector apart again: a Nature CNN for each image, the other entries read back as ``float32``, all
concatenated in the ``Dict``'s order (what Stable-Baselines3's ``CombinedExtractor`` does for its
``MultiInputPolicy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from dagrl.spaces.images import ImageLayout, image_layout

FLOAT_BYTES = 4
"""Bytes of each value of an entry that is not an image (``float32``)."""


@dataclass(frozen=True)
class Part:
    """Where one entry of a ``Dict`` observation lies in the packed ``uint8`` vector."""

    key: str
    start: int
    """The entry's first byte."""
    size: int
    """Its number of values: pixels of an image, ``float32`` values otherwise."""
    layout: ImageLayout | None = None
    """How the env gives an image entry, which is packed channels first; ``None`` for the others (flattened)."""

    @property
    def image(self) -> tuple[int, int, int] | None:
        """``(C, H, W)`` for an image, else ``None``."""
        return self.layout.shape if self.layout else None

    @property
    def stop(self) -> int:
        """One past the entry's last byte."""
        return self.start + self.size * (1 if self.image else FLOAT_BYTES)


class MixedBox(gym.spaces.Box):
    """A flat ``uint8`` Box whose :attr:`parts` say where each entry of the env's ``Dict`` lies.

    :attr:`parts` are in the ``Dict``'s order (the order of the encoder's features); their bytes lie
    entries first, images after (:mod:`dagrl.spaces.mixed`). :attr:`source` is the env's ``Dict``.
    """

    def __init__(self, parts: tuple[Part, ...], size: int, source: gym.spaces.Dict):
        super().__init__(0, 255, (size,), dtype=np.uint8)
        self.parts = parts
        self.source = source

    @property
    def images(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if p.image is not None)

    @property
    def values(self) -> tuple[Part, ...]:
        """The entries that are not images."""
        return tuple(p for p in self.parts if p.image is None)

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        """A packed observation: random pixels and values drawn within each entry's bounds (random
        bytes could read as ``nan``)."""
        out = super().sample(mask, probability)
        for p in self.values:
            sub = _entry(self.source.spaces, p.key)
            sub.seed(int(self.np_random.integers(2**31)))
            out[p.start : p.stop] = np.asarray(gym.spaces.flatten(sub, sub.sample()), np.float32).view(np.uint8)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MixedBox) and super().__eq__(other) and self.parts == other.parts

    def __repr__(self) -> str:
        inner = ", ".join(f"{p.key}: {'image ' + str(p.image) if p.image else p.size}" for p in self.parts)
        return f"MixedBox({inner})"


def mixed_space(space: gym.Space) -> MixedBox | None:
    """The packed form of a ``Dict`` or ``Tuple`` observation space with at least one image entry, else
    ``None``.

    >>> space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8),
    ...                          "state": gym.spaces.Box(-1, 1, (5,))})
    >>> packed = mixed_space(space)
    >>> packed, packed.dtype, packed.shape
    (MixedBox(pixels: image (3, 64, 64), state: 5), dtype('uint8'), (12308,))
    >>> [(p.key, p.start, p.stop) for p in packed.parts]  # the state's 5 float32s first
    [('pixels', 20, 12308), ('state', 0, 20)]
    """
    if isinstance(space, gym.spaces.Dict):
        entries = list(space.spaces.items())
    elif isinstance(space, gym.spaces.Tuple):
        entries = [(str(i), sub) for i, sub in enumerate(space.spaces)]
    else:
        return None
    found: dict[str, ImageLayout | gym.spaces.Box] = {}
    for key, sub in entries:
        image = image_layout(sub)
        if image is None:
            flat = gym.spaces.flatten_space(sub)
            if not isinstance(flat, gym.spaces.Box):
                return None  # no fixed size: vector_observations refuses it by name
            image = flat
        found[key] = image
    if all(isinstance(v, gym.spaces.Box) for v in found.values()):
        return None
    placed, start = {}, 0
    for key, flat in found.items():  # values first: each on a float32 boundary
        if isinstance(flat, gym.spaces.Box):
            size = int(np.prod(flat.shape))
            placed[key] = Part(key, start, size)
            start = placed[key].stop
    for key, image in found.items():
        if isinstance(image, ImageLayout):
            placed[key] = Part(key, start, int(np.prod(image.shape)), image)
            start = placed[key].stop
    size = -(-start // FLOAT_BYTES) * FLOAT_BYTES
    return MixedBox(tuple(placed[key] for key in found), size, space)


def _entry(entries: Any, key: str) -> Any:
    """Entry ``key`` of a ``Dict``'s mapping, or of a ``Tuple``'s sequence (keys ``"0"``, ``"1"``, ...)."""
    return entries[key] if isinstance(entries, Mapping) else entries[int(key)]


def pack(space: MixedBox, observation: dict[str, Any]) -> np.ndarray:
    """One ``Dict`` observation as ``space``'s ``uint8`` vector."""
    out = np.zeros(space.shape, np.uint8)
    for p in space.parts:
        value = _entry(observation, p.key)
        if p.image is None:
            flat = np.asarray(gym.spaces.flatten(_entry(space.source.spaces, p.key), value), np.float32).ravel()
            out[p.start : p.stop] = flat.view(np.uint8)
        else:
            out[p.start : p.stop] = p.layout.channels_first(np.asarray(value)).ravel()
    return out


def unpack(space: MixedBox, packed: np.ndarray) -> dict[str, np.ndarray]:
    """The entries of one packed vector: images ``(C, H, W)`` ``uint8``, the rest flat ``float32``.

    >>> space = mixed_space(gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
    ...                                      "speed": gym.spaces.Box(-1, 1, (2,))}))
    >>> obs = {"cam": np.full((1, 36, 36), 7, np.uint8), "speed": np.array([0.5, -0.25], np.float32)}
    >>> parts = unpack(space, pack(space, obs))
    >>> parts["speed"].tolist(), int(parts["cam"].max()), parts["cam"].shape
    ([0.5, -0.25], 7, (1, 36, 36))
    """
    out = {}
    for p in space.parts:
        raw = np.ascontiguousarray(packed[p.start : p.stop])
        out[p.key] = raw.reshape(p.image) if p.image else raw.view(np.float32)
    return out
