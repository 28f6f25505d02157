"""PPO with a recurrent policy: an LSTM between the encoder and the heads, as fragments.

For tasks one observation does not reveal (a velocity left out, a screen that flickers, a cue shown
once): the policy carries a state from step to step instead of being handed a stack of frames.
Samplers keep each env's LSTM state across rollouts, zeroed where an episode starts. A rollout
carries the state its envs began it with and where episodes started; the learner unrolls the LSTM
from there over whole env sequences (truncated back-propagation through ``num_steps`` steps), so a
minibatch holds ``minibatch_size // num_steps`` env sequences rather than shuffled transitions. This
is the scheme of CleanRL's ``ppo_atari_lstm`` and SB3-contrib's ``RecurrentPPO``.

The heads are PPO's (:class:`~dagrl.algos.common.actor_critic.ActorCritic` over the LSTM's output), and so are the
loss, the epochs, ``anneal_lr``, ``norm_obs`` and ``norm_reward``. Under ``central-inference`` the
``inference`` role keeps no state: each request carries its envs' LSTM state beside the observations, and
the answer the state after the step (SEED RL keeps it on the server instead; here it is ``2 x lstm``
``float32`` values an env and step on the sampler's socket).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dagrl.algos.common.actor_critic import Config as ActorCriticConfig
from dagrl.algos.common.actor_critic import LearnerState, Metrics, end_update, start_update
from dagrl.algos.common.epochs import clipped_loss, proximal, train_epochs
from dagrl.algos.common.recurrent import (  # the recurrent actor-critic, its roles, publish, collect, evaluate
    ACTION_SPACES,
    Acting,
    LSTMCore,
    Prefix,
    Recurrent,
    RecurrentActorCritic,
    RecurrentRollout,
    Sequences,
    collect,
    eval_iteration,
    evaluate,
    evaluator,
    inference,
    learner,
    publish,
    sampler,
)
from dagrl.algos.common.rollouts import gae
from dagrl.core.fragment import Manifest, fragment, iteration

__all__ = [
    "ALGORITHM", "Acting", "Config", "LSTMCore", "Prefix", "Recurrent", "RecurrentActorCritic", "Sequences",
    "collect", "eval_iteration", "evaluate", "publish", "train_iteration", "update",
]  # fmt: skip

# ---------------------------------------------------------------------------------------------------
# Hyperparameters
# ---------------------------------------------------------------------------------------------------


@dataclass
class Config(Recurrent, ActorCriticConfig):
    def __post_init__(self) -> None:
        super().__post_init__()
        if self.minibatch_size < self.num_steps:
            raise ValueError(
                f"minibatch_size {self.minibatch_size} < num_steps {self.num_steps}: a minibatch holds whole "
                "env sequences of num_steps steps"
            )


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# Data between fragments
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# Role states
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# Fragments
# ---------------------------------------------------------------------------------------------------


@fragment(role="learner")
def update(state: LearnerState, rollouts: list[RecurrentRollout]) -> Metrics:
    """Clipped-PPO epochs over whole env sequences, the LSTM unrolled from each sequence's first state;
    advantages from the current critic."""
    cfg, agent, dev = state.cfg, state.agent, state.device
    heads = agent.heads
    seq = Sequences.of(rollouts, dev, agent)
    obs, starts, (h0, c0) = seq.obs, seq.starts, seq.state
    actions = torch.as_tensor(np.concatenate([r.actions for r in rollouts], 1), device=dev)
    logprobs = torch.as_tensor(np.concatenate([r.logprobs for r in rollouts], 1), device=dev)
    T, N = starts.shape
    with torch.no_grad():
        values, last = (v.cpu().numpy() for v in seq.values(agent)[1:])
    rewards = agent.scaled_rewards(np.concatenate([r.rewards for r in rollouts], 1))
    dones = np.concatenate([r.dones for r in rollouts], 1)
    adv = gae(rewards, values, dones, last, cfg.gamma, cfg.gae_lambda)
    advantages, returns = torch.as_tensor(adv, device=dev), torch.as_tensor(adv + values, device=dev)
    seqs = min(max(1, cfg.minibatch_size // T), N)

    def logprobs_of(s: slice) -> torch.Tensor:  # [T, sequences s], each unrolled from its first state
        out, _ = agent.unroll(obs[:, s], (h0[:, s], c0[:, s]), starts[:, s])
        dist = heads.dist(out.reshape(-1, out.shape[-1]))
        return dist.log_prob(actions[:, s].reshape(-1, *actions.shape[2:])).reshape(T, -1)

    prox, stale = proximal(cfg, N, seqs, logprobs_of, logprobs)

    def loss_of(idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out, _ = agent.unroll(obs[:, idx], (h0[:, idx], c0[:, idx]), starts[:, idx])
        dist, value = heads.dist_value(out.reshape(T * len(idx), -1))
        act = actions[:, idx].reshape(T * len(idx), *actions.shape[2:])
        old, adv, ret = (x[:, idx].reshape(-1) for x in (logprobs, advantages, returns))
        p = None if prox is None else prox[:, idx].reshape(-1)
        return clipped_loss(cfg, dist, value, act, old, adv, ret, p)

    lr = start_update(state)
    metrics, steps = train_epochs(state, N, seqs, loss_of)
    metrics.update(stale)
    flat_obs = obs.reshape(T * N, *obs.shape[2:])
    agent.fold_statistics(flat_obs, [r.disc_returns for r in rollouts], state.ctx.sum_over_replicas)
    end_update(state, metrics, lr, sum(r.env_steps for r in rollouts))
    metrics["perf/frames"] = float(steps * seqs * T)
    return metrics


# ---------------------------------------------------------------------------------------------------
# One training iteration
# ---------------------------------------------------------------------------------------------------


@iteration
def train_iteration():
    weights = publish()
    rollouts = collect(weights)
    return update(rollouts)


ALGORITHM = Manifest(
    config=Config,
    roles=[sampler, learner, evaluator, inference],
    iteration=train_iteration,
    evaluation=eval_iteration,
    action_spaces=ACTION_SPACES,
)
