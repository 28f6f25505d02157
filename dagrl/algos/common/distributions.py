"""Action distributions the built-in learners train through: a categorical, and one categorical per
entry of a ``MultiDiscrete`` or ``MultiBinary`` action."""

from __future__ import annotations

from typing import Protocol

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


class ActionDist(Protocol):
    """What a learner asks of an action distribution: torch's (a Gaussian), :class:`Categorical` or
    :class:`MultiCategorical`."""

    def log_prob(self, action: torch.Tensor) -> torch.Tensor: ...

    def entropy(self) -> torch.Tensor: ...


class Categorical:
    """A categorical over ``logits``, reduced to what a learner calls: ``log_prob``, ``entropy`` and
    ``probs``. torch's ``Categorical``, built once per minibatch, normalises with ``logsumexp`` (two
    operations, each with its backward) and sets up its shapes through ``Distribution``: on a small
    network a measurable share of a CPU gradient step. Here the logits are normalised with
    ``log_softmax`` (one operation, one backward), as the samplers do when they draw actions
    (:meth:`~dagrl.algos.common.actor_critic.ActorCritic.sample`), so the learner's log-probs of the
    behaviour actions match the samplers' bit for bit.

    >>> d = Categorical(torch.zeros(1, 4))
    >>> d.log_prob(torch.tensor([2])).exp(), d.entropy()  # 1/4; ln 4
    (tensor([0.2500]), tensor([1.3863]))
    """

    def __init__(self, logits: torch.Tensor):
        self.logits = torch.log_softmax(logits, -1)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        return self.logits.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    @property
    def probs(self) -> torch.Tensor:
        return self.logits.exp()

    def entropy(self) -> torch.Tensor:
        logits = self.logits.clamp(min=torch.finfo(self.logits.dtype).min)  # -inf logits: 0 x -inf is not 0
        return -(logits * self.probs).sum(-1)


class MultiCategorical:
    """Independent categorical heads over one logits vector split ``heads`` ways (torch has no such
    distribution): log-prob and entropy are the heads' sums. Actions are ``[..., len(heads)]``.

    >>> d = MultiCategorical(torch.zeros(1, 5), [2, 3])
    >>> d.log_prob(torch.tensor([[1, 2]])).exp()  # 1/2 x 1/3
    tensor([0.1667])
    """

    def __init__(self, logits: torch.Tensor, heads: list[int]):
        self.logits = [torch.log_softmax(h, -1) for h in logits.split(heads, -1)]  # as Categorical

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
