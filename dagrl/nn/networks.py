"""Building blocks shared by algorithm files: MLPs, running normalisation, twin Q networks, weights as
numpy, minibatches (the encoders are in :mod:`dagrl.nn.encoders`).

Algorithms never import each other; what two of them need alike lives here, free of Dask.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from dagrl.core.schema import Widths, widths
from dagrl.nn.encoders import CNN, encoder

Weights = dict[str, np.ndarray]


ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}
"""The hidden layers' nonlinearity by its name in a graph (``activation``)."""


def hidden_layers(
    n_in: int,
    hidden: Widths,
    activation: Callable[[], nn.Module] = nn.ReLU,
    linear: Callable[..., nn.Module] = nn.Linear,
) -> tuple[list[nn.Module], int]:
    """The hidden layers ``hidden`` names (:func:`widths`), each a ``linear(n_in, n_out)`` and its
    ``activation``, and the last one's width (``n_in`` with none)."""
    layers: list[nn.Module] = []
    for width in widths(hidden):
        layers += [linear(n_in, width), activation()]
        n_in = width
    return layers, n_in


def mlp(n_in: int, n_out: int, hidden: Widths) -> nn.Sequential:
    """ReLU hidden layers of the widths ``hidden`` names (two of ``hidden`` units for one width), then a
    linear output.

    >>> [m.out_features for m in mlp(3, 1, [400, 300]) if isinstance(m, nn.Linear)]
    [400, 300, 1]
    """
    layers, width = hidden_layers(n_in, hidden)
    return nn.Sequential(*layers, nn.Linear(width, n_out))


def obs_array(obs: np.ndarray) -> np.ndarray:
    """Observations as stored and sent: ``uint8`` images as they are, anything else as float32."""
    return obs.copy() if obs.dtype == np.uint8 else obs.astype(np.float32)


def obs_tensor(obs: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """A batch of observations for a network: ``uint8`` kept (the CNN scales it), else float32."""
    return torch.as_tensor(obs if obs.dtype == np.uint8 else obs.astype(np.float32, copy=False), device=device)


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


class TwinQ(nn.Module):
    """Two Q(s, a) heads over the observation's trunk (:func:`encoder`: flattened, or a CNN for
    images, which both heads' losses train) and the action."""

    def __init__(self, obs_space, act_space, hidden: Widths, cnn: CNN = "nature"):
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
    fields (images, :mod:`dagrl.spaces.mixed` vectors) as they are, the encoders take them so; the rest float."""
    present = [s for s in samples if s is not None]
    if not present:
        return []
    data = {k: torch.as_tensor(np.concatenate([s.data[k] for s in present]), device=device) for k in present[0].data}
    n = len(data["reward"])
    data = {k: v if v.dtype == torch.uint8 else v.float() for k, v in data.items()}
    return [{k: v[i : i + size] for k, v in data.items()} for i in range(0, n - size + 1, size)]
