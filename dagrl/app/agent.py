"""A trained run in Python: :func:`load` returns an :class:`Agent` that acts as Stable-Baselines3's
``model.predict`` does, builds the run's env and plays episodes.

    agent = dagrl.load("runs/ppo-cartpole/20261207-120000")   # a run directory, or one checkpoint file
    env = agent.make_env()                                     # the run's env, with its wrappers
    obs, _ = env.reset(seed=0)
    action, state = agent.predict(obs)                         # deterministic; state: a recurrent policy's
    print(agent.evaluate(episodes=10).line())                  # as ``dagrl eval``

The policy is the one ``dagrl eval`` plays (the algorithm's ``evaluate`` fragment, run once in this
process on the CPU to hand over its action functions, see :mod:`dagrl.app.export`): greedy, or with
``deterministic=False`` the stochastic one (a sample of the policy; a value-based policy's epsilon-greedy
action at the schedule's last epsilon; TD3's own action, as in Stable-Baselines3).

Observations are what :meth:`Agent.make_env`'s env gives; one observation or a batch (its first
dimension). A recurrent policy (``ppo_lstm``, ``r2d2``, GRU policies of ``mappo``) takes the ``state``
the last call returned (``None`` at first) and ``episode_start``, the mask of rows whose episode has
just begun, whose state then starts from zeros. A multi-agent run takes every agent's rows ``[A, W]``
(``[N, A, W]``), or a dict of one group's rows per group name, ``{group: [k, W]}``, and answers in kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

__all__ = ["Agent", "load"]

State = tuple[np.ndarray, ...] | None


class Agent:
    """What :func:`load` returns; see the module's text."""

    def __init__(self, run_dir: Path, checkpoint: dict[str, Any], graph: Any, runner: Any, acts: dict[bool, Any]):
        self.run_dir, self.graph = run_dir, graph
        self.checkpoint: str = checkpoint["path"]
        counters = checkpoint.get("counters", {})
        self.iteration, self.env_steps = int(counters.get("iteration", 0)), int(counters.get("env_steps", 0))
        self.algorithm: str = graph.spec.algorithm
        self.observation_space: gym.Space = graph.observation_space
        self.action_space: gym.Space = graph.action_space
        self.net: torch.nn.Module = runner.net
        self._runner, self._acts = runner, acts
        self.recurrent = bool(getattr(acts[True], "recurrent", False))

    def __repr__(self) -> str:
        return (
            f"Agent({self.algorithm} on {self.graph.spec.env.id}, {Path(self.checkpoint).name}: iteration "
            f"{self.iteration}, {self.env_steps:,} env steps)"
        )

    def seed(self, seed: int) -> None:
        """Seed the draws of stochastic actions."""
        self._runner.gen.manual_seed(seed)

    def make_env(self, **kwargs: Any) -> gym.Env:
        """One copy of the run's env, with its ``env.kwargs`` (``kwargs`` added: ``render_mode="human"``)
        and ``env.wrappers``, giving the observations :meth:`predict` takes."""
        from dagrl.envs.vector import make_env
        from dagrl.envs.wrappers import parse

        wrappers = parse(self.graph.spec.env.wrappers)
        return make_env(self.graph.env_id, wrappers, **{**self.graph.env_kwargs, **kwargs})

    def predict(
        self,
        observation: Any,
        state: State = None,
        episode_start: Any = None,
        deterministic: bool = True,
    ) -> tuple[Any, State]:
        """The action for ``observation`` (one, or a batch) and the policy's state after it (``None``
        but for a recurrent policy); see the module's text."""
        if isinstance(observation, dict):
            return self._predict_groups(observation, state, episode_start, deterministic)
        obs = np.asarray(observation)
        shape = self.observation_space.shape
        single = obs.shape == tuple(shape)
        if not single and obs.shape[1:] != tuple(shape):
            raise ValueError(f"observation of shape {obs.shape}: the run's are {tuple(shape)} (or a batch of them)")
        x = torch.as_tensor(obs[None] if single else obs, dtype=torch.float32)
        act = self._acts[bool(deterministic)]
        with torch.no_grad():
            if self.recurrent:
                before = self._state(act, len(x), state, episode_start, single)
                action, *after = act.step(x, *before)
            else:
                action, after = act(x), None
        action = self._clip(action.numpy())
        if after is not None:
            after = tuple(s.numpy()[0] if single else s.numpy() for s in after)
        return (action[0] if single else action), after

    def evaluate(self, episodes: int = 10, deterministic: bool = True, seed: int | None = None) -> Any:
        """``episodes`` whole episodes as ``dagrl eval`` plays them: an
        :class:`~dagrl.app.evaluate.EvalResult` (``.mean``, ``.returns``, ``.line()``)."""
        from dagrl.app.evaluate import evaluate_checkpoint

        return evaluate_checkpoint(self.checkpoint, episodes, seed, deterministic=deterministic)

    def _state(self, act: Any, n: int, state: State, episode_start: Any, single: bool) -> tuple[torch.Tensor, ...]:
        if state is None:
            return tuple(act.initial_state(n))
        before = tuple(torch.as_tensor(np.asarray(s)[None] if single else np.asarray(s)) for s in state)
        if episode_start is not None:
            keep = 1.0 - torch.as_tensor(np.atleast_1d(np.asarray(episode_start)), dtype=torch.float32)
            before = tuple(s * keep.view(-1, *[1] * (s.dim() - 1)) for s in before)
        return before

    def _clip(self, action: np.ndarray) -> np.ndarray:
        space = self.action_space
        if isinstance(space, gym.spaces.Box):
            return np.clip(action, space.low, space.high).astype(space.dtype)
        return action

    def _predict_groups(self, observation: dict, state: State, episode_start: Any, deterministic: bool) -> Any:
        """A multi-agent run's actions of each group named in ``observation`` (its agents' rows)."""
        net = self.net
        if not hasattr(net, "group_greedy"):
            raise ValueError(f"a dict of observations: {self.algorithm} has no agent groups (a multi-agent run has)")
        unknown = sorted(set(observation) - set(net.names))
        if unknown:
            raise ValueError(f"no such group in this run: {', '.join(unknown)} (groups: {', '.join(net.names)})")
        gen = None if deterministic else self._runner.gen
        actions: dict[str, np.ndarray] = {}
        after: dict[str, np.ndarray] = {}
        with torch.no_grad():
            for group, rows in observation.items():
                x = torch.as_tensor(np.asarray(rows), dtype=torch.float32)
                single = x.dim() == 2
                x = x[None] if single else x
                h = None
                if net.gru:
                    h0 = None if state is None else state.get(group)  # type: ignore[union-attr]
                    h = torch.zeros(len(x), x.shape[1], net.gru) if h0 is None else torch.as_tensor(h0)
                    h = h[None] if single and h0 is not None else h
                    if episode_start is not None:
                        h = h * (1.0 - torch.as_tensor(np.atleast_1d(episode_start), dtype=torch.float32)).view(
                            -1, 1, 1
                        )
                    a, h = net.group_greedy(x, group, h, gen)
                    after[group] = h.numpy()[0] if single else h.numpy()
                else:
                    a = net.group_greedy(x, group, None, gen)
                a = self._clip(a.numpy())
                actions[group] = a[0] if single else a
        return actions, (after if net.gru else None)


def load(run: str | Path, overrides: list[str] | None = None, seed: int | None = None) -> Agent:
    """An :class:`Agent` of the checkpoint ``run`` names: a run directory (its newest readable checkpoint)
    or one checkpoint file; ``overrides`` as ``--set`` takes them (``env.kwargs.render_mode=human``)."""
    from dagrl.app.evaluate import load_run

    run_dir, ckpt = load_run(run, "dagrl.load")
    with capture(run_dir, ckpt, list(overrides or []), (True, False)) as (graph, runner, acts):
        pass
    runner.gen.manual_seed(graph.spec.seed if seed is None else seed)
    return Agent(run_dir, ckpt, graph, runner, acts)


@contextmanager
def capture(
    run_dir: Path, ckpt: dict[str, Any], overrides: list[str], modes: tuple[bool, ...] = (True,)
) -> Iterator[tuple[Any, Any, dict[bool, Callable[..., Any]]]]:
    """The run's graph set up for evaluation, its evaluator state, and the action function its
    ``evaluate`` fragment hands over for each of ``modes`` (``deterministic``), played in this process
    on the checkpoint's weights without stepping an env; the evaluator's envs are closed on leaving."""
    from dagrl.algos.common.evaluation import EpisodeRunner
    from dagrl.app.evaluate import _hosts, eval_graph
    from dagrl.core.schema import ConfigError
    from dagrl.runtime.executor import Executor
    from dagrl.runtime.hosts import close_all

    graph = eval_graph(run_dir, 1, None, overrides, False)
    hosts = _hosts(graph, run_dir, ckpt)
    nodes = graph.algorithm.eval_graph
    runner = hosts[nodes.output.role][0].target.state
    try:
        if not isinstance(runner, EpisodeRunner):
            raise ConfigError(
                str(run_dir), "algorithm", f"{graph.spec.algorithm}: its evaluator state is not a dagrl EpisodeRunner"
            )
        runner.capture = True
        acts = {}
        executor = Executor()
        for deterministic in modes:
            runner.deterministic = deterministic
            executor.wait(executor.run_nodes(nodes.nodes, hosts, graph.algorithm.roles)[nodes.output.id])
            acts[deterministic] = runner.captured
        runner.deterministic = True
        runner.net.eval().requires_grad_(False)
        yield graph, runner, acts
    finally:
        close_all([h for handles in hosts.values() for h in handles])
