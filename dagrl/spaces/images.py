"""How an env's ``uint8`` image becomes the ``(C, H, W)`` array the CNN takes.

Envs and wrappers give images in four layouts; each becomes channels first, stacked frames folded into
the channels (what Stable-Baselines3's ``VecFrameStack`` and ``VecTransposeImage`` make of them):

* ``chw``: ``(C, H, W)``, as it is (gymnasium's ``FrameStackObservation`` of grayscale frames);
* ``hwc``: ``(H, W, C)``, ``C <= 4`` (an RGB screen) turned to ``(C, H, W)``;
* ``schw``: ``(S, C, H, W)``, ``S`` stacked channels-first frames, as ``(S * C, H, W)``;
* ``shwc``: ``(S, H, W, C)``, ``C <= 4`` (``FrameStackObservation`` of an RGB screen) as ``(S * C, H, W)``,
  the channels of the oldest frame first.

Height and width are :data:`dagrl.spaces.images.MIN_IMAGE_SIDE` pixels at least; anything smaller is no image
and is flattened to a vector instead.

Image observations: design notes
--------------------------------

An observation space of ``uint8`` ``[C, H, W]`` at least 36 pixels high and wide (``dagrl.spaces.images.is_image``:
stacked grayscale frames, as gymnasium's Atari wrappers give; a channels-last ``[H, W, C]`` one and a stack of
frames are made one where envs are made, see above) gets the Nature CNN (``networks.NatureCNN``, scaling to [0,
1] inside; ``hyperparameters.cnn: impala``: IMPALA's residual CNN, ``networks.ImpalaCNN``, in its place) as
PPO's/IMPALA's shared trunk, with a linear actor and critic head, and as DQN's Q-network with one linear
layer; SAC and TD3 give their actor a trunk of its own and their twin critics one trunk for both, each
followed by the usual MLP (``networks.encoder``; the critic's losses train its trunk, the actor's loss its own).
With ``share_encoder: true`` their actor trains only its head, on the critic's CNN features read without
gradient (DrQ-v2's actor); the actor copies the critic's trunk into its policy at each exchange, so samplers,
evaluators and exports act with it. Any other space keeps the MLPs (checkpoint keys unchanged). Samplers store
observations with ``networks.obs_array``: images stay ``uint8`` in rollouts, through Dask (whose ``sizeof`` then
counts the real bytes) and into the learner, which converts minibatches on its device; DQN's replay stores
them as ``uint8`` rows (zarr compresses Atari frames well). ``dagrl.envs:BrightHalf-v0`` (which half of a noisy
84x84 image is bright) is the smallest task that proves the path learns (``graphs/ppo-brighthalf.yaml``,
``graphs/dqn-brighthalf.yaml``, and with a continuous action ``graphs/sac-brighthalf.yaml`` and
``graphs/td3-brighthalf.yaml``; ``tests/test_images.py``); ``dagrl.envs:Atari-v0`` is an ALE game behind gymnasium's
standard wrappers (``graphs/ppo-atari.yaml``, ``graphs/dqn-atari-apex.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

MAX_CHANNELS = 4
"""The most channels a frame given channels last may have (RGBA), so that ``(H, W, C)`` is not read as
``(C, H, W)``."""


@dataclass(frozen=True)
class ImageLayout:
    """One of the four layouts of :mod:`dagrl.spaces.images`: ``order`` and the ``(C, H, W)`` it becomes.

    >>> layout = image_layout(gym.spaces.Box(0, 255, (4, 96, 96, 3), np.uint8))
    >>> layout
    ImageLayout(order='shwc', shape=(12, 96, 96))
    >>> frames = np.zeros((4, 96, 96, 3), np.uint8)
    >>> frames[1, :, :, 2] = 9  # the second frame's blue channel
    >>> image = layout.channels_first(frames)
    >>> image.shape, int(image[5].max()), int(image.sum() == image[5].sum())
    ((12, 96, 96), 9, 1)
    """

    order: str
    """``"chw"``, ``"hwc"``, ``"schw"`` or ``"shwc"``."""
    shape: tuple[int, int, int]
    """``(C, H, W)``, stacked frames folded into ``C``."""

    @property
    def space(self) -> gym.spaces.Box:
        """The ``uint8`` box of the turned images."""
        return gym.spaces.Box(0, 255, self.shape, np.uint8)

    def channels_first(self, obs: np.ndarray) -> np.ndarray:
        """One observation as a contiguous ``(C, H, W)`` array."""
        if self.order == "hwc":
            obs = np.moveaxis(obs, -1, 0)
        elif self.order == "shwc":
            obs = obs.transpose(0, 3, 1, 2)
        return np.ascontiguousarray(obs).reshape(self.shape)


def image_layout(space: gym.Space) -> ImageLayout | None:
    """The layout of ``space``'s images if it is a ``uint8`` ``Box`` of images the CNN takes, else ``None``.

    >>> image_layout(gym.spaces.Box(0, 255, (96, 96, 3), np.uint8))  # CarRacing's screen
    ImageLayout(order='hwc', shape=(3, 96, 96))
    >>> image_layout(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)).order  # Atari, preprocessed
    'chw'
    >>> image_layout(gym.spaces.Box(0, 255, (4, 3, 64, 64), np.uint8)).shape
    (12, 64, 64)
    >>> image_layout(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)) is None  # too small for the CNN
    True
    """
    if not isinstance(space, gym.spaces.Box) or np.dtype(space.dtype) != np.uint8:
        return None
    shape = tuple(int(n) for n in space.shape)
    candidates = []
    if len(shape) == 3:
        a, b, c = shape
        candidates = [("chw", (a, b, c)), ("hwc", (c, a, b))]
    elif len(shape) == 4:
        s, a, b, c = shape
        candidates = [("schw", (s * a, b, c)), ("shwc", (s * c, a, b))]
    for order, chw in candidates:
        if order.endswith("c") and shape[-1] > MAX_CHANNELS:
            continue
        if is_image(gym.spaces.Box(0, 255, chw, np.uint8)):
            return ImageLayout(order, chw)
    return None


MIN_IMAGE_SIDE = 36
"""The smallest height and width :class:`NatureCNN`'s three convolutions take."""


def is_image(space) -> bool:
    """A ``uint8`` observation of shape ``(C, H, W)`` (stacked frames first, as gymnasium's
    ``FrameStackObservation`` of 84x84 grayscale frames gives ``(4, 84, 84)``), at least
    :data:`MIN_IMAGE_SIDE` pixels high and wide. (Channels-last images and stacks of frames are made
    such an image where envs are made: :mod:`dagrl.spaces.images`.)"""
    shape = tuple(getattr(space, "shape", ()) or ())
    return len(shape) == 3 and np.dtype(space.dtype) == np.uint8 and min(shape[1:]) >= MIN_IMAGE_SIDE
