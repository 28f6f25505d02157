"""Observation encoders: the Nature and IMPALA CNNs, one CNN per image of a mixed observation
(:class:`MixedEncoder`), the trunk an algorithm builds for a space (:func:`encoder`), and DrQ's random
shift of images.

Algorithms never import each other; what two of them need alike lives here, free of Dask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from dagrl.spaces.images import is_image
from dagrl.spaces.mixed import FLOAT_BYTES, MixedBox


class ConvEncoder(nn.Module):
    """Convolutions (``convs``, ending flat), then a ReLU layer of ``features`` units.

    Takes ``uint8`` images ``[B, C, H, W]`` and scales them to [0, 1] itself, so observations stay
    ``uint8`` (4 x smaller) through samplers, transport and replay."""

    def __init__(self, convs: nn.Sequential, channels: int, size: tuple[int, int], features: int):
        super().__init__()
        self.convs = convs
        with torch.no_grad():
            n = self.convs(torch.zeros(1, channels, *size)).shape[1]
        self.head = nn.Sequential(nn.Linear(n, features), nn.ReLU())
        self.features = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.convs(obs.float() / 255.0))


class NatureCNN(ConvEncoder):
    """The DQN Nature paper's encoder (Mnih et al., 2015): three convolutions and a 512-unit layer.

    >>> net = NatureCNN(4, (84, 84))
    >>> net(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape
    torch.Size([2, 512])
    """

    def __init__(self, channels: int, size: tuple[int, int], features: int = 512):
        convs = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        super().__init__(convs, channels, size, features)


class _Residual(nn.Module):
    """``x + conv(relu(conv(relu(x))))``, 3x3 convolutions keeping the channels and the size."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(ConvEncoder):
    """IMPALA's deep encoder (Espeholt et al., 2018, fig. 3): three stacks of a 3x3 convolution, a 3x3
    max-pool of stride 2 and two residual blocks (16, 32 and 32 channels; 15 convolutions in all),
    then a 256-unit layer. It learned better than :class:`NatureCNN` in the paper's DMLab and Atari
    runs, and it costs more per frame.

    >>> net = ImpalaCNN(4, (84, 84))
    >>> net(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape
    torch.Size([2, 256])
    """

    def __init__(
        self, channels: int, size: tuple[int, int], features: int = 256, depths: tuple[int, ...] = (16, 32, 32)
    ):
        layers: list[nn.Module] = []
        c_in = channels
        for depth in depths:
            layers += [nn.Conv2d(c_in, depth, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1)]
            layers += [_Residual(depth), _Residual(depth)]
            c_in = depth
        super().__init__(nn.Sequential(*layers, nn.ReLU(), nn.Flatten()), channels, size, features)


CNN = Literal["nature", "impala"]
"""A graph's ``cnn`` hyperparameter, the encoder of image observations: ``nature`` (:class:`NatureCNN`,
the default) or ``impala`` (:class:`ImpalaCNN`)."""


CNNS: dict[str, type[ConvEncoder]] = {"nature": NatureCNN, "impala": ImpalaCNN}


def encoder(space, hidden: int | tuple[int, ...], cnn: CNN = "nature") -> tuple[nn.Module, int]:
    """The trunk for an observation space and its output width: the CNN named ``cnn`` (:data:`CNNS`)
    for images (:func:`is_image`), one per image and the rest as it is for a ``Dict`` holding images
    (:class:`dagrl.spaces.mixed.MixedEncoder`), else ``nn.Flatten`` (the algorithm's own MLP follows)."""
    if cnn not in CNNS:
        raise ValueError(f"cnn must be one of {', '.join(CNNS)}, got {cnn!r}")
    if isinstance(space, MixedBox):
        mixed = MixedEncoder(space, cnn)
        return mixed, mixed.features
    if is_image(space):
        net = CNNS[cnn](space.shape[0], tuple(space.shape[1:]))
        return net, net.features
    return nn.Flatten(), int(np.prod(space.shape))


def random_shift(images: torch.Tensor, pad: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """DrQ's image augmentation (Kostrikov, Yarats and Fergus, 2020): each image of a ``(N, C, H, W)``
    batch padded by ``pad`` pixels, its edge repeated, and cut back to ``H x W`` at an offset of its
    own, so it moves by up to ``pad`` pixels each way. Returns ``float32`` pixel values (the CNN
    scales them as it scales ``uint8``).

    >>> img = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4)
    >>> torch.equal(random_shift(img, 0), img.float())
    True
    >>> random_shift(img, 1, torch.Generator().manual_seed(0)).shape
    torch.Size([1, 1, 4, 4])
    """
    n, c, h, w = images.shape
    x = images.float()
    if pad == 0:
        return x
    x = nn.functional.pad(x, (pad, pad, pad, pad), mode="replicate")
    dy = torch.randint(0, 2 * pad + 1, (n, 1), generator=gen, device=images.device)
    dx = torch.randint(0, 2 * pad + 1, (n, 1), generator=gen, device=images.device)
    rows = (dy + torch.arange(h, device=images.device)).view(n, 1, h, 1).expand(n, c, h, w + 2 * pad)
    cols = (dx + torch.arange(w, device=images.device)).view(n, 1, 1, w).expand(n, c, h, w)
    return x.gather(2, rows).gather(3, cols)


def has_cnn(space) -> bool:
    """Whether :func:`encoder` gives ``space`` a CNN: an image, or a ``Dict`` holding one."""
    return is_image(space) or isinstance(space, MixedBox)


def check_shift(shift: int, obs_space) -> None:
    """Refuse an ``augment_shift`` for observations that hold no ``uint8`` ``[C, H, W]`` image."""
    if shift and not has_cnn(obs_space):
        raise ValueError(
            f"augment_shift: {shift} is for uint8 [C, H, W] images (or a Dict holding them), not {obs_space}"
        )


def check_share_encoder(share: bool, obs_space) -> None:
    """Refuse ``share_encoder: true`` (an off-policy actor reading its critic's CNN) without a CNN."""
    if share and not has_cnn(obs_space):
        raise ValueError(f"share_encoder: true is for image observations (a CNN to share), not {obs_space}")


@dataclass(frozen=True)
class Shift:
    """DrQ's :func:`random_shift` of a batch's images by up to :attr:`pad` pixels, as an algorithm's
    gradient steps call it: ``shift(obs, generator)``. Made for a space by :func:`image_shift`.

    :attr:`parts` are ``(start, stop, (C, H, W))`` of each image in a :mod:`dagrl.spaces.mixed` vector:
    those bytes are shifted (and stay ``uint8``), the other entries' bytes kept. Without parts the whole
    observation is one image batch, returned as ``float32`` pixel values. A :attr:`pad` of 0 returns the
    batch as it is.
    """

    pad: int = 0
    parts: tuple[tuple[int, int, tuple[int, int, int]], ...] = ()

    def __call__(self, obs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        if not self.pad:
            return obs
        if not self.parts:
            return random_shift(obs, self.pad, gen)
        out = obs.to(torch.uint8, copy=True)
        for start, stop, shape in self.parts:
            moved = random_shift(out[:, start:stop].reshape(-1, *shape), self.pad, gen)
            out[:, start:stop] = moved.to(torch.uint8).flatten(1)  # whole pixel values: exact
        return out


def image_shift(space, pad: int) -> Shift:
    """The :class:`Shift` for an observation space (``pad`` checked by :func:`check_shift`)."""
    check_shift(pad, space)
    if isinstance(space, MixedBox):
        return Shift(pad, tuple((p.start, p.stop, p.image) for p in space.images))
    return Shift(pad)


class MixedEncoder(nn.Module):
    """Cuts a :class:`MixedBox` vector apart: a CNN for each image (``cnn``, as in
    :func:`~dagrl.nn.networks.encoder`), the other entries' ``float32`` values read back from their
    bytes; the outputs concatenated in the ``Dict``'s order (width :attr:`features`).

    Takes the packed ``uint8`` batch ``[B, N]`` (a float tensor of the same byte values, as an
    algorithm's ``.float()`` makes it, is turned back to ``uint8`` exactly first).

    >>> import gymnasium as gym
    >>> from dagrl.spaces.mixed import mixed_space
    >>> space = mixed_space(gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
    ...                                      "speed": gym.spaces.Box(-1, 1, (2,))}))
    >>> enc = MixedEncoder(space)
    >>> enc(torch.zeros(3, space.shape[0], dtype=torch.uint8)).shape, enc.features
    (torch.Size([3, 514]), 514)
    """

    def __init__(self, space: MixedBox, cnn: str = "nature"):
        super().__init__()
        self.parts = space.parts
        self.values_bytes = sum(p.stop - p.start for p in space.values)
        self.cnns = nn.ModuleDict({p.key: CNNS[cnn](p.image[0], p.image[1:]) for p in space.images})
        self.features = sum(self.cnns[p.key].features if p.image else p.size for p in space.parts)

    @property
    def values_size(self) -> int:
        """How many ``float32`` values the entries that are not images hold."""
        return self.values_bytes // FLOAT_BYTES

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """The entries that are not images, ``[B, values_size]`` ``float32``, bit for bit."""
        obs = obs.flatten(1)
        if obs.dtype != torch.uint8:
            obs = obs.to(torch.uint8)
        # the entries' bytes lead each row, on a float32 boundary: one view reads them all
        return obs[:, : self.values_bytes].contiguous().view(torch.float32)

    def forward(self, obs: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
        """The features; ``norm`` (PPO's ``norm_obs``) standardises the entries that are not images."""
        obs = obs.flatten(1)
        if obs.dtype != torch.uint8:
            obs = obs.to(torch.uint8)
        values = self.values(obs)
        if norm is not None:
            values = norm(values)
        out = []
        for p in self.parts:
            if p.image:
                out.append(self.cnns[p.key](obs[:, p.start : p.stop].reshape(-1, *p.image)))
            else:
                out.append(values[:, p.start // FLOAT_BYTES : p.stop // FLOAT_BYTES])
        return torch.cat(out, dim=-1)
