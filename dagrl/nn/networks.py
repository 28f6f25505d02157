"""Building blocks shared by algorithm files: encoders (MLP, Nature CNN, IMPALA's residual CNN), image
augmentation, running normalisation, twin Q networks, weights as numpy, minibatches.

Algorithms never import each other; what two of them need alike lives here, free of Dask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

Weights = dict[str, np.ndarray]


def mlp(n_in: int, n_out: int, hidden: int) -> nn.Sequential:
    """Two ReLU hidden layers of ``hidden`` units."""
    return nn.Sequential(
        nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out)
    )


MIN_IMAGE_SIDE = 36
"""The smallest height and width :class:`NatureCNN`'s three convolutions take."""


def is_image(space) -> bool:
    """A ``uint8`` observation of shape ``(C, H, W)`` (stacked frames first, as gymnasium's
    ``FrameStackObservation`` of 84x84 grayscale frames gives ``(4, 84, 84)``), at least
    :data:`MIN_IMAGE_SIDE` pixels high and wide. (Channels-last images and stacks of frames are made
    such an image where envs are made: :mod:`dagrl.envs.images`.)"""
    shape = tuple(getattr(space, "shape", ()) or ())
    return len(shape) == 3 and np.dtype(space.dtype) == np.uint8 and min(shape[1:]) >= MIN_IMAGE_SIDE


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


def obs_array(obs: np.ndarray) -> np.ndarray:
    """Observations as stored and sent: ``uint8`` images as they are, anything else as float32."""
    return obs.copy() if obs.dtype == np.uint8 else obs.astype(np.float32)


def obs_tensor(obs: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """A batch of observations for a network: ``uint8`` kept (the CNN scales it), else float32."""
    return torch.as_tensor(obs if obs.dtype == np.uint8 else obs.astype(np.float32, copy=False), device=device)


def encoder(space, hidden: int, cnn: CNN = "nature") -> tuple[nn.Module, int]:
    """The trunk for an observation space and its output width: the CNN named ``cnn`` (:data:`CNNS`)
    for images (:func:`is_image`), one per image and the rest as it is for a ``Dict`` holding images
    (:class:`dagrl.envs.mixed.MixedEncoder`), else ``nn.Flatten`` (the algorithm's own MLP follows)."""
    from dagrl.envs.mixed import MixedBox, MixedEncoder

    if cnn not in CNNS:
        raise ValueError(f"cnn must be one of {', '.join(CNNS)}, got {cnn!r}")
    if isinstance(space, MixedBox):
        mixed = MixedEncoder(space, cnn)
        return mixed, mixed.features
    if is_image(space):
        net = CNNS[cnn](space.shape[0], tuple(space.shape[1:]))
        return net, net.features
    return nn.Flatten(), int(np.prod(space.shape))


class RunningNorm(nn.Module):
    """Running mean and variance of everything passed to :meth:`update`; calling it standardises.

    The statistics are buffers, so they are part of ``state_dict()``: they travel with the published
    weights to samplers and evaluators and are saved in the learner's checkpoint. Batches are merged
    with the parallel-variance formula (Chan et al., 1979) in float64.

    >>> norm = RunningNorm((2,))
    >>> norm.update(torch.tensor([[1.0, 10.0], [3.0, 30.0]]))
    >>> [round(v, 3) for v in norm.mean.tolist()], [round(v, 1) for v in norm.var.tolist()]
    ([2.0, 20.0], [1.0, 100.0])
    >>> norm(torch.tensor([[3.0, 30.0]])).tolist()
    [[1.0, 1.0]]
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(0.0, dtype=torch.float64))
        self.clip, self.eps = clip, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var + self.eps).to(x.dtype)
        return z.clamp(-self.clip, self.clip)

    def std(self) -> float:
        """The standard deviation of a scalar statistic (reward scaling)."""
        return float(torch.sqrt(self.var + self.eps))

    @torch.no_grad()
    def update(self, batch: torch.Tensor, reduce: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """Fold ``batch`` (rows of this norm's shape) into the statistics.

        ``reduce`` sums the batch's moments over data-parallel replicas (``RoleContext.sum_over_replicas``),
        so every replica folds in the same numbers and their statistics stay identical.
        """
        x = batch.detach().reshape(-1, *self.mean.shape).to("cpu", torch.float64).numpy()
        moments = np.concatenate([[len(x)], x.sum(0).ravel(), (x * x).sum(0).ravel()])
        if reduce is not None:
            moments = reduce(moments)
        k = self.mean.numel()
        n, total, squares = moments[0], moments[1 : 1 + k], moments[1 + k :]
        if n == 0:
            return
        b_mean = total / n
        b_var = np.maximum(squares / n - b_mean**2, 0.0)
        mean, var, count = self.mean.cpu().numpy().ravel(), self.var.cpu().numpy().ravel(), float(self.count)
        new = count + n
        delta = b_mean - mean
        merged_mean = mean + delta * n / new
        merged_var = (var * count + b_var * n + delta**2 * count * n / new) / new
        self.mean.copy_(torch.from_numpy(merged_mean.reshape(self.mean.shape)))
        self.var.copy_(torch.from_numpy(merged_var.reshape(self.var.shape)))
        self.count.fill_(new)


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
    from dagrl.envs.mixed import MixedBox

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

    :attr:`parts` are ``(start, stop, (C, H, W))`` of each image in a :mod:`dagrl.envs.mixed` vector:
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
    from dagrl.envs.mixed import MixedBox

    check_shift(pad, space)
    if isinstance(space, MixedBox):
        return Shift(pad, tuple((p.start, p.stop, p.image) for p in space.images))
    return Shift(pad)


class TwinQ(nn.Module):
    """Two Q(s, a) heads over the observation's trunk (:func:`encoder`: flattened, or a CNN for
    images, which both heads' losses train) and the action."""

    def __init__(self, obs_space, act_space, hidden: int, cnn: CNN = "nature"):
        super().__init__()
        self.trunk, n_obs = encoder(obs_space, hidden, cnn)
        n_in = n_obs + int(np.prod(act_space.shape))
        self.q1, self.q2 = mlp(n_in, 1, hidden), mlp(n_in, 1, hidden)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(self.trunk(obs), act)

    def heads(self, features: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both Q values from the trunk's ``features``."""
        x = torch.cat([features, act.flatten(1)], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


def to_numpy(module: nn.Module) -> Weights:
    """A module's weights as CPU numpy arrays (what crosses processes)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def as_tensors(weights: Weights, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v, device=device) for k, v in weights.items()}


def minibatches(samples: list, size: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Tensors of every full ``size``-row slice of the sampled rows (``None`` samples skipped): ``uint8``
    fields (images, :mod:`dagrl.envs.mixed` vectors) as they are, the encoders take them so; the rest float."""
    present = [s for s in samples if s is not None]
    if not present:
        return []
    data = {k: torch.as_tensor(np.concatenate([s.data[k] for s in present]), device=device) for k in present[0].data}
    n = len(data["reward"])
    data = {k: v if v.dtype == torch.uint8 else v.float() for k, v in data.items()}
    return [{k: v[i : i + size] for k, v in data.items()} for i in range(0, n - size + 1, size)]
