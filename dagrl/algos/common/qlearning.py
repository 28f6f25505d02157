"""Q-learning that DQN and R2D2 share: DQN's hyperparameters (R2D2 extends them), the dueling head,
the sampler's and learner's states, the replay role's making, ``publish``, and the learner's gradient
steps on a sampled batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.core.context import RoleContext
from dagrl.core.fragment import fragment
from dagrl.core.schema import Widths, at_least, positive, unit_interval, widths_fit
from dagrl.nn.cuda_graphs import CapturedStep, set_capturable
from dagrl.nn.encoders import CNN
from dagrl.nn.optim import load_state
from dagrl.replay import ReplayState, Sample, Schema, replay_state
from dagrl.replay.record import Recorder
from dagrl.replay.role import pooled_weights

ACTION_SPACES = (gym.spaces.Discrete,)  # one Q-value per action


@dataclass
class Config:
    steps: int = 64
    """Env steps per env per ``collect`` call."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """Steps of reward each replay row folds before bootstrapping (Ape-X and Rainbow use 3)."""
    lr: float = 1e-3
    """Adam learning rate."""
    batch_size: int = 64
    """Transitions per gradient step."""
    gradient_steps: int = 32
    """Gradient steps per ``update`` call (per iteration under single/sync)."""
    buffer_size: int = 50_000
    """Replay capacity in transitions."""
    learning_starts: int = 1_000
    """Transitions stored before learning begins."""
    target_update: int = 100
    """Gradient steps between copies of the online network into the target network."""
    target_update_interval: int | None = None
    """Env steps between those copies (Stable-Baselines3's and the rl-zoo's name and unit), counted as the
    transitions the replay shards were given, one per env step; set, it replaces ``target_update``."""
    eps_start: float = 1.0
    """Epsilon at the start of the schedule."""
    eps_end: float = 0.05
    """Epsilon at the end of the schedule."""
    eps_steps: int = 10_000
    """Env steps of the run (all samplers together) over which epsilon decays linearly."""
    exploration_fraction: float | None = None
    """The share of the run's ``stop.env_steps`` over which epsilon decays (Stable-Baselines3's and the
    rl-zoo's name); set, it replaces ``eps_steps``."""
    double: bool = True
    """Double DQN (van Hasselt et al., 2016): the online network picks the next action, the target network
    values it; ``false``: the target network's own maximum (DQN as Mnih et al., 2015, and SB3's ``DQN``)."""
    per_sampler_epsilon: bool = False
    """Ape-X: a fixed epsilon per sampler instead of the schedule."""
    apex_eps: float = 0.4
    apex_alpha: float = 7.0
    hidden: Widths = 128
    """The hidden layers' widths of the Q-network: one width for two layers of it, or each layer's in order
    (``[400, 300]``)."""
    cnn: CNN = "nature"
    """Encoder of image observations: ``nature`` or ``impala`` (:data:`dagrl.nn.encoders.CNNS`)."""
    dueling: bool = False
    """Dueling head: a state value and action advantages, ``Q = V + A - mean(A)`` (Wang et al., 2016;
    Ape-X's network)."""
    eval_episodes: int = 10
    """Episodes per evaluation (graph ``evaluate.every``), without exploration."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    prioritized: bool = False
    """Prioritized replay (proportional, |TD error|), importance-weighted loss."""
    per_alpha: float = 0.6
    per_beta: float = 0.4
    per_beta_steps: int = 10_000
    """Sample calls over which the importance-weight exponent anneals to 1."""
    cuda_graphs: bool = False
    """Replay each gradient step of a learner on a CUDA device from a CUDA graph (no effect on the CPU,
    nor on data-parallel learner replicas, which step as written)."""

    def __post_init__(self) -> None:
        at_least(self, 1, "steps", "n_step", "batch_size", "gradient_steps", "buffer_size", "target_update", "hidden")
        widths_fit(self, "hidden")
        at_least(self, 1, "eval_episodes", "eps_steps", "per_beta_steps", "target_update_interval")
        at_least(self, 0, "learning_starts", "per_alpha")
        positive(self, "lr", "max_grad_norm")
        unit_interval(self, "gamma", "eps_start", "eps_end", "apex_eps", "per_beta")
        if self.exploration_fraction is not None and not 0 < self.exploration_fraction <= 1:
            raise ValueError(f"exploration_fraction must be in (0, 1], got {self.exploration_fraction}")

    def check_budget(self, env_steps: int | None) -> None:
        """Refuse, before any cluster starts, what the run's ``stop.env_steps`` (``None``: none) rules out."""
        if self.exploration_fraction is not None and env_steps is None:
            raise ValueError("exploration_fraction needs stop.env_steps (epsilon decays over that share of it)")

    def epsilon_steps(self, budget: int | None) -> int:
        """The env steps of the run over which epsilon decays: ``exploration_fraction`` of the run's budget
        where set, else ``eps_steps``.

        >>> Config(exploration_fraction=0.12).epsilon_steps(100_000)
        12000
        """
        if self.exploration_fraction is None or budget is None:
            return self.eps_steps
        return max(1, round(self.exploration_fraction * budget))


class DuelingHead(nn.Module):
    """Q-values from a state value and action advantages: ``Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)``
    (Wang et al., 2016); subtracting the mean makes ``V`` and ``A`` identifiable."""

    def __init__(self, width: int, actions: int):
        super().__init__()
        self.value, self.advantage = nn.Linear(width, 1), nn.Linear(width, actions)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = self.advantage(h)
        return self.value(h) + a - a.mean(dim=-1, keepdim=True)


Weights = dict[str, np.ndarray]


@dataclass
class SamplerState:
    cfg: Config
    envs: gym.vector.VectorEnv
    q: nn.Module
    rng: np.random.Generator
    obs: np.ndarray
    recorder: Recorder
    index: int
    replicas: int
    steps_done: int = 0
    eps_steps: int | None = None
    """The run's env steps over which epsilon decays (:meth:`Config.epsilon_steps`); ``None``: ``cfg.eps_steps``."""

    def epsilon(self) -> float:
        c = self.cfg
        if c.per_sampler_epsilon:
            spread = self.index / (self.replicas - 1) if self.replicas > 1 else 0.0
            return c.apex_eps ** (1 + c.apex_alpha * spread)
        # the run's env steps, as every sampler's own times their number (they step at one pace): the
        # schedule ends at eps_steps of the run whatever the sampler count, as under `single`
        decay = self.eps_steps if self.eps_steps is not None else c.eps_steps
        frac = min(1.0, self.steps_done * self.replicas / max(decay, 1))
        return c.eps_start + frac * (c.eps_end - c.eps_start)


@dataclass
class LearnerState:
    cfg: Config
    q: nn.Module
    target: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    ctx: RoleContext
    """Averages gradients over data-parallel learner replicas (``dp-learners``); else a no-op."""
    gradient_steps: int = 0
    step: CapturedStep | None = None  # one gradient step, replayed from a CUDA graph where asked
    added: dict[int, int] = field(default_factory=dict)
    """Per replay shard, the rows it had been given when it last drew for this learner."""
    copies: int = 0
    """Target copies made by ``target_update_interval`` (env steps)."""

    def state_dict(self) -> dict:
        return {
            "q": self.q.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "gradient_steps": self.gradient_steps,
            "added": dict(self.added),
            "copies": self.copies,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.q.load_state_dict(sd["q"])
        self.target.load_state_dict(sd["target"])
        load_state(self.optimizer, sd["optimizer"])
        self.gradient_steps = sd["gradient_steps"]
        self.added, self.copies = dict(sd.get("added", {})), sd.get("copies", 0)
        set_capturable(self.optimizer, self.step is not None and self.step.enabled)
        if self.step is not None:
            self.step.reset()  # the optimizer's state tensors are new ones


def replay_of(ctx: RoleContext, cfg: Config, schema: Schema) -> ReplayState:
    """A replay role's state for rows of ``schema``, sized and prioritized as ``cfg`` says (R2D2's too)."""
    return replay_state(
        ctx, schema, capacity=cfg.buffer_size, batch_size=cfg.batch_size, batches=cfg.gradient_steps,
        learning_starts=cfg.learning_starts, prioritized=cfg.prioritized, alpha=cfg.per_alpha, beta=cfg.per_beta,
        beta_steps=cfg.per_beta_steps,
    )  # fmt: skip


@fragment(role="learner")
def publish(state: LearnerState) -> Weights:
    return {k: v.detach().cpu().numpy().copy() for k, v in state.q.state_dict().items()}


def learn_from(
    state: Any, samples: list[Sample | None], step: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
) -> tuple[list[dict[str, torch.Tensor]], dict[int, tuple[np.ndarray, np.ndarray]]]:
    """``step`` on each ``batch_size`` slice of the sampled rows (their importance weights as ``weight``),
    the online network copied into the target every ``target_update`` steps (or, with
    ``target_update_interval``, at the first step after the shards' rows pass each multiple of it); the
    steps' outputs, and each row's new priority (its step's ``td``) by the shard that drew it. Nothing
    before learning starts."""
    present = [s for s in samples if s is not None]
    cfg = state.cfg
    steps = state.ctx.least_over_replicas(sum(len(s) for s in present) // cfg.batch_size)  # data-parallel: alike
    if not present or not steps:
        return [], {}
    due = state.copies
    if cfg.target_update_interval is not None:
        state.added.update({s.shard: s.added for s in present})
        due = state.ctx.least_over_replicas(sum(state.added.values())) // cfg.target_update_interval
    dev = state.device
    data = {k: torch.as_tensor(np.concatenate([s.data[k] for s in present]), device=dev) for k in present[0].data}
    data["weight"] = torch.as_tensor(pooled_weights(present), device=dev)
    outs = []
    for start in range(0, steps * cfg.batch_size, cfg.batch_size):
        outs.append(step({k: v[start : start + cfg.batch_size] for k, v in data.items()}))
        state.gradient_steps += 1
        by_env_steps = due > state.copies
        if by_env_steps or (cfg.target_update_interval is None and state.gradient_steps % cfg.target_update == 0):
            state.target.load_state_dict(state.q.state_dict())  # in place: a captured step still reads it
            state.copies = max(state.copies, due)
    td = np.zeros(len(data["weight"]), np.float64)
    if outs:  # read back from the device once, as the metrics are
        td[: len(outs) * cfg.batch_size] = torch.cat([o["td"] for o in outs]).cpu().numpy()
    priorities, at = {}, 0
    for s in present:  # by the shard that drew the rows
        priorities[s.shard] = (s.indices, td[at : at + len(s)])
        at += len(s)
    return outs, priorities
