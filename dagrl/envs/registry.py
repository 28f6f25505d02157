"""Envs dagrl ships for benchmarks and examples.

``dagrl.envs:CostlyCartPole-v0`` is CartPole whose every step also costs ``step_ms`` milliseconds,
to stand for an expensive simulator: ``cost: sleep`` waits (a remote or GPU-bound simulator: the
core is free meanwhile), ``cost: busy`` spins (a CPU-bound one: the core is taken). Use it as
``env: {id: "dagrl.envs:CostlyCartPole-v0", kwargs: {step_ms: 1.0, cost: sleep}}``.

``dagrl.envs:BrightHalf-v0`` is the smallest image task: each step shows a noisy ``uint8`` image
``(channels, size, size)`` whose left or right half is brighter; the action names the half (+1 when
right). 16 steps an episode: guessing earns 8, seeing earns 16. It checks that an image pipeline
(uint8 through samplers, transport and replay, a CNN encoder) learns at all, in seconds on a CPU.
With ``continuous: true`` the action is a number in [-1, 1] whose sign names the half (positive:
right), for SAC and TD3. With ``blink: true`` every other image is noise only, and its step asks for
the half of the image before: one frame earns 12 on average, the last two frames (gymnasium's
``FrameStackObservation`` of 2) 16, so reaching 15 shows that a stack of frames reaches the CNN.

``dagrl.envs:BrightHalfFlip-v0`` is the same task as a ``Dict`` of the image (channels last) and a
state: a ``flip`` of +-1 that, at +1, asks for the dark half instead. Either entry alone earns 8; it
checks that a ``Dict`` observation holding an image reaches the networks as a CNN input and a vector.

``dagrl.envs:Atari-v0`` is an Atari game of the Arcade Learning Environment (``pip install
"dagrl[atari]"``) with the usual preprocessing, by gymnasium's own wrappers: up to 30 no-op
actions at reset, 4 frames repeated per action (max-pooled over the last two), 84x84 grayscale,
4 frames stacked into a ``uint8`` ``(4, 84, 84)`` observation, rewards clipped to [-1, 1]; no
sticky actions. ``env: {id: "dagrl.envs:Atari-v0", kwargs: {game: Pong}}``. With
``episodic_life: true`` a lost life ends the episode (returns are then per life). The emulator
hands the wrappers grayscale screens (``obs_type="grayscale"``): the preprocessing reads the screen
from the emulator itself, so the observations are the same as over ALE's default RGB screens, and
a step costs 12 % less without the RGB screen ALE renders for every repeated frame (BENCHMARKS.md).

``dagrl.envs:LaterPayoff-v0`` is a two-step task whose better path pays only at its second step, hidden
from a stale, uniformly acting policy's data: learning from such data with V-trace finds it, without an
off-policy correction does not (``dagrl bench vtrace --env dagrl.envs:LaterPayoff-v0``).

``dagrl.envs:Combination-v0`` asks for several choices at once, for algorithms acting in ``MultiDiscrete``
(or, with ``binary: true``, ``MultiBinary``) spaces: each step shows a target combination, one-hot, and
pays the share of its entries the action matches; 8 steps an episode, so guessing earns ``8 / choices``
and matching earns 8.

``dagrl.envs.registry.KeepEntries`` is a wrapper that keeps only some entries of a flat ``Box`` observation,
to turn a fully observed task into a partially observed one: ``env.wrappers: [{dagrl.envs.registry.KeepEntries:
{indices: [0, 2]}}]`` shows CartPole's cart position and pole angle without their velocities (rl-zoo's
``CartPoleNoVel``), which a policy then has to infer from what it saw before (``ppo_lstm``).

MuJoCo envs: before dagrl makes one it routes MuJoCo's warnings to the ``dagrl`` logger, each distinct
message once per process (:func:`route_mujoco_warnings`).

Examples
--------
>>> import gymnasium as gym
>>> env = gym.make("dagrl.envs:CostlyCartPole-v0", step_ms=0.5, cost="busy")
>>> _ = env.reset(seed=0)
>>> obs, reward, terminated, truncated, info = env.step(0)
>>> reward
1.0
"""

from __future__ import annotations

import logging
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = [
    "BrightHalf", "Combination", "CostlyCartPole", "KeepEntries", "LaterPayoff", "make_atari", "route_mujoco_warnings",
]  # fmt: skip

log = logging.getLogger("dagrl")


def route_mujoco_warnings(env_id: str) -> None:
    """If ``env_id`` is a MuJoCo env, send MuJoCo's warnings to the ``dagrl`` logger, each distinct one once.

    By default MuJoCo prints every warning to stdout and appends it to ``MUJOCO_LOG.TXT`` in the working
    directory. Gymnasium's ``-v5`` models use a compiler attribute MuJoCo 4 deprecates, so every env
    made printed the same lines (a few hundred in one ``dagrl tune``) and the file appeared wherever a run
    started. A handler set before (by dagrl or anyone else) is kept.
    """
    try:
        entry = gym.spec(env_id.rpartition(":")[2]).entry_point
    except gym.error.Error:
        return
    if not (isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco")):
        return
    import mujoco

    if mujoco.get_mju_user_warning() is not None:
        return
    seen: set[str] = set()

    def once(message: str) -> None:
        if message not in seen:
            seen.add(message)
            log.warning("MuJoCo: %s", message)

    mujoco.set_mju_user_warning(once)


COSTS = ("sleep", "busy")


class CostlyCartPole(CartPoleEnv):
    """CartPole-v1 whose ``step`` takes at least ``step_ms`` ms more, spent as ``cost``."""

    def __init__(self, step_ms: float = 1.0, cost: str = "sleep", **kwargs: Any):
        if cost not in COSTS:
            raise ValueError(f"cost must be one of {', '.join(COSTS)}, got {cost!r}")
        if not step_ms >= 0:
            raise ValueError(f"step_ms must be >= 0, got {step_ms!r}")
        super().__init__(**kwargs)
        self.step_s, self.cost = step_ms / 1000.0, cost

    def step(self, action: Any) -> tuple:
        if self.step_s > 0:  # at no cost, CartPole's step alone: even a sleep(0) costs ~30 us of CPU
            if self.cost == "sleep":
                time.sleep(self.step_s)
            else:
                deadline = time.perf_counter() + self.step_s
                while time.perf_counter() < deadline:
                    pass
        return super().step(action)


class BrightHalf(gym.Env):
    """Which half of the image is bright? A two-action image task with optimal return ``length``."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(
        self,
        size: int = 84,
        channels: int = 1,
        length: int = 16,
        render_mode: str | None = None,
        continuous: bool = False,
        blink: bool = False,
    ):
        if size < 36:  # the Nature CNN's three convolutions need 36 pixels
            raise ValueError(f"size must be >= 36, got {size}")
        self.observation_space = gym.spaces.Box(0, 255, (channels, size, size), np.uint8)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(2)
        self.continuous, self.blink = continuous, blink
        self.length, self.size, self.channels = length, size, channels
        self.render_mode = render_mode

    def _show(self) -> np.ndarray:
        shown = not (self.blink and self.t % 2)  # else noise only: the step asks for the half shown before
        if shown:
            self.side = int(self.np_random.integers(2))
        img = self.np_random.integers(0, 120, (self.channels, self.size, self.size), dtype=np.uint8)
        if not shown:
            self.img = img
            return img
        half = self.size // 2
        cols = slice(half, None) if self.side else slice(0, half)
        img[:, :, cols] += 100
        self.img = img
        return img

    def render(self) -> np.ndarray | None:
        """The image the agent sees now (its first channel), as RGB, for ``render_mode="rgb_array"``."""
        if self.render_mode != "rgb_array":
            return None
        return np.repeat(self.img[0][:, :, None], 3, axis=2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return self._show(), {}

    def step(self, action: Any) -> tuple:
        choice = int(np.asarray(action).item() > 0) if self.continuous else int(action)
        reward = float(choice == self.side)
        self.t += 1
        return self._show(), reward, False, self.t >= self.length, {}


class BrightHalfFlip(BrightHalf):
    """:class:`BrightHalf` as a ``Dict``: the image channels last under ``"pixels"`` and a ``"flip"`` of
    +-1 under ``"state"``; the action names the bright half, or with ``flip`` +1 the other one. Either
    entry alone earns 8 of 16: a policy must read both (:mod:`dagrl.spaces.mixed`). ``continuous``: a
    ``Box(-1, 1)`` action whose sign names the half, as :class:`BrightHalf`'s."""

    def __init__(self, size: int = 84, length: int = 16, render_mode: str | None = None, continuous: bool = False):
        super().__init__(size, 1, length, render_mode, continuous)
        self.observation_space = gym.spaces.Dict(
            {
                "pixels": gym.spaces.Box(0, 255, (size, size, 1), np.uint8),
                "state": gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
            }
        )

    def _show(self) -> dict[str, np.ndarray]:
        img = super()._show()
        self.flip = int(self.np_random.integers(2))
        return {"pixels": np.moveaxis(img, 0, -1), "state": np.array([2.0 * self.flip - 1.0], np.float32)}

    def step(self, action: Any) -> tuple:
        choice = int(np.asarray(action).item() > 0) if self.continuous else int(action)
        reward = float(choice == self.side ^ self.flip)
        self.t += 1
        return self._show(), reward, False, self.t >= self.length, {}


class LaterPayoff(gym.Env):
    """Two steps, where the better path pays only at the second, for telling off-policy corrections apart.

    At the first step action 0 goes on (reward 0) and any other ends the episode with 0.5; at the
    second, action 0 pays 1 and any other 0. The optimal return is 1 (0.98 at a discount of 0.98). A policy
    acting uniformly over ``actions`` earns ``1 / actions`` at the second step, less than the 0.5 of
    stopping at the first, so a learner that values the second step by that policy's data, as an
    uncorrected update of stale rollouts does, settles for 0.5. The observation is the step, one-hot.
    """

    def __init__(self, actions: int = 4):
        if actions < 3:
            raise ValueError(f"actions must be >= 3 (a uniform policy must earn under 0.5 later), got {actions}")
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(actions)

    def _obs(self) -> np.ndarray:
        return np.eye(2, dtype=np.float32)[self.t]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple:
        if self.t == 0 and int(action) == 0:
            self.t = 1
            return self._obs(), 0.0, False, False, {}
        reward = (0.5 if int(action) else 0.0) if self.t == 0 else float(int(action) == 0)
        return self._obs(), reward, True, False, {}


class Combination(gym.Env):
    """Each step a target of ``entries`` values in ``0..choices-1`` (one-hot in the observation); the
    action's entries that match it pay ``1 / entries`` each. ``binary: true``: two choices per entry, as a
    ``MultiBinary`` action space. 8 steps an episode."""

    def __init__(self, entries: int = 3, choices: int = 4, binary: bool = False, length: int = 8):
        choices = 2 if binary else choices
        if entries < 1 or choices < 2:
            raise ValueError(f"needs entries >= 1 and choices >= 2, got {entries} and {choices}")
        self.entries, self.choices, self.length = entries, choices, length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (entries * choices,), np.float32)
        self.action_space = gym.spaces.MultiBinary(entries) if binary else gym.spaces.MultiDiscrete([choices] * entries)

    def _draw(self) -> np.ndarray:
        self.target = self.np_random.integers(0, self.choices, self.entries)
        return np.eye(self.choices, dtype=np.float32)[self.target].ravel()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action: Any) -> tuple:
        reward = float(np.mean(np.asarray(action) == self.target))
        self.t += 1
        return self._draw(), reward, False, self.t >= self.length, {}


class KeepEntries(gym.ObservationWrapper):
    """Only the entries ``indices`` of a one-dimensional ``Box`` observation, in that order.

    >>> env = KeepEntries(gym.make("CartPole-v1"), indices=[0, 2])  # position and angle, no velocities
    >>> env.observation_space.shape, env.reset(seed=0)[0].shape
    ((2,), (2,))
    """

    def __init__(self, env: gym.Env, indices: Any):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"KeepEntries needs a one-dimensional Box observation, got {space}")
        self.indices = np.asarray(indices, np.int64)
        n = space.shape[0]
        if self.indices.ndim != 1 or not len(self.indices) or ((self.indices < 0) | (self.indices >= n)).any():
            raise ValueError(f"KeepEntries: indices must be a non-empty list within 0..{n - 1}, got {list(indices)}")
        self.observation_space = gym.spaces.Box(space.low[self.indices], space.high[self.indices], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.indices]


def make_atari(
    game: str = "Pong",
    noop_max: int = 30,
    frame_skip: int = 4,
    screen_size: int = 84,
    frame_stack: int = 4,
    episodic_life: bool = False,
    clip_rewards: bool = True,
    repeat_action_probability: float = 0.0,
    **kwargs: Any,
) -> gym.Env:
    """An ALE game with the standard DQN/PPO preprocessing (see the module docstring)."""
    try:
        import ale_py
    except ImportError:
        raise gym.error.DependencyNotInstalled('Atari needs ale-py: pip install "dagrl[atari]"') from None
    from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation

    gym.register_envs(ale_py)
    kwargs.setdefault("obs_type", "grayscale")  # what the preprocessing reads anyway (module docstring)
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=repeat_action_probability, **kwargs)
    env = AtariPreprocessing(
        env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size, terminal_on_life_loss=episodic_life
    )
    env = FrameStackObservation(env, frame_stack)
    return ClipReward(env, -1.0, 1.0) if clip_rewards else env


if "Atari-v0" not in gym.registry:
    gym.register("Atari-v0", entry_point=make_atari)

if "BrightHalf-v0" not in gym.registry:
    gym.register("BrightHalf-v0", entry_point=BrightHalf)

if "BrightHalfFlip-v0" not in gym.registry:
    gym.register("BrightHalfFlip-v0", entry_point=BrightHalfFlip)

if "CostlyCartPole-v0" not in gym.registry:
    gym.register("CostlyCartPole-v0", entry_point=CostlyCartPole, max_episode_steps=500, reward_threshold=475.0)

if "Combination-v0" not in gym.registry:
    gym.register("Combination-v0", entry_point=Combination)

if "LaterPayoff-v0" not in gym.registry:
    gym.register("LaterPayoff-v0", entry_point=LaterPayoff)

if "PettingZoo-v0" not in gym.registry:  # a graph's env.api: pettingzoo (dagrl.envs.agents)
    gym.register("PettingZoo-v0", entry_point="dagrl.envs.agents:PettingZooGame", disable_env_checker=True)
