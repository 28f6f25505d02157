"""Double DQN with a target network and an epsilon schedule, as fragments over a replay role.

Samplers act epsilon-greedily with the weights they were given and return transitions; the replay
role stores them (``dagrl.replay.role``); the learner samples and makes ``gradient_steps`` updates.
With ``per_sampler_epsilon`` every sampler keeps a fixed epsilon of its own, as in Ape-X:
``eps_i = apex_eps ** (1 + apex_alpha * i / (N - 1))``. With ``n_step`` > 1 the samplers fold n steps
of reward into each row (:class:`dagrl.replay.record.Recorder`), and the learner bootstraps with the
discount the row carries, as Ape-X's and Rainbow's multi-step targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.core.context import RoleContext
from dagrl.core.fragment import evaluation, fragment, iteration, role
from dagrl.core.schema import at_least, positive, unit_interval
from dagrl.envs.mixed import MixedBox
from dagrl.nn.cuda_graphs import CapturedStep, set_capturable, step_means, wants_graphs
from dagrl.nn.networks import CNN, encoder, is_image
from dagrl.replay import ReplayState, Sample, Schema, Transitions, replay_state
from dagrl.replay.record import Recorder
from dagrl.replay.role import UpdateResult, add, pooled_weights, reprioritize, sample, shard_draws

ACTION_SPACES = (gym.spaces.Discrete,)  # one Q-value per action

# ---------------------------------------------------------------------------------------------------
# Hyperparameters
# ---------------------------------------------------------------------------------------------------


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
    eps_start: float = 1.0
    """Epsilon at the start of the schedule."""
    eps_end: float = 0.05
    """Epsilon at the end of the schedule."""
    eps_steps: int = 10_000
    """Env steps (per sampler) over which epsilon decays linearly."""
    per_sampler_epsilon: bool = False
    """Ape-X: a fixed epsilon per sampler instead of the schedule."""
    apex_eps: float = 0.4
    apex_alpha: float = 7.0
    hidden: int = 128
    """Width of the two hidden layers."""
    cnn: CNN = "nature"
    """Encoder of image observations: ``nature`` or ``impala`` (:data:`dagrl.nn.networks.CNNS`)."""
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
        at_least(self, 1, "eval_episodes", "eps_steps", "per_beta_steps")
        at_least(self, 0, "learning_starts", "per_alpha")
        positive(self, "lr", "max_grad_norm")
        unit_interval(self, "gamma", "eps_start", "eps_end", "apex_eps", "per_beta")


# ---------------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------------


def q_network(
    obs_space: gym.Space, act_space: gym.Space, hidden: int, dueling: bool = False, cnn: CNN = "nature"
) -> nn.Module:
    """An MLP over vector observations; over ``uint8`` images the CNN ``cnn`` names; then one linear layer,
    or with ``dueling`` a :class:`DuelingHead`.

    >>> q = q_network(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), 16, dueling=True)
    >>> x = torch.randn(5, 4)
    >>> torch.allclose(q(x).mean(-1), q[-1].value(q[:-1](x)).squeeze(-1), atol=1e-6)  # mean Q is V
    True
    """
    if not isinstance(act_space, gym.spaces.Discrete):
        raise TypeError(f"DQN needs a discrete action space, got {act_space}")
    n = int(act_space.n)
    if is_image(obs_space):
        trunk, width = encoder(obs_space, hidden, cnn)
        return nn.Sequential(trunk, DuelingHead(width, n) if dueling else nn.Linear(width, n))
    if isinstance(obs_space, MixedBox):  # a Dict holding images: their CNNs and the rest, then a layer
        trunk, width = encoder(obs_space, hidden, cnn)
        head = DuelingHead(hidden, n) if dueling else nn.Linear(hidden, n)
        return nn.Sequential(trunk, nn.Linear(width, hidden), nn.ReLU(), head)
    n_obs = int(np.prod(obs_space.shape))
    return nn.Sequential(
        nn.Flatten(), nn.Linear(n_obs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        DuelingHead(hidden, n) if dueling else nn.Linear(hidden, n),
    )  # fmt: skip


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

# ---------------------------------------------------------------------------------------------------
# Role states
# ---------------------------------------------------------------------------------------------------


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

    def epsilon(self) -> float:
        c = self.cfg
        if c.per_sampler_epsilon:
            spread = self.index / (self.replicas - 1) if self.replicas > 1 else 0.0
            return c.apex_eps ** (1 + c.apex_alpha * spread)
        frac = min(1.0, self.steps_done / max(c.eps_steps, 1))
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

    def state_dict(self) -> dict:
        return {
            "q": self.q.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "gradient_steps": self.gradient_steps,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.q.load_state_dict(sd["q"])
        self.target.load_state_dict(sd["target"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.gradient_steps = sd["gradient_steps"]
        set_capturable(self.optimizer, self.step is not None and self.step.enabled)
        if self.step is not None:
            self.step.reset()  # the optimizer's state tensors are new ones


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs = ctx.make_envs()
    obs, _ = envs.reset(seed=[ctx.seed + i for i in range(envs.num_envs)])
    with torch.random.fork_rng():
        torch.manual_seed(ctx.seed)
        q = q_network(envs.single_observation_space, envs.single_action_space, cfg.hidden, cfg.dueling, cfg.cnn)
    rng = np.random.default_rng(ctx.seed)
    done = ctx.per_replica(ctx.env_steps)  # a resumed run or a replacement: epsilon as the run has got to
    recorder = Recorder(envs.num_envs, cfg.n_step, cfg.gamma)
    return SamplerState(cfg, envs, q, rng, obs, recorder, ctx.index, ctx.replicas, done)


@role("replay", many=True)
def replay(ctx: RoleContext, cfg: Config) -> ReplayState:
    return replay_of(ctx, cfg, Schema.transitions(ctx.observation_space, ctx.action_space, cfg.n_step))


def replay_of(ctx: RoleContext, cfg: Config, schema: Schema) -> ReplayState:
    """A replay role's state for rows of ``schema``, sized and prioritized as ``cfg`` says (R2D2's too)."""
    return replay_state(
        ctx, schema, capacity=cfg.buffer_size, batch_size=cfg.batch_size, batches=cfg.gradient_steps,
        learning_starts=cfg.learning_starts, prioritized=cfg.prioritized, alpha=cfg.per_alpha, beta=cfg.per_beta,
        beta_steps=cfg.per_beta_steps,
    )  # fmt: skip


@role("learner")
def learner(ctx: RoleContext, cfg: Config) -> LearnerState:
    device = torch.device(ctx.device)
    with torch.random.fork_rng():
        torch.manual_seed(ctx.seed)
        q = q_network(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.dueling, cfg.cnn).to(device)
        target = q_network(ctx.observation_space, ctx.action_space, cfg.hidden, cfg.dueling, cfg.cnn).to(device)
    target.load_state_dict(q.state_dict())
    graphs = wants_graphs(cfg.cuda_graphs, device) and ctx.replicas == 1  # no all-reduce inside a graph
    optimizer = torch.optim.Adam(q.parameters(), lr=cfg.lr, capturable=graphs)
    state = LearnerState(cfg, q, target, optimizer, device, ctx)
    state.step = CapturedStep(partial(learner_step, state), device, enabled=graphs)
    return state


@role("evaluator", recover="replace")
def evaluator(ctx: RoleContext, cfg: Config) -> EpisodeRunner:
    envs = ctx.make_envs()
    q = q_network(envs.single_observation_space, envs.single_action_space, cfg.hidden, cfg.dueling, cfg.cnn)
    return EpisodeRunner(envs, q, ctx.seed, cfg.eval_episodes)


# ---------------------------------------------------------------------------------------------------
# Fragments
# ---------------------------------------------------------------------------------------------------


@fragment(role="learner")
def publish(state: LearnerState) -> Weights:
    return {k: v.detach().cpu().numpy().copy() for k, v in state.q.state_dict().items()}


@fragment(role="sampler")
def collect(state: SamplerState, weights: Weights) -> Transitions:
    """``steps`` epsilon-greedy steps of every env; ``next_obs`` is the true last observation."""
    envs, n = state.envs, state.envs.num_envs
    state.q.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    for _ in range(state.cfg.steps):
        with torch.no_grad():
            greedy = state.q(torch.as_tensor(state.obs, dtype=torch.float32)).argmax(1).numpy()
        explore = state.rng.random(n) < state.epsilon()
        action = np.where(explore, state.rng.integers(0, envs.single_action_space.n, n), greedy)
        state.obs = state.recorder.step(envs, state.obs, action)
        state.steps_done += n
    return state.recorder.take(envs)


def learner_step(state: LearnerState, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One Double-DQN gradient step on batch ``b`` (``b["weight"]``: importance weights); returns the
    loss, the mean Q and |TD error| per row."""
    cfg = state.cfg
    with torch.no_grad():
        next_action = state.q(b["next_obs"].float()).argmax(1, keepdim=True)
        next_q = state.target(b["next_obs"].float()).gather(1, next_action).squeeze(1)
        discount = b.get("discount", cfg.gamma)  # n-step rows carry theirs
        target = b["reward"] + discount * (1.0 - b["terminated"].float()) * next_q
    q = state.q(b["obs"].float()).gather(1, b["action"].long().unsqueeze(1)).squeeze(1)
    loss = (b["weight"] * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
    state.optimizer.zero_grad()
    loss.backward()
    state.ctx.average_gradients(state.q.parameters())
    nn.utils.clip_grad_norm_(state.q.parameters(), cfg.max_grad_norm)
    state.optimizer.step()
    return {"loss": loss.detach(), "q_mean": q.detach().mean(), "td": (q - target).detach().abs()}


@fragment(role="learner")
def update(state: LearnerState, samples: list[Sample | None]) -> UpdateResult:
    """Double-DQN steps on each ``batch_size`` slice of the sampled rows (none until learning starts);
    returns |TD error| per sampled row and shard, for prioritized replay, and each shard's next draw."""
    outs, priorities = learn_from(state, samples, state.step)
    if not priorities:  # nothing sampled yet
        return UpdateResult({"perf/frames": 0.0})
    metrics = {
        **step_means(outs, {"losses/td": "loss", "losses/q_mean": "q_mean"}, missing=float("nan")),
        "perf/frames": float(len(outs) * state.cfg.batch_size),
    }
    return UpdateResult(metrics, priorities, shard_draws(samples))


def learn_from(
    state: Any, samples: list[Sample | None], step: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
) -> tuple[list[dict[str, torch.Tensor]], dict[int, tuple[np.ndarray, np.ndarray]]]:
    """``step`` on each ``batch_size`` slice of the sampled rows (their importance weights as ``weight``),
    the online network copied into the target every ``target_update`` steps; the steps' outputs, and
    each row's new priority (its step's ``td``) by the shard that drew it. Nothing before learning starts."""
    present = [s for s in samples if s is not None]
    if not present:
        return [], {}
    cfg, dev = state.cfg, state.device
    data = {k: torch.as_tensor(np.concatenate([s.data[k] for s in present]), device=dev) for k in present[0].data}
    data["weight"] = torch.as_tensor(pooled_weights(present), device=dev)
    outs = []
    for start in range(0, len(data["weight"]) - cfg.batch_size + 1, cfg.batch_size):
        outs.append(step({k: v[start : start + cfg.batch_size] for k, v in data.items()}))
        state.gradient_steps += 1
        if state.gradient_steps % cfg.target_update == 0:
            state.target.load_state_dict(state.q.state_dict())  # in place: a captured step still reads it
    td = np.zeros(len(data["weight"]), np.float64)
    if outs:  # read back from the device once, as the metrics are
        td[: len(outs) * cfg.batch_size] = torch.cat([o["td"] for o in outs]).cpu().numpy()
    priorities, at = {}, 0
    for s in present:  # by the shard that drew the rows
        priorities[s.shard] = (s.indices, td[at : at + len(s)])
        at += len(s)
    return outs, priorities


# ---------------------------------------------------------------------------------------------------
# One training iteration
# ---------------------------------------------------------------------------------------------------


@fragment(role="evaluator")
def evaluate(state: EpisodeRunner, weights: Weights) -> dict[str, float]:
    """``eval_episodes`` whole episodes acting greedily (no exploration)."""
    state.net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    return state.run(lambda obs: state.net(obs).argmax(1))


@evaluation
def eval_iteration():
    return evaluate(publish())


@iteration
def train_iteration():
    weights = publish()
    transitions = collect(weights)
    stored = add(transitions)
    return reprioritize(update(sample(stored)))
