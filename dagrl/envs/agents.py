"""Multi-agent environments: a PettingZoo parallel env as one gymnasium env, one row per agent.

A graph names one as ``env: {id: "mpe2:simple_spread_v3", api: pettingzoo}``; the samplers then make
``dagrl.envs:PettingZoo-v0`` (:class:`PettingZooGame`) around it, so every vector backend that makes
gymnasium envs (``sync``, ``async``, ``threads``) steps games the way it steps single-agent envs, and
the runtime's transports, episodes and stop conditions see nothing new.

What a game gives
-----------------
* The observation is ``[A, W]``, a row per agent of ``env.possible_agents``, laid out as
  :class:`AgentsBox` describes: the agent's own observation (flattened, zero-padded to the widest
  agent's), its one-hot index, and the global state (``env.state()`` where the env has one, else every
  agent's observation concatenated). A policy reads the first part, a centralised critic all of it.
* The action is one entry per agent: ``MultiDiscrete`` for agents with ``Discrete`` actions (their
  sizes may differ), or a ``Box`` ``[A, k]`` for agents with ``Box`` actions of one shape.
* The reward is the mean of the rewards of the agents that acted, so an episode's return is the mean
  over agents of their returns: what MAPPO's paper reports. Each agent's own reward, and whether it
  ended, are in ``info["agents"]`` (:func:`agent_step`).
* Agents that finish early (terminated or truncated before the others) leave the game: the step that
  ends them still shows their last observation; after it their own part of the row is zero and
  ``info["agents"]["active"]`` is false for them until the game ends, which is when no agent is left.
  Agents that join later (in ``possible_agents`` but not yet in ``agents``) are inactive until they
  appear. An algorithm masks inactive rows out of its losses.

Groups
------
Agents whose policy is the same network form a group. ``env.groups`` names them
(``{adversaries: [adversary_0], good: [agent_0, agent_1]}``); by default agents are grouped by their
name before the last ``_`` (PettingZoo's ``adversary_0``, ``agent_1``). Within a group every agent
must have the same observation and action space; a game whose groups do not is refused before
anything starts, naming the agents (:class:`GroupError`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["AgentsBox", "GroupError", "PettingZooGame", "agent_step", "default_groups"]

GAME_ID = "dagrl.envs:PettingZoo-v0"
"""The gymnasium id samplers make for a graph's ``env.api: pettingzoo``."""


class GroupError(ValueError):
    """The agents of one group differ in their spaces, or the groups do not cover the agents once each."""


class AgentsBox(gym.spaces.Box):
    """The ``[A, W]`` observation of a game, with its layout: row ``i`` is agent ``agents[i]``, and holds
    ``[own observation (local_sizes[i] values, zero-padded to local) | one-hot of i (A) | state]``."""

    def __init__(
        self,
        agents: tuple[str, ...],
        local_sizes: tuple[int, ...],
        state_size: int,
        groups: Mapping[str, tuple[int, ...]],
    ):
        self.agents, self.local_sizes, self.state_size = tuple(agents), tuple(local_sizes), int(state_size)
        self.groups = {name: tuple(members) for name, members in groups.items()}
        self.local = max(local_sizes)
        width = self.local + len(agents) + self.state_size
        super().__init__(-np.inf, np.inf, (len(agents), width), np.float32)

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def width(self) -> int:
        return int(self.shape[1])

    def __repr__(self) -> str:
        return f"AgentsBox({self.n_agents} agents x {self.width}: groups {dict(self.groups)})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, AgentsBox)
            and super().__eq__(other)
            and (self.agents, self.local_sizes, self.state_size, self.groups)
            == (other.agents, other.local_sizes, other.state_size, other.groups)
        )

    __hash__ = None  # type: ignore[assignment]  (mutable, as Box)


def load_parallel_env(env: str, **kwargs: Any) -> Any:
    """The PettingZoo parallel env ``"package:name"`` names, made with ``kwargs``: the module
    ``package.name``'s ``parallel_env`` (``"mpe2:simple_spread_v3"``, ``"pettingzoo.butterfly:pistonball_v6"``),
    or, for your own env, the attribute ``name`` of the module ``package`` (a class or function that
    returns a ``pettingzoo.ParallelEnv``)."""
    module, sep, name = env.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"a PettingZoo env is named 'package:name', e.g. 'mpe2:simple_spread_v3'; got {env!r}")
    try:
        made = importlib.import_module(f"{module}.{name}")
    except ImportError:
        try:
            made = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"no module {module}.{name} and no {name} in {module} ({err})") from None
    if hasattr(made, "parallel_env"):
        return made.parallel_env(**kwargs)
    if not callable(made):
        raise ValueError(f"{env}: neither a PettingZoo env module (with parallel_env) nor a class or function")
    return made(**kwargs)


def default_groups(agents: tuple[str, ...]) -> dict[str, list[str]]:
    """Agents grouped by their name before the last ``_``, in order of first appearance.

    >>> default_groups(("adversary_0", "agent_0", "agent_1"))
    {'adversary': ['adversary_0'], 'agent': ['agent_0', 'agent_1']}
    """
    out: dict[str, list[str]] = {}
    for name in agents:
        out.setdefault(name.rpartition("_")[0] or name, []).append(name)
    return out


def _check_groups(groups: Mapping[str, list[str]], agents: tuple[str, ...], obs: dict, act: dict) -> None:
    seen: dict[str, str] = {}
    for group, members in groups.items():
        if not members:
            raise GroupError(f"group {group!r} has no agents")
        for name in members:
            if name not in agents:
                raise GroupError(f"group {group!r}: no agent {name!r} in this env (agents: {', '.join(agents)})")
            if name in seen:
                raise GroupError(f"agent {name!r} is in two groups: {seen[name]!r} and {group!r}")
            seen[name] = group
        first = members[0]
        for name in members[1:]:
            for what, spaces in (("observation", obs), ("action", act)):
                if spaces[name] != spaces[first]:
                    raise GroupError(
                        f"group {group!r}: agents {first} and {name} have different {what} spaces "
                        f"({spaces[first]} vs {spaces[name]}); put them in groups of their own (env.groups)"
                    )
    missing = [name for name in agents if name not in seen]
    if missing:
        raise GroupError(f"agents in no group: {', '.join(missing)} (env.groups must name every agent once)")


def _joint_action_space(agents: tuple[str, ...], act: dict) -> gym.Space:
    spaces = [act[name] for name in agents]
    if all(isinstance(s, gym.spaces.Discrete) for s in spaces):
        if any(int(s.start) != 0 for s in spaces):
            raise ValueError("agents' Discrete action spaces must start at 0")
        return gym.spaces.MultiDiscrete([int(s.n) for s in spaces])
    if all(isinstance(s, gym.spaces.Box) for s in spaces):
        shapes = {s.shape for s in spaces}
        if len(shapes) > 1 or len(spaces[0].shape) != 1:
            raise ValueError(f"agents' Box action spaces must be flat and of one shape; got {sorted(shapes)}")
        low = np.stack([s.low for s in spaces]).astype(np.float32)
        high = np.stack([s.high for s in spaces]).astype(np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32)
    kinds = sorted({type(s).__name__ for s in spaces})
    raise ValueError(f"agents' action spaces must be all Discrete or all Box; got {', '.join(kinds)}")


class PettingZooGame(gym.Env):
    """A PettingZoo parallel env as a gymnasium env with a row per agent (module docstring).

    ``env`` names the PettingZoo env (``"mpe2:simple_spread_v3"``), ``groups`` the agents that share a
    policy (default :func:`default_groups`), ``kwargs`` are the PettingZoo env's own.
    """

    dagrl_snapshot = False
    """PettingZoo's envs do not come back whole from a pickle (their AEC state is rebuilt by ``reset``):
    a checkpoint holds no snapshot of a game, and a resume starts its games fresh."""

    metadata = {"render_modes": []}

    def __init__(self, env: str, groups: Mapping[str, list[str]] | None = None, kwargs: dict | None = None):
        self.game = load_parallel_env(env, **(kwargs or {}))
        self.names = tuple(self.game.possible_agents)
        obs = {name: self.game.observation_space(name) for name in self.names}
        act = {name: self.game.action_space(name) for name in self.names}
        for name, space in obs.items():
            if not isinstance(space, gym.spaces.Box):
                raise ValueError(f"agent {name}'s observation space {space} is not a Box (only vector observations)")
        groups = dict(groups) if groups else default_groups(self.names)
        _check_groups(groups, self.names, obs, act)
        self.sizes = tuple(int(np.prod(obs[name].shape)) for name in self.names)
        try:
            state_size = int(np.prod(self.game.state_space.shape))
            self._own_state = True
        except (AttributeError, NotImplementedError):
            state_size, self._own_state = sum(self.sizes), False
        index = {name: i for i, name in enumerate(self.names)}
        self.observation_space = AgentsBox(
            self.names, self.sizes, state_size, {g: tuple(index[n] for n in members) for g, members in groups.items()}
        )
        self.action_space = _joint_action_space(self.names, act)
        self._box = isinstance(self.action_space, gym.spaces.Box)
        self._active = np.zeros(len(self.names), bool)

    def _rows(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        space = self.observation_space
        A, L = space.n_agents, space.local
        rows = np.zeros(space.shape, np.float32)
        for i, name in enumerate(self.names):
            if name in obs:
                rows[i, : self.sizes[i]] = np.asarray(obs[name], np.float32).ravel()
        if self._own_state:
            state = np.asarray(self.game.state(), np.float32).ravel()
        else:
            state = np.concatenate([rows[i, : self.sizes[i]] for i in range(A)])
        rows[:, L + A :] = state
        rows[np.arange(A), L + np.arange(A)] = 1.0
        return rows

    def _live(self) -> np.ndarray:
        present = set(self.game.agents)
        return np.array([name in present for name in self.names])

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        obs, _ = self.game.reset(seed=seed, options=options)
        self._active = self._live()
        n = len(self.names)
        return self._rows(obs), {"agents": _agents_info(np.zeros(n, np.float32), np.zeros(n, bool), self._active)}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        acting = self._active.copy()
        actions = {
            name: (np.asarray(action[i], np.float32) if self._box else int(action[i]))
            for i, name in enumerate(self.names)
            if acting[i]
        }
        obs, rewards, terminated, truncated, _ = self.game.step(actions)
        reward = np.array([float(rewards.get(name, 0.0)) for name in self.names], np.float32)
        ended = np.array([bool(terminated.get(n, False) or truncated.get(n, False)) for n in self.names])
        cut = np.array([bool(truncated.get(n, False)) and not terminated.get(n, False) for n in self.names])
        self._active = self._live() & ~ended
        over = not self.game.agents
        team = float(reward[acting].mean()) if acting.any() else 0.0
        info = {"agents": _agents_info(reward, ended & acting, self._active, cut & acting)}
        return self._rows(obs), team, over and not cut[acting].any(), over and bool(cut[acting].any()), info

    def close(self) -> None:
        self.game.close()


def _agents_info(reward: np.ndarray, ended: np.ndarray, active: np.ndarray, cut: np.ndarray | None = None) -> dict:
    return {"reward": reward, "ended": ended, "cut": np.zeros_like(ended) if cut is None else cut, "active": active}


def agent_step(info: dict, done: np.ndarray) -> dict[str, np.ndarray]:
    """Per game and agent (``[N, A]``), from a vector step's ``info``: ``reward``, ``ended`` (the agent's
    episode ended with this step), ``cut`` (ended by a time limit, not terminated) and ``active`` (the
    agent acts on the observation the step returned). The games that ended (``done``) were reset in the
    same step: their step's values are in ``info["final_info"]``, their new episode's ``active`` at the
    top."""
    top = info["agents"]
    out = {key: np.array(top[key]) for key in ("reward", "ended", "cut", "active")}
    if done.any():
        final = info["final_info"]["agents"]
        for key in ("reward", "ended", "cut"):
            out[key][done] = np.asarray(final[key])[done]
    return out
