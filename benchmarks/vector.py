"""One sampler's env steps/s with each vector backend: gymnasium's sync vector env vs EnvPool or threads.

    dagrl bench vector [--tasks cartpole pong costly-sleep] [--backends sync envpool threads] [--envs 8]
                       [--seconds 4] [--rounds 3]

For each task and backend, in one process with torch on one thread, two rates over ``seconds``:

* **env**: the vector env alone, random actions (what the simulator and its wrappers cost);
* **collect**: PPO's ``collect`` fragment (env steps plus the policy's forward: the 64x64 MLP on
  CartPole, the Nature CNN on Pong), which is what a sampler runs.

Backends alternate within each round; the table gives medians over rounds, and each ``backend / sync``
is taken within each round before the median. ``envpool`` steps its envs in EnvPool's C++ threads
(its default thread count) behind :class:`dagrl.envs.vector.EnvPoolVector`; ``threads`` steps each env in
a thread of its own (:class:`dagrl.envs.vector.ThreadVectorEnv`), for envs that wait: ``costly-sleep`` is
CartPole sleeping 1 ms a step (``dagrl.envs:CostlyCartPole-v0``), a remote simulator's stand-in.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import emit, table

from dagrl.algos import ppo
from dagrl.algos.common import actor_critic
from dagrl.core.context import RoleContext

TASKS = {
    "cartpole": ("CartPole-v1", {}, 32),
    "pong": ("dagrl.envs:Atari-v0", {"game": "Pong"}, 32),
    "costly-sleep": ("dagrl.envs:CostlyCartPole-v0", {"step_ms": 1.0, "cost": "sleep"}, 32),
}
BACKENDS = ("sync", "envpool", "threads")


def sampler(task: str, backend: str, envs: int) -> actor_critic.SamplerState:
    env_id, kwargs, steps = TASKS[task]
    ctx = RoleContext("sampler", 0, 1, seed=0, env_id=env_id, env_kwargs=kwargs, num_envs=envs, vector=backend)
    return ppo.sampler(ctx, ppo.Config(num_steps=steps))


def rates(state: actor_critic.SamplerState, seconds: float) -> dict[str, float]:
    weights = {k: v.detach().numpy().copy() for k, v in state.agent.state_dict().items()}
    ppo.collect(state, weights)  # warm-up
    out = {}
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += ppo.collect(state, weights).env_steps
    out["collect"] = done / (time.perf_counter() - t0)
    envs, n = state.envs, state.envs.num_envs
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        envs.step(envs.action_space.sample())
        done += n
    out["env"] = done / (time.perf_counter() - t0)
    return out


def main() -> None:
    import torch

    p = argparse.ArgumentParser(prog="dagrl bench vector", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["cartpole", "pong"], choices=list(TASKS))
    p.add_argument("--backends", nargs="+", default=["sync", "envpool"], choices=BACKENDS)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)

    backends = ["sync", *(b for b in args.backends if b != "sync")]  # each compared with sync
    others = backends[1:]
    rows, result = [], {"envs": args.envs, "seconds": args.seconds, "rounds": args.rounds, "tasks": {}}
    for task in args.tasks:
        states = {b: sampler(task, b, args.envs) for b in backends}
        measured = {b: [] for b in backends}
        for _ in range(args.rounds):
            for b in backends:
                measured[b].append(rates(states[b], args.seconds))
        for state in states.values():
            state.envs.close()
        summary = {}
        for what in ("env", "collect"):
            per = {b: statistics.median(r[what] for r in measured[b]) for b in backends}
            ratios = {
                b: statistics.median(x[what] / s[what] for x, s in zip(measured[b], measured["sync"], strict=True))
                for b in others
            }
            summary[what] = {
                **per,
                **{f"{b}_vs_sync": ratios[b] for b in others},
                "rounds": {b: [r[what] for r in measured[b]] for b in backends},
            }
            rows.append(
                {
                    "task": task,
                    "rate": what,
                    **{b: round(per[b]) for b in backends},
                    **{f"{b} / sync": round(ratios[b], 2) for b in others},
                }
            )
        result["tasks"][task] = summary
    print(table(rows, ["task", "rate", *backends, *(f"{b} / sync" for b in others)]))
    emit("vector", result)


if __name__ == "__main__":
    main()
