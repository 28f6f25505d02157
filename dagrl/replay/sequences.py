"""Fixed-length sequences of one env's steps, the rows of a recurrent replay (R2D2, Kapturowski et al., 2019).

A row is one env's ``length`` consecutive steps of one episode, with the ``burn_in`` steps before them
and the LSTM state before those, so a learner can rebuild the state its own weights reach where the
sequence starts. Adjacent rows of an episode overlap by ``overlap`` steps; rows never cross an
episode's end: the last row of an episode holds the steps left (``length`` field), and slots past it
are zeros. Row fields, slot ``j`` being the episode's step ``start - burn_in + j``:

* ``obs`` ``[burn_in + length + 1, ...]``: the observations, then the one after the last step (the
  env's ``final_obs`` where the episode ended), at slot ``burn_in + length``;
* ``first`` ``[burn_in + length + 1]``: 1 at the episode's first observation (the state is zeroed there);
* ``action``, ``reward`` ``[burn_in + length]``; ``valid`` ``[burn_in + length]``: the slot holds a step
  (burn-in slots before the episode began do not);
* ``length``: steps after the burn-in, 1 to ``length``; ``terminated``: the episode terminated at the
  last of them (then nothing is bootstrapped after it);
* ``h``, ``c`` ``[width]``: the LSTM state before slot 0 (zeros where slot 0 is before or at the
  episode's start).

Examples
--------
>>> from dagrl.core.context import RoleContext
>>> envs = RoleContext("sampler", 0, 1, seed=0, env_id="CartPole-v1", num_envs=1).make_envs()
>>> rec, (obs, _) = SequenceRecorder(1, length=4, burn_in=2, overlap=2, width=3), envs.reset(seed=0)
>>> for _ in range(8):
...     obs, _ = rec.step(envs, obs, np.array([0]), np.zeros((1, 3)), np.zeros((1, 3)))
>>> out = rec.take(envs)  # windows of steps 0-3, 2-5 and 4-7 (unless the episode ended before)
>>> out.data["obs"].shape[1:], out.env_steps
((7, 4), 8)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagrl.envs.episodes import EpisodeTracker
from dagrl.replay.role import Transitions
from dagrl.replay.schema import Schema

__all__ = ["SequenceRecorder", "sequence_schema"]


def sequence_schema(observation_space: Any, action_space: Any, length: int, burn_in: int, width: int) -> Schema:
    """The replay schema of :class:`SequenceRecorder`'s rows."""
    steps, slots = burn_in + length, burn_in + length + 1
    return Schema(
        {
            "obs": (observation_space.dtype, (slots, *observation_space.shape)),
            "first": ("float32", (slots,)),
            "action": (action_space.dtype, (steps, *action_space.shape)),
            "reward": ("float32", (steps,)),
            "valid": ("bool", (steps,)),
            "length": ("int32", ()),
            "terminated": ("bool", ()),
            "h": ("float32", (width,)),
            "c": ("float32", (width,)),
        }
    )


@dataclass
class _Env:
    """One env's steps of its current episode still needed by a row to come."""

    base: int = 0
    """The episode step of ``steps[0]``."""
    steps: list[tuple] = field(default_factory=list)
    """``(obs, action, reward, h, c)`` per step, ``h``/``c`` the LSTM state before it."""
    start: int = 0
    """The first step of the next row."""
    emitted: int = 0
    """The step after the last row's last (0: no row yet this episode)."""


class SequenceRecorder:
    """Steps a same-step-autoreset vector env and cuts each env's episodes into overlapping rows (above).

    ``step`` takes the actions and the LSTM state each env acted from (``[N, width]`` hidden and cell);
    ``take`` returns the rows completed since the last call with the episodes finished and the env steps
    taken. A row leaves when its ``length`` steps are taken or its episode ends; the steps of rows
    still open when a sampler is replaced are lost with it (as :class:`~dagrl.replay.record.Recorder`'s
    n-step rows)."""

    def __init__(self, num_envs: int, length: int, burn_in: int = 0, overlap: int = 0, width: int = 1):
        if not 0 <= overlap < length:
            raise ValueError(f"overlap {overlap} must be at least 0 and below the sequence length {length}")
        self.length, self.burn_in, self.stride, self.width = length, burn_in, length - overlap, width
        self.envs = [_Env() for _ in range(num_envs)]
        self.episodes = EpisodeTracker(num_envs)
        self.rows: list[dict[str, Any]] = []
        self.env_steps = 0

    def step(
        self, envs: Any, obs: np.ndarray, action: np.ndarray, h: np.ndarray, c: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Take one step of every env; return the observations to act on next, and where they start an
        episode (the env's ended: its state is to be zeroed)."""
        new_obs, reward, terminated, truncated, info = envs.step(action)
        done = terminated | truncated
        for i, env in enumerate(self.envs):
            env.steps.append((obs[i].copy(), action[i], float(reward[i]), h[i].copy(), c[i].copy()))  # kept for rows
            taken = env.base + len(env.steps)  # steps of the episode so far
            if done[i]:
                if taken > env.emitted:  # steps no row holds yet
                    self._emit(env, taken, info["final_obs"][i], bool(terminated[i]))
                self.envs[i] = _Env()
            elif taken == env.start + self.length:
                self._emit(env, taken, new_obs[i], False)
                env.emitted, env.start = taken, env.start + self.stride
                keep_from = env.start - self.burn_in
                if keep_from > env.base:
                    del env.steps[: keep_from - env.base]
                    env.base = keep_from
        self.env_steps += len(reward)
        self.episodes.step(reward, done)
        return new_obs, done

    def _emit(self, env: _Env, end: int, after: np.ndarray, terminated: bool) -> None:
        """The row of steps ``env.start`` to ``end`` (exclusive), ``after`` the observation after them."""
        first_step = env.start - self.burn_in  # the episode step of slot 0 (negative: before the episode)
        held = max(first_step, 0)
        steps = env.steps[held - env.base : end - env.base]
        pad = held - first_step  # burn-in slots before the episode began
        state = steps[0][3:] if first_step > 0 else (np.zeros(self.width), np.zeros(self.width))
        self.rows.append(
            {
                "pad": pad,
                "obs": [s[0] for s in steps] + [after],
                "action": [s[1] for s in steps],
                "reward": [s[2] for s in steps],
                "length": end - env.start,
                "terminated": terminated,
                "first": pad if first_step <= 0 else None,
                "h": state[0],
                "c": state[1],
            }
        )

    def take(self, envs: Any) -> Transitions:
        """The rows and finished episodes recorded since the last call, typed as the replay schema."""
        schema = sequence_schema(
            envs.single_observation_space, envs.single_action_space, self.length, self.burn_in, self.width
        )
        n = len(self.rows)
        data = {k: np.zeros((n, *f.shape), f.dtype) for k, f in schema.items()}
        for r, row in enumerate(self.rows):
            pad, steps = row["pad"], len(row["action"])
            data["obs"][r, pad : pad + steps + 1] = np.stack(row["obs"])
            data["action"][r, pad : pad + steps] = np.stack(row["action"])
            data["reward"][r, pad : pad + steps] = row["reward"]
            data["valid"][r, pad : pad + steps] = True
            if row["first"] is not None:
                data["first"][r, row["first"]] = 1.0
            data["length"][r], data["terminated"][r] = row["length"], row["terminated"]
            data["h"][r], data["c"][r] = row["h"], row["c"]
        out = Transitions(data, self.episodes.take(), self.env_steps)
        self.rows, self.env_steps = [], 0
        return out
