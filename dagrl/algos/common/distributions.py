"""Action distributions the built-in policies sample from: one categorical per entry of a
``MultiDiscrete`` or ``MultiBinary`` action."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch


def action_heads(space: gym.Space) -> list[int] | None:
    """The number of choices of each entry of a ``MultiDiscrete`` or ``MultiBinary`` space, else ``None``."""
    if isinstance(space, gym.spaces.MultiDiscrete):
        if np.any(space.start != 0):
            raise ValueError(f"{space}: MultiDiscrete with a start other than 0 is not supported")
        return [int(n) for n in space.nvec.ravel()]
    if isinstance(space, gym.spaces.MultiBinary):
        return [2] * int(np.prod(space.shape))
    return None


class MultiCategorical:
    """Independent categorical heads over one logits vector split ``heads`` ways (torch has no such
    distribution): log-prob and entropy are the heads' sums. Actions are ``[..., len(heads)]``.

    >>> d = MultiCategorical(torch.zeros(1, 5), [2, 3])
    >>> d.log_prob(torch.tensor([[1, 2]])).exp()  # 1/2 x 1/3
    tensor([0.1667])
    """

    def __init__(self, logits: torch.Tensor, heads: list[int]):
        self.logits = [h - h.logsumexp(-1, keepdim=True) for h in logits.split(heads, -1)]  # as Categorical

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        action = action.long().reshape(*action.shape[:-1], len(self.logits))
        logps = [h.gather(-1, action[..., i : i + 1]).squeeze(-1) for i, h in enumerate(self.logits)]
        return torch.stack(logps, -1).sum(-1)

    def entropy(self) -> torch.Tensor:
        return torch.stack([-(h.exp() * h).sum(-1) for h in self.logits], -1).sum(-1)

    def sample(self, gen: torch.Generator) -> torch.Tensor:
        flat = [h.reshape(-1, h.shape[-1]) for h in self.logits]
        draws = [torch.multinomial(h.exp(), 1, generator=gen) for h in flat]
        return torch.cat(draws, -1).reshape(*self.logits[0].shape[:-1], len(self.logits))
