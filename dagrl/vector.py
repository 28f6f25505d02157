"""EnvPool as a sampler's vector env (``roles.sampler.vector: envpool``), with gymnasium's same-step autoreset.

`EnvPool <https://envpool.readthedocs.io>`_ steps a batch of envs in C++ threads, so one sampler's
envs can use several cores without a process per env, and Atari's preprocessing runs there too.
``pip install envpool`` (an optional dependency; a graph asking for it without it is refused).

What dagrl changes
------------------
EnvPool resets an env in the step *after* the one that ended its episode (that step ignores the
action and returns the first observation, reward 0). Every dagrl ``collect`` fragment expects
gymnasium's same-step autoreset: the step that ends an episode returns the next episode's first
observation and puts the last one in ``info["final_obs"]``. :class:`EnvPoolVector` gives that by
resetting the finished envs itself at once (EnvPool resets a subset of its envs on request), so the
next step acts in every env.

Which EnvPool task an env id names
----------------------------------
``dagrl.envs:Atari-v0`` becomes EnvPool's ``<game>-v5`` with the same preprocessing (no-op starts,
frame skip, 84x84 grayscale, frame stack, reward clipping, episodic life, no sticky actions, no
FIRE at reset); any other id is looked up in EnvPool under the same name (``CartPole-v1``,
``Pendulum-v1``, ``HalfCheetah-v5``...), its ``env.kwargs`` passed through. The graph is checked
before anything starts: the task must exist, and its spaces must equal those of the gymnasium env
of the same id (which evaluators and the driver still use).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["EnvPoolVector", "envpool_task"]

ATARI_OPTIONS = {  # dagrl.envs.make_atari's keyword -> EnvPool's Atari option
    "noop_max": "noop_max",
    "frame_skip": "frame_skip",
    "frame_stack": "stack_num",
    "episodic_life": "episodic_life",
    "clip_rewards": "reward_clip",
    "repeat_action_probability": "repeat_action_probability",
}


def envpool_task(env_id: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """EnvPool's task id and options for a dagrl env id and its ``env.kwargs`` (module docstring).

    >>> envpool_task("dagrl.envs:Atari-v0", {"game": "Breakout", "episodic_life": True})[0]
    'Breakout-v5'
    >>> envpool_task("CartPole-v1", {})
    ('CartPole-v1', {})
    """
    if env_id.rpartition(":")[2] != "Atari-v0":
        return env_id, dict(kwargs)
    from dagrl.envs import make_atari

    params = inspect.signature(make_atari).parameters.values()
    given = {**{p.name: p.default for p in params if p.kind is p.POSITIONAL_OR_KEYWORD}, **kwargs}
    unknown = set(given) - set(ATARI_OPTIONS) - {"game", "screen_size"}
    if unknown:
        raise ValueError(f"Atari-v0 options EnvPool has no counterpart for: {', '.join(sorted(unknown))}")
    options = {ATARI_OPTIONS[k]: v for k, v in given.items() if k in ATARI_OPTIONS}
    options.update(img_height=given["screen_size"], img_width=given["screen_size"], use_fire_reset=False)
    return f"{given['game']}-v5", options


class EnvPoolVector(gym.vector.VectorEnv):
    """``num_envs`` envs of one EnvPool task stepped as a batch, autoreset in the same step.

    Env ``i`` is seeded ``seed + i`` when the pool is made (EnvPool seeds only then: ``reset``
    ignores ``seed``). Observations are copies, safe to keep across steps. ``spaces`` (observation,
    action), when given, are shown instead of EnvPool's: the gymnasium env's, which the graph check
    found of the same shapes (EnvPool's MuJoCo actions are float64 where gymnasium's are float32, and
    a replay schema follows the graph's).
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int = 0,
        num_threads: int = 0,
        spaces: tuple[gym.Space, gym.Space] | None = None,
        **kwargs: Any,
    ):
        import envpool

        task, options = envpool_task(env_id, kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # EnvPool's Box bounds are float64: gymnasium warns on the cast
            self.pool = envpool.make_gymnasium(task, num_envs=num_envs, seed=seed, num_threads=num_threads, **options)
            self.single_observation_space, self.single_action_space = spaces or (
                self.pool.observation_space,
                self.pool.action_space,
            )
            self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
            self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.num_envs = num_envs

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, _ = self.pool.reset()
        return np.array(obs), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, reward, terminated, truncated, _ = self.pool.step(np.asarray(actions))
        obs, done = np.array(obs), np.asarray(terminated) | np.asarray(truncated)
        info: dict[str, Any] = {}
        if done.any():
            ended = np.flatnonzero(done)
            final = np.empty(self.num_envs, dtype=object)
            final[ended] = list(obs[ended])
            first, _ = self.pool.reset(ended.astype(np.int32))
            obs[ended] = first
            info = {"final_obs": final, "_final_obs": done}
        return obs, np.asarray(reward), np.asarray(terminated), np.asarray(truncated), info

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.closed = True
            self.pool.close()
