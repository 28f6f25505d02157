"""The networks of MAPPO and IPPO (:mod:`dagrl.algos.common.multiagent`): a policy and a critic per
group of agents, over a game's rows ``[local | one-hot | state]`` (:class:`~dagrl.envs.agents.AgentsBox`).

A policy reads the agent's own observation (and its index, when its group has several agents); with
``gru`` > 0 it also carries a memory: a GRU between its hidden layers and its output, as MAPPO's
recurrent policy, its state kept per game and agent and zeroed where a game starts. A central critic
reads the row's global state too; critics carry no memory (a central one reads the state, which is
what memory would stand in for).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.algos.common.distributions import ActionDist, Categorical
from dagrl.envs.agents import AgentsBox
from dagrl.nn.networks import ACTIVATIONS, RunningNorm, Widths, widths


def _mlp(n_in: int, hidden: Widths, n_out: int, gain: float, activation: str, layer_norm: str) -> nn.Sequential:
    act = ACTIVATIONS[activation]
    sizes = [n_in, *widths(hidden), n_out]
    linears = [nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    for layer in linears:
        nn.init.orthogonal_(layer.weight, gain if layer is linears[-1] else np.sqrt(2))
        nn.init.zeros_(layer.bias)
    layers: list[nn.Module] = [nn.LayerNorm(n_in)] if layer_norm != "none" else []
    for linear in linears[:-1]:
        layers += [linear, act(), *([nn.LayerNorm(linear.out_features)] if layer_norm == "all" else [])]
    return nn.Sequential(*layers, linears[-1])


class Memory(nn.Module):
    """An MLP (:func:`_mlp`) with a GRU between its hidden layers and its output: MAPPO's recurrent
    policy. ``forward`` takes rows and the GRU's state before them, already zeroed where an episode
    starts; :meth:`unroll` runs a whole sequence, zeroing the state before each step that starts one."""

    def __init__(self, mlp: nn.Sequential, width: int, gain: float):
        super().__init__()
        self.trunk = mlp[:-1]
        self.gru = nn.GRUCell(mlp[-1].in_features, width)
        for name, param in self.gru.named_parameters():
            (nn.init.zeros_ if "bias" in name else nn.init.orthogonal_)(param)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, mlp[-1].out_features)
        nn.init.orthogonal_(self.head.weight, gain)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.gru(self.trunk(x), h)
        return self.head(self.norm(h)), h

    def unroll(self, x: torch.Tensor, h: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """The outputs ``[T, S, out]`` for rows ``[T, S, in]`` of ``S`` sequences from their states ``h``
        ``[S, width]``; ``starts`` ``[T, S]`` is 1 where a step starts an episode."""
        features = self.trunk(x)
        states = []
        for t in range(len(x)):
            h = self.gru(features[t], h * (1.0 - starts[t]).unsqueeze(-1))
            states.append(h)
        return self.head(self.norm(torch.stack(states)))


class Rows:
    """The action distribution of a batch of agent rows of several groups: log-probs and entropies per
    row, each group's from its own head (the ``dist`` :func:`~dagrl.algos.common.epochs.clipped_loss` takes)."""

    def __init__(self, parts: list[tuple[torch.Tensor, ActionDist]], n: int):
        self.parts, self.n = parts, n

    def _gather(self, values: list[torch.Tensor]) -> torch.Tensor:
        out = values[0].new_zeros(self.n)
        for (rows, _), v in zip(self.parts, values, strict=True):
            out = out.index_put((rows,), v)
        return out

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self._gather([dist.log_prob(actions[rows]) for rows, dist in self.parts])

    def entropy(self) -> torch.Tensor:
        return self._gather([dist.entropy() for _, dist in self.parts])


class AgentsActorCritic(nn.Module):
    """A policy and a critic per group (module docstring), over rows ``[local | one-hot | state]``.

    Methods take the rows ``[M, W]`` and, per row, the agent's index ``[M]``."""

    def __init__(
        self,
        obs_space: AgentsBox,
        act_space: gym.Space,
        hidden: Widths,
        share: bool,
        critic: str,
        norm_value: bool = False,
        activation: str = "tanh",
        layer_norm: str = "input",
        gru: int = 0,
    ):
        super().__init__()
        A, L = obs_space.n_agents, obs_space.local
        groups = obs_space.groups if share else {name: (i,) for i, name in enumerate(obs_space.agents)}
        self.names = list(groups)
        self.box = isinstance(act_space, gym.spaces.Box)
        self.L, self.A = L, A
        self.register_buffer("group", torch.zeros(A, dtype=torch.long), persistent=False)
        self.sizes, self.onehot, self.n_act = [], [], []
        actors, critics, log_stds = [], [], []
        for g, members in enumerate(groups.values()):
            self.group[list(members)] = g
            size = obs_space.local_sizes[members[0]]
            onehot = len(members) > 1  # agents sharing a network are told apart by their index
            n_in = size + (A if onehot else 0)
            n_act = int(act_space.shape[1]) if self.box else int(act_space.nvec[members[0]])
            self.sizes.append(size)
            self.onehot.append(onehot)
            self.n_act.append(n_act)
            actor = _mlp(n_in, hidden, n_act, 0.01, activation, layer_norm)
            actors.append(Memory(actor, gru, 0.01) if gru else actor)
            critic_in = size + A + obs_space.state_size if critic == "central" else n_in
            critics.append(_mlp(critic_in, hidden, 1, 1.0, activation, layer_norm))
            log_stds.append(nn.Parameter(torch.zeros(n_act)) if self.box else None)
        self.actors, self.critics = nn.ModuleList(actors), nn.ModuleList(critics)
        self.group_of = self.group.tolist()  # the same as plain ints: what export may branch on
        self.log_stds = nn.ParameterList([p for p in log_stds if p is not None])
        self.central = critic == "central"
        self.gru = gru
        self.value_norms = nn.ModuleList([RunningNorm(()) for _ in groups]) if norm_value else None

    def _own(self, g: int, x: torch.Tensor) -> torch.Tensor:
        """What group ``g``'s policy reads of its rows: the agent's own observation (and its index)."""
        own = x[..., : self.sizes[g]]
        return torch.cat([own, x[..., self.L : self.L + self.A]], -1) if self.onehot[g] else own

    def _critic_in(self, g: int, x: torch.Tensor) -> torch.Tensor:
        if self.central:
            return torch.cat([x[:, : self.sizes[g]], x[:, self.L :]], -1)
        return self._own(g, x)

    def _policy(self, g: int, x: torch.Tensor, h: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Group ``g``'s policy on what its rows read (:meth:`_own`): its output, and the GRU's state
        after the step from ``h`` (feed-forward: ``h`` as it is)."""
        return self.actors[g](x, h) if self.gru else (self.actors[g](x), h)

    def _groups(self, agent: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        of = self.group[agent]
        if len(self.names) == 1:
            return [(0, torch.arange(len(agent), device=agent.device))]
        return [(g, rows) for g in range(len(self.names)) if len(rows := torch.nonzero(of == g).squeeze(-1))]

    def _dist(self, g: int, out: torch.Tensor) -> ActionDist:
        if not self.box:
            return Categorical(out)
        normal = torch.distributions.Normal(out, self.log_stds[g].exp(), validate_args=False)
        return torch.distributions.Independent(normal, 1, validate_args=False)

    def _values(self, x: torch.Tensor, agent: torch.Tensor, raw: bool) -> torch.Tensor:
        out = x.new_zeros(len(x))
        for g, rows in self._groups(agent):
            v = self.critics[g](self._critic_in(g, x[rows])).squeeze(-1)
            if not raw and self.value_norms is not None:
                norm = self.value_norms[g]
                v = v * torch.sqrt(norm.var + norm.eps).to(v.dtype) + norm.mean.to(v.dtype)
            out = out.index_put((rows,), v)
        return out

    def value(self, x: torch.Tensor, agent: torch.Tensor) -> torch.Tensor:
        """Values in reward units."""
        return self._values(x, agent, raw=False)

    def dist_value(self, x: torch.Tensor, agent: torch.Tensor) -> tuple[Rows, torch.Tensor]:
        """The action distribution and the value in the units the critic learns (:meth:`learned_units`), of
        feed-forward policies (GRU ones unroll over sequences: :meth:`unroll`)."""
        parts = []
        for g, rows in self._groups(agent):
            parts.append((rows, self._dist(g, self.actors[g](self._own(g, x[rows])))))
        return Rows(parts, len(x)), self._values(x, agent, raw=True)

    @torch.no_grad()
    def learned_units(self, returns: torch.Tensor, agent: torch.Tensor, reduce: Any = None) -> torch.Tensor:
        """``returns`` in the units the critic learns: under ``norm_value``, each group's folded into its
        running statistics (``reduce``: over data-parallel replicas) and standardised by them."""
        if self.value_norms is None:
            return returns
        out = returns.clone()
        of = self.group[agent]
        for g, norm in enumerate(self.value_norms):
            rows = of == g
            norm.update(returns[rows], reduce)
            out[rows] = (returns[rows] - norm.mean.to(returns.dtype)) / torch.sqrt(norm.var + norm.eps).to(
                returns.dtype
            )
        return out

    def initial(self, n: int, device: Any = "cpu") -> torch.Tensor:
        """The policies' GRU state of ``n`` rows at an episode's first step: zeros ``[n, gru]``."""
        return torch.zeros(n, self.gru, device=device)

    def act(
        self, x: torch.Tensor, agent: torch.Tensor, gen: torch.Generator | None, h: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Actions (sampled from ``gen``; ``None``: the most likely) and their log-probs, per row, and the
        policies' GRU state after the step from ``h`` (``[M, gru]``, already zeroed where a row starts an
        episode; ``None``: zeros)."""
        h = self.initial(len(x), x.device) if h is None else h
        shape = (len(x), self.n_act[0]) if self.box else (len(x),)
        actions = x.new_zeros(shape) if self.box else torch.zeros(shape, dtype=torch.long, device=x.device)
        logps, after = x.new_zeros(len(x)), h.clone()
        for g, rows in self._groups(agent):
            out, h_g = self._policy(g, self._own(g, x[rows]), h[rows])
            dist = self._dist(g, out)
            a = self._pick(g, out, gen)
            actions = actions.index_put((rows,), a)
            logps = logps.index_put((rows,), dist.log_prob(a))
            after = after.index_put((rows,), h_g)
        return actions, logps, after

    def _pick(self, g: int, out: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """Group ``g``'s actions from its policy's output: sampled from ``gen``, or (``None``) the most likely."""
        if gen is None:
            return out if self.box else out.argmax(-1)
        if self.box:
            return out + self.log_stds[g].exp() * torch.randn(out.shape, generator=gen, device=out.device)
        probs = torch.softmax(out.reshape(-1, out.shape[-1]), -1)
        return torch.multinomial(probs, 1, generator=gen).view(out.shape[:-1])

    def unroll(
        self, x: torch.Tensor, agent: torch.Tensor, starts: torch.Tensor, h: torch.Tensor, keep: torch.Tensor
    ) -> tuple[Rows, torch.Tensor]:
        """For ``S`` sequences of rows ``x`` ``[T, S, W]`` (sequence ``s`` is agent ``agent[s]``'s), the
        policies unrolled from their GRU states ``h`` ``[S, gru]`` (zeroed before the steps whose
        ``starts`` ``[T, S]`` is 1): the action distribution and the learned-units value of the rows
        ``keep`` ``[T, S]`` marks, in the order of ``x[keep]``."""
        S = len(agent)
        at = torch.cumsum(keep.reshape(-1).long(), 0) - 1  # a kept row's place among the kept
        parts = []
        for g, seqs in self._groups(agent):
            out = self.actors[g].unroll(self._own(g, x[:, seqs]), h[seqs], starts[:, seqs])
            flat = torch.arange(len(x), device=x.device).unsqueeze(1) * S + seqs  # [T, s]: places in x
            kept = keep[:, seqs]
            parts.append((at[flat[kept]], self._dist(g, out[kept])))
        rows, of = x[keep], agent.expand(len(x), S)[keep]
        return Rows(parts, len(rows)), self._values(rows, of, raw=True)

    def greedy(
        self, obs: torch.Tensor, h: torch.Tensor | None = None, gen: torch.Generator | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Every agent's most likely action (a ``Box``'s mean; with ``gen``, sampled), for observations
        ``[N, A, W]`` (evaluation, export): one pass per agent, so no shape depends on the data. With
        ``gru``, from the GRU states ``h`` ``[N, A, gru]``: the actions and the states after them."""
        return self._greedy(obs, range(self.A), h, gen)

    def _greedy(self, obs: torch.Tensor, agents: Any, h: torch.Tensor | None, gen: Any = None) -> Any:
        actions, after = [], []
        for j, a in enumerate(agents):
            g = self.group_of[a]
            out, h_a = self._policy(g, self._own(g, obs[:, j]), None if h is None else h[:, j])
            actions.append(self._pick(g, out, gen))
            after.append(h_a)
        if h is None:
            return torch.stack(actions, 1)
        return torch.stack(actions, 1), torch.stack(after, 1)

    def members(self, group: str) -> list[int]:
        """The agents (their indices in a game's rows) of the group named ``group``."""
        g = self.names.index(group)
        return [a for a in range(self.A) if self.group_of[a] == g]

    def group_greedy(
        self, obs: torch.Tensor, group: str, h: torch.Tensor | None = None, gen: torch.Generator | None = None
    ) -> Any:
        """The most likely actions of one group's agents, for their rows ``[N, k, W]`` in the game's
        order (what ``dagrl export --group`` exports: the policy one kind of agent deploys with); with
        ``gru``, from their GRU states ``h`` ``[N, k, gru]``, and the states after them."""
        return self._greedy(obs, self.members(group), h, gen)

    def agent_index(self, n_games: int, device: Any = "cpu") -> torch.Tensor:
        """The agent of each row of ``n_games`` games' rows, flattened game-major."""
        return torch.arange(self.A, device=device).repeat(n_games)


class RecurrentGreedy:
    """Every agent's most likely action under GRU policies, their states ``[N, A, gru]`` carried from step
    to step and zeroed where a game ended (:meth:`ended`, called by
    :meth:`~dagrl.algos.common.evaluation.EpisodeRunner.run`).

    :meth:`step` is the same policy as a function of the observations and the states, for ``dagrl
    export`` (:attr:`recurrent`)."""

    recurrent = True
    """Acts on its state as well as the observation: ``dagrl export`` exports :meth:`step`."""

    def __init__(self, net: AgentsActorCritic, n: int, gen: torch.Generator | None = None):
        self.net, self.gen = net, gen
        """``gen``: actions sampled from it instead of the most likely."""
        self.h = self.initial_state(n)[0]

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        actions, self.h = self.net.greedy(obs, self.h, self.gen)
        return actions

    def ended(self, done: np.ndarray) -> None:
        self.h = self.h * torch.as_tensor(1.0 - done.astype(np.float32)).view(-1, 1, 1)

    def initial_state(self, n: int) -> tuple[torch.Tensor]:
        """The states at a game's first step: zeros, ``[n, A, gru]``."""
        return (torch.zeros(n, self.net.A, self.net.gru),)

    def step(self, obs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every agent's action and the states after it, from observations ``[N, A, W]`` and the states before."""
        return self.net.greedy(obs, h, self.gen)
