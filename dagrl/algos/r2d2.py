"""R2D2 (Kapturowski et al., 2019): DQN with an LSTM, learning from replayed sequences, as fragments.

Samplers act epsilon-greedily with a recurrent Q-network (:class:`RecurrentQ`: the encoder and LSTM of
``ppo_lstm``, then a Q head), each env's LSTM state carried from step to step, and cut each env's
episodes into overlapping fixed-length sequences (:class:`~dagrl.replay.sequences.SequenceRecorder`)
that carry the LSTM state they began from; the replay role stores sequences as its rows. The learner
rebuilds each sequence's first state by unrolling its ``burn_in`` steps without gradients from the
stored state (both networks), then takes n-step Double-DQN targets along the sequence with the value
rescaling ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x``, and gives each sequence the priority
``eta max|delta| + (1 - eta) mean|delta|``. The iteration is DQN's, so it runs where DQN runs: ``single``,
``sync``, ``apex`` (with Ape-X's per-sampler epsilons, ``per_sampler_epsilon``) and ``dp-learners``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.algos.common import qlearning
from dagrl.algos.common.evaluation import EpisodeRunner
from dagrl.algos.common.qlearning import ACTION_SPACES, DuelingHead, Weights, publish
from dagrl.algos.common.recurrent import LSTMCore, State, evaluate
from dagrl.core.context import RoleContext
from dagrl.core.fragment import Manifest, evaluation, fragment, iteration, role
from dagrl.core.schema import at_least, unit_interval
from dagrl.nn.cuda_graphs import step_means
from dagrl.nn.networks import obs_tensor
from dagrl.replay import ReplayState, Sample
from dagrl.replay.role import Transitions, UpdateResult, add, reprioritize, sample, shard_draws
from dagrl.replay.sequences import SequenceRecorder, sequence_schema

__all__ = [
    "ALGORITHM",
    "ACTION_SPACES", "Config", "RecurrentQ", "collect", "evaluate", "evaluator", "learner", "publish",
    "replay", "rescale", "sampler", "targets", "train_iteration", "unrescale", "update",
]  # fmt: skip

# ---------------------------------------------------------------------------------------------------
# Hyperparameters
# ---------------------------------------------------------------------------------------------------


@dataclass
class Config(qlearning.Config):
    """DQN's hyperparameters (``batch_size``, ``buffer_size`` and ``learning_starts`` count sequences),
    and the sequences'."""

    lstm: int = 64
    """Width of the LSTM's state (its hidden and its cell vectors each)."""
    seq_len: int = 20
    """Steps of a sequence the loss is taken over (R2D2: 80)."""
    burn_in: int = 0
    """Steps before them unrolled without gradients to rebuild the state (R2D2: 40)."""
    overlap: int = 10
    """Steps adjacent sequences of an episode share (R2D2: half the sequence)."""
    value_rescale: bool = True
    """Learn ``h(Q)`` (R2D2's invertible value rescaling) instead of ``Q``."""
    priority_eta: float = 0.9
    """A sequence's priority: ``eta`` x its largest |TD error| + (1 - ``eta``) x their mean."""

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "lstm", "seq_len")
        at_least(self, 0, "burn_in", "overlap")
        unit_interval(self, "priority_eta")
        if self.overlap >= self.seq_len:
            raise ValueError(f"overlap {self.overlap} must be below seq_len {self.seq_len}")
        if self.cuda_graphs:
            raise ValueError("cuda_graphs: R2D2's learner steps as written (its unroll's length depends on the data)")
        if self.target_update_interval is not None:
            raise ValueError("target_update_interval: R2D2's replay holds sequences, not env steps; use target_update")


# ---------------------------------------------------------------------------------------------------
# Network and targets
# ---------------------------------------------------------------------------------------------------


class QHead(nn.Module):
    """Q-values over the LSTM's output (a linear layer, or DQN's dueling head); ``greedy`` as the
    evaluators and ``dagrl export`` ask of a head."""

    def __init__(self, width: int, actions: int, dueling: bool):
        super().__init__()
        self.q = DuelingHead(width, actions) if dueling else nn.Linear(width, actions)

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        return self.q(out)

    def greedy(self, out: torch.Tensor) -> torch.Tensor:
        return self.q(out).argmax(-1)


class RecurrentQ(LSTMCore):
    """:class:`~dagrl.algos.common.recurrent.LSTMCore` (encoder and LSTM) and a Q head (:attr:`heads`)."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, cfg: Config):
        if not isinstance(act_space, gym.spaces.Discrete):
            raise TypeError(f"R2D2 needs a discrete action space, got {act_space}")
        super().__init__(obs_space, cfg.hidden, cfg.lstm, cnn=cfg.cnn)
        self.heads = QHead(cfg.lstm, int(act_space.n), cfg.dueling)

    def q_values(self, obs: torch.Tensor, state: State, starts: torch.Tensor) -> tuple[torch.Tensor, State]:
        """Q-values ``[T, N, actions]`` over observations ``[T, N, ...]`` (:meth:`unroll`), and the state after."""
        out, after = self.unroll(obs, state, starts)
        return self.heads(out), after


EPS = 1e-3


def rescale(x: torch.Tensor) -> torch.Tensor:
    """R2D2's ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al., 2018).

    >>> x = torch.tensor([-100.0, -1.0, 0.0, 2.5, 400.0])
    >>> torch.allclose(unrescale(rescale(x)), x, rtol=1e-4)
    True
    """
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + EPS * x


def unrescale(y: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`rescale`."""
    root = (torch.sqrt(1.0 + 4.0 * EPS * (y.abs() + 1.0 + EPS)) - 1.0) / (2.0 * EPS)
    return torch.sign(y) * (root**2 - 1.0)


def targets(
    rewards: torch.Tensor, length: torch.Tensor, terminated: torch.Tensor, next_q: torch.Tensor, gamma: float, n: int
) -> torch.Tensor:
    """n-step targets ``[L, N]`` for the steps of sequences ``[L, N]`` whose first ``length`` steps are
    real: for step ``j``, ``k = min(n, length - j)`` rewards then ``gamma ** k`` times ``next_q`` at ``j + k``
    (``next_q``: ``[L + 1, N]``, the bootstrap value of each observation, rescaled back to returns by
    the caller), nothing where the episode terminated at step ``j + k - 1``. Steps past ``length``: 0.

    >>> r = torch.tensor([[1.0], [1.0], [1.0]])  # one sequence of 3 steps, the last one terminal
    >>> targets(r, torch.tensor([3]), torch.tensor([True]), torch.full((4, 1), 10.0), 0.5, 2).flatten().tolist()
    [4.0, 1.5, 1.0]
    """
    L, N = rewards.shape
    j = torch.arange(L, device=rewards.device).unsqueeze(1)  # [L, 1]
    k = (length.unsqueeze(0) - j).clamp(0, n)  # [L, N] rewards each step folds
    ret = torch.zeros_like(rewards)
    for i in range(n):
        at = (j + i).clamp(max=L - 1).expand(L, N)
        ret = ret + (i < k).float() * gamma**i * rewards.gather(0, at)
    boot = next_q.gather(0, j + k)
    ends = terminated.unsqueeze(0) & (j + k == length.unsqueeze(0))
    return torch.where(k > 0, ret + (~ends).float() * gamma ** k.float() * boot, torch.zeros_like(ret))


# ---------------------------------------------------------------------------------------------------
# Role states
# ---------------------------------------------------------------------------------------------------


@dataclass
class SamplerState(qlearning.SamplerState):
    lstm: tuple[np.ndarray, np.ndarray] = ()
    """Each env's LSTM state after its last step, ``[N, lstm]`` x 2."""
    starts: np.ndarray | None = None
    """Per env, 1 where ``obs`` is an episode's first observation."""


LearnerState = qlearning.LearnerState
"""DQN's learner state: the online and target networks, Adam, the gradient-step count (its captured step
stays ``None``: R2D2's learner steps as written)."""


def seeded(ctx: RoleContext, cfg: Config, obs_space: gym.Space, act_space: gym.Space) -> RecurrentQ:
    with ctx.seeded():
        return RecurrentQ(obs_space, act_space, cfg)


@role("sampler", many=True)
def sampler(ctx: RoleContext, cfg: Config) -> SamplerState:
    envs, obs, _ = ctx.start_envs()
    n = envs.num_envs
    q = seeded(ctx, cfg, envs.single_observation_space, envs.single_action_space)
    recorder = SequenceRecorder(n, cfg.seq_len, cfg.burn_in, cfg.overlap, cfg.lstm)
    done = ctx.per_replica(ctx.env_steps)  # a resumed run or a replacement: epsilon as the run has got to
    lstm = tuple(s[0].numpy() for s in q.initial(n))
    return SamplerState(
        cfg, envs, q, np.random.default_rng(ctx.seed), obs, recorder, ctx.index, ctx.replicas, done,
        cfg.epsilon_steps(ctx.env_steps_budget), lstm=lstm, starts=np.ones(n, np.float32),
    )  # fmt: skip


@role("replay", many=True)
def replay(ctx: RoleContext, cfg: Config) -> ReplayState:
    schema = sequence_schema(ctx.observation_space, ctx.action_space, cfg.seq_len, cfg.burn_in, cfg.lstm)
    return qlearning.replay_of(ctx, cfg, schema)


@role("learner")
def learner(ctx: RoleContext, cfg: Config) -> LearnerState:
    device = torch.device(ctx.device)
    q = seeded(ctx, cfg, ctx.observation_space, ctx.action_space).to(device)
    target = seeded(ctx, cfg, ctx.observation_space, ctx.action_space).to(device)
    optimizer = torch.optim.Adam(q.parameters(), lr=cfg.lr)
    return LearnerState(cfg, q, target, optimizer, device, ctx)


@role("evaluator", recover="replace")
def evaluator(ctx: RoleContext, cfg: Config) -> EpisodeRunner:
    envs = ctx.make_envs()
    q = RecurrentQ(envs.single_observation_space, envs.single_action_space, cfg)
    return EpisodeRunner(envs, q, ctx.seed, cfg.eval_episodes, epsilon=cfg.eps_end)


# ---------------------------------------------------------------------------------------------------
# Fragments
# ---------------------------------------------------------------------------------------------------


@fragment(role="sampler")
def collect(state: SamplerState, weights: Weights) -> Transitions:
    """``steps`` epsilon-greedy steps of every env, each env's LSTM state carried on; the sequences
    completed meanwhile."""
    envs, n, q = state.envs, state.envs.num_envs, state.q
    q.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    for _ in range(state.cfg.steps):
        h, c = state.lstm
        with torch.no_grad():
            before = (torch.from_numpy(h).unsqueeze(0), torch.from_numpy(c).unsqueeze(0))
            out, (h2, c2) = q.step(obs_tensor(state.obs), before, torch.from_numpy(state.starts))
            greedy = q.heads(out).argmax(1).numpy()
        explore = state.rng.random(n) < state.epsilon()
        action = np.where(explore, state.rng.integers(0, envs.single_action_space.n, n), greedy)
        state.obs, done = state.recorder.step(envs, state.obs, action, h, c)
        state.lstm, state.starts = (h2[0].numpy(), c2[0].numpy()), done.astype(np.float32)
        state.steps_done += n
    return state.recorder.take(envs)


def sequence_loss(state: LearnerState, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One gradient step on a batch of sequences (``b["weight"]``: importance weights); returns the loss,
    the mean Q, and each sequence's priority."""
    cfg, q, target = state.cfg, state.q, state.target
    B, L = cfg.burn_in, cfg.seq_len
    obs = b["obs"].transpose(0, 1)  # [B + L + 1, N, ...]
    first = b["first"].transpose(0, 1)
    begin = (b["h"].unsqueeze(0), b["c"].unsqueeze(0))
    with torch.no_grad():
        online = q.unroll(obs[:B], begin, first[:B])[1] if B else begin
        q_target = target.q_values(obs, begin, first)[0][B:]  # [L + 1, N, A]
    q_online, _ = q.q_values(obs[B:], online, first[B:])
    actions = b["action"].transpose(0, 1)[B:].long()  # [L, N]
    rewards = b["reward"].transpose(0, 1)[B:]
    length = b["length"].long()
    with torch.no_grad():
        if cfg.double:  # the online network chooses, the target network values
            boot = q_target.gather(-1, q_online.argmax(-1, keepdim=True)).squeeze(-1)  # [L + 1, N]
        else:
            boot = q_target.max(-1).values
        if cfg.value_rescale:
            boot = unrescale(boot)
        goal = targets(rewards, length, b["terminated"], boot, cfg.gamma, cfg.n_step)
        if cfg.value_rescale:
            goal = rescale(goal)
    taken = q_online[:L].gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [L, N]
    mask = (torch.arange(L, device=length.device).unsqueeze(1) < length.unsqueeze(0)).float()
    per_step = nn.functional.smooth_l1_loss(taken, goal, reduction="none") * mask
    loss = (b["weight"] * per_step.sum(0) / mask.sum(0)).mean()
    state.optimizer.zero_grad()
    loss.backward()
    state.ctx.average_gradients(q.parameters())
    nn.utils.clip_grad_norm_(q.parameters(), cfg.max_grad_norm)
    state.optimizer.step()
    td = (taken - goal).detach().abs() * mask
    priority = cfg.priority_eta * td.max(0).values + (1 - cfg.priority_eta) * td.sum(0) / mask.sum(0)
    values = unrescale(taken.detach()) if cfg.value_rescale else taken.detach()  # in returns, as DQN's
    q_mean = (values * mask).sum() / mask.sum()
    return {"loss": loss.detach(), "q_mean": q_mean, "td": priority, "frames": length.sum()}


@fragment(role="learner")
def update(state: LearnerState, samples: list[Sample | None]) -> UpdateResult:
    """Gradient steps on each ``batch_size`` slice of the sampled sequences (none until learning starts);
    returns each sampled sequence's priority by shard, for prioritized replay, and each shard's next draw."""
    outs, priorities = qlearning.learn_from(state, samples, partial(sequence_loss, state))
    if not priorities:  # nothing sampled yet
        return UpdateResult({"perf/frames": 0.0})
    metrics = step_means(outs, {"losses/td": "loss", "losses/q_mean": "q_mean"}, missing=float("nan"))
    metrics["perf/frames"] = float(sum(o["frames"] for o in outs))  # the steps learned on, burn-in aside
    return UpdateResult(metrics, priorities, shard_draws(samples))


# ---------------------------------------------------------------------------------------------------
# One training iteration
# ---------------------------------------------------------------------------------------------------


@evaluation
def eval_iteration():
    return evaluate(publish())


@iteration
def train_iteration():
    weights = publish()
    sequences = collect(weights)
    stored = add(sequences)
    return reprioritize(update(sample(stored)))


ALGORITHM = Manifest(
    config=Config,
    roles=[sampler, replay, learner, evaluator],
    iteration=train_iteration,
    evaluation=eval_iteration,
    action_spaces=ACTION_SPACES,
)
