"""MPE simple_spread as the MAPPO authors' code runs it, on mpe2's engine.

The MAPPO paper's MPE figures come from its own copy of MPE (``marlbenchmark/on-policy``), which differs
from mpe2's ``simple_spread_v3`` in two ways that move the return:

* **When a push moves an agent.** MAPPO's world damps the velocity, adds the step's force, then moves
  the agent by the new velocity, so an action moves its agent in the step it is taken. mpe2 moves the
  agent by the old velocity first, so an action shows in the agent's position one step later.
* **Where landmarks start.** MAPPO's copy draws them in ``[-0.8, 0.8]^2``, mpe2 in ``[-1, 1]^2``.

Everything else (sizes, damping, forces, observations, the 25-step games) is the same. A graph names it
as ``env: {id: "dagrl.envs.mpe:simple_spread_mappo", api: pettingzoo, kwargs: {N: 3}}``; rewards follow
mpe2's ``local_ratio`` as ``simple_spread_v3`` does, so the multi-agent guide's conversion to MAPPO's
units holds for both.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import numpy as np
from gymnasium.utils import EzPickle
from mpe2._mpe_utils.simple_env import SimpleEnv, make_env
from mpe2.simple_spread.simple_spread import Scenario
from pettingzoo.utils.conversions import parallel_wrapper_fn

__all__ = ["LANDMARK_SPAN", "simple_spread_mappo"]

LANDMARK_SPAN = 0.8
"""Landmarks start uniformly in ``[-LANDMARK_SPAN, LANDMARK_SPAN]^2``, as in MAPPO's copy of MPE."""


def _integrate_velocity_first(world: Any, p_force: list[Any]) -> None:
    """Damp, push, cap the speed, then move by the new velocity (semi-implicit Euler)."""
    for entity, force in zip(world.entities, p_force, strict=True):
        if not entity.movable:
            continue
        velocity = entity.state.p_vel * (1 - world.damping)
        if force is not None:
            velocity = velocity + force / entity.mass * world.dt
        speed = float(np.hypot(*velocity))
        if entity.max_speed is not None and speed > entity.max_speed:
            velocity = velocity / speed * entity.max_speed
        entity.state.p_vel = velocity
        entity.state.p_pos += velocity * world.dt


class _Spread(Scenario):
    def make_world(self, N: int = 3) -> Any:
        world = super().make_world(N)
        world.integrate_state = MethodType(_integrate_velocity_first, world)
        return world

    def reset_world(self, world: Any, np_random: np.random.Generator) -> None:
        super().reset_world(world, np_random)
        for landmark in world.landmarks:
            landmark.state.p_pos *= LANDMARK_SPAN


class _SpreadEnv(SimpleEnv, EzPickle):
    def __init__(
        self,
        N: int = 3,
        local_ratio: float = 0.5,
        max_cycles: int = 25,
        continuous_actions: bool = False,
        render_mode: str | None = None,
    ) -> None:
        EzPickle.__init__(self, N, local_ratio, max_cycles, continuous_actions, render_mode)
        scenario = _Spread()
        SimpleEnv.__init__(
            self,
            scenario=scenario,
            world=scenario.make_world(N),
            render_mode=render_mode,
            max_cycles=max_cycles,
            continuous_actions=continuous_actions,
            local_ratio=local_ratio,
        )
        self.metadata["name"] = "simple_spread_mappo"


simple_spread_mappo = parallel_wrapper_fn(make_env(_SpreadEnv))
"""A PettingZoo parallel simple_spread with MAPPO's dynamics and landmark span; takes ``N``,
``local_ratio``, ``max_cycles``, ``continuous_actions`` and ``render_mode`` as ``simple_spread_v3``."""
