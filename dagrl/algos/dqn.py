"""Double DQN with a target network and an epsilon schedule, as fragments over a replay role.

Samplers act epsilon-greedily with the weights they were given and return transitions; the replay
role stores them (``dagrl.replay.role``); the learner samples and makes ``gradient_steps`` updates.
With ``per_sampler_epsilon`` every sampler keeps a fixed epsilon of its own, as in Ape-X:
``eps_i = apex_eps ** (1 + apex_alpha * i / (N - 1))``. With ``n_step`` > 1 the samplers fold n steps
of reward into each row (:class:`dagrl.replay.record.Recorder`), and the learner bootstraps with the
discount the row carries, as Ape-X's and Rainbow's multi-step targets.
"""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.algos.common.qlearning import (
    ACTION_SPACES,
    Config,
    DuelingHead,
    LearnerState,
    SamplerState,
    Weights,
    learn_from,
    publish,
    replay_of,
)
from dagrl.core.context import RoleContext
from dagrl.core.fragment import Manifest, evaluation, fragment, iteration, role
from dagrl.nn.cuda_graphs import CapturedStep, step_means, wants_graphs
from dagrl.nn.encoders import CNN, encoder
from dagrl.nn.networks import Widths, hidden_layers
from dagrl.replay import ReplayState, Sample, Schema, Transitions
from dagrl.replay.record import Recorder
from dagrl.replay.role import UpdateResult, add, reprioritize, sample, shard_draws
from dagrl.spaces.images import is_image
from dagrl.spaces.mixed import MixedBox

__all__ = [
    "ALGORITHM",  # what DQN shares with R2D2 (its Config, publish, the states) is in algos.common.qlearning
    "ACTION_SPACES", "Config", "collect", "eval_iteration", "evaluate", "evaluator", "learner", "publish",
    "replay", "sampler", "train_iteration", "update",
]  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# Hyperparameters
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------------


def q_network(
    obs_space: gym.Space, act_space: gym.Space, hidden: Widths, dueling: bool = False, cnn: CNN = "nature"
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
    if isinstance(obs_space, MixedBox):  # a Dict holding images: their CNNs and the rest, then one layer
        trunk, width = encoder(obs_space, hidden, cnn)
        layers, width = hidden_layers(width, (hidden,) if isinstance(hidden, int) else hidden)
    else:
        trunk, (layers, width) = nn.Flatten(), hidden_layers(int(np.prod(obs_space.shape)), hidden)
    return nn.Sequential(trunk, *layers, DuelingHead(width, n) if dueling else nn.Linear(width, n))


# ---------------------------------------------------------------------------------------------------
# Role states
# ---------------------------------------------------------------------------------------------------


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs, obs, _ = ctx.start_envs()
    with ctx.seeded():
        q = q_network(envs.single_observation_space, envs.single_action_space, cfg.hidden, cfg.dueling, cfg.cnn)
    rng = np.random.default_rng(ctx.seed)
    done = ctx.per_replica(ctx.env_steps)  # a resumed run or a replacement: epsilon as the run has got to
    recorder = Recorder(envs.num_envs, cfg.n_step, cfg.gamma)
    decay = cfg.epsilon_steps(ctx.env_steps_budget)
    return SamplerState(cfg, envs, q, rng, obs, recorder, ctx.index, ctx.replicas, done, decay)


@role("replay", many=True)
def replay(ctx: RoleContext, cfg: Config) -> ReplayState:
    return replay_of(ctx, cfg, Schema.transitions(ctx.observation_space, ctx.action_space, cfg.n_step))


@role("learner")
def learner(ctx: RoleContext, cfg: Config) -> LearnerState:
    device = torch.device(ctx.device)
    with ctx.seeded():
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
    return EpisodeRunner(envs, q, ctx.seed, cfg.eval_episodes, epsilon=cfg.eps_end)


# ---------------------------------------------------------------------------------------------------
# Fragments
# ---------------------------------------------------------------------------------------------------


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
    """One Double-DQN (``double: false``: DQN) gradient step on batch ``b`` (``b["weight"]``: importance
    weights); returns the loss, the mean Q and |TD error| per row."""
    cfg = state.cfg
    with torch.no_grad():
        target_q = state.target(b["next_obs"].float())
        if cfg.double:  # the online network chooses, the target network values
            next_q = target_q.gather(1, state.q(b["next_obs"].float()).argmax(1, keepdim=True)).squeeze(1)
        else:
            next_q = target_q.max(1).values
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


# ---------------------------------------------------------------------------------------------------
# One training iteration
# ---------------------------------------------------------------------------------------------------


@fragment(role="evaluator")
def evaluate(state: EpisodeRunner, weights: Weights) -> dict[str, float]:
    """``eval_episodes`` whole episodes acting greedily (no exploration; or epsilon-greedily with the
    schedule's last epsilon, see :attr:`EpisodeRunner.deterministic`)."""
    state.net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    return state.run(state.pick(lambda obs: state.net(obs).argmax(1)))


@evaluation
def eval_iteration():
    return evaluate(publish())


@iteration
def train_iteration():
    weights = publish()
    transitions = collect(weights)
    stored = add(transitions)
    return reprioritize(update(sample(stored)))


ALGORITHM = Manifest(
    config=Config,
    roles=[sampler, replay, learner, evaluator],
    iteration=train_iteration,
    evaluation=eval_iteration,
    action_spaces=ACTION_SPACES,
)
