"""Building blocks shared by algorithm files: MLPs, twin Q networks, weights as numpy, minibatches.

Algorithms never import each other; what two of them need alike lives here, free of Dask.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

Weights = dict[str, np.ndarray]


def mlp(n_in: int, n_out: int, hidden: int) -> nn.Sequential:
    """Two ReLU hidden layers of ``hidden`` units."""
    return nn.Sequential(
        nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out)
    )


class TwinQ(nn.Module):
    """Two independent Q(s, a) networks over flattened observation and action."""

    def __init__(self, obs_space, act_space, hidden: int):
        super().__init__()
        n_in = int(np.prod(obs_space.shape)) + int(np.prod(act_space.shape))
        self.q1, self.q2 = mlp(n_in, 1, hidden), mlp(n_in, 1, hidden)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs.flatten(1), act.flatten(1)], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


def to_numpy(module: nn.Module) -> Weights:
    """A module's weights as CPU numpy arrays (what crosses processes)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def as_tensors(weights: Weights, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v, device=device) for k, v in weights.items()}


def minibatches(samples: list, size: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Float tensors of every full ``size``-row slice of the sampled rows (``None`` samples skipped)."""
    present = [s for s in samples if s is not None]
    if not present:
        return []
    data = {k: torch.as_tensor(np.concatenate([s.data[k] for s in present]), device=device) for k in present[0].data}
    n = len(data["reward"])
    return [{k: v[i : i + size].float() for k, v in data.items()} for i in range(0, n - size + 1, size)]
