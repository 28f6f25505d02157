"""Update frame rate of DQN's learner with and without CUDA graphs (``cuda_graphs``), on a CUDA device.

    dagrl bench cuda-graphs [--batch 32 256] [--seconds 3] [--nets atari-cnn atari-impala cartpole-mlp]

Transitions consumed by gradient updates per second (Spreeze's metric) through DQN's ``update``
fragment, called in-process with 32 gradient steps per call: the Nature CNN on Atari-shaped uint8
batches (4 x 84 x 84, the Ape-X DQN learner of ``graphs/dqn-atari-apex.yaml``), IMPALA's residual CNN
on the same (``cnn: impala``: 15 small convolutions, more kernel launches per step) and the 128-unit
MLP on CartPole-shaped ones. Eager and captured learners alternate twice in one run; the ratio is
captured / eager. SAC's frame rate is ``dagrl bench sac-pendulum --frames-only --cuda-graphs``.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from _common import emit, table

from dagrl.algos import dqn
from dagrl.core.context import RoleContext
from dagrl.replay.store import Sample
from dagrl.replay.synthetic import random_sample

STEPS = 32
ATARI = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
NETS = {
    "atari-cnn": (ATARI, "nature"),
    "atari-impala": (ATARI, "impala"),
    "cartpole-mlp": (gym.spaces.Box(-5, 5, (4,), np.float32), "nature"),
}


def learner(space: gym.Space, batch: int, graphs: bool, device: str, cnn: str = "nature") -> dqn.LearnerState:
    cfg = dqn.Config(
        batch_size=batch, gradient_steps=STEPS, cuda_graphs=graphs, hidden=128, target_update=1000, cnn=cnn
    )
    ctx = RoleContext(
        "learner", 0, 1, 0, "bench", device=device, observation_space=space, action_space=gym.spaces.Discrete(6)
    )
    return dqn.learner(ctx, cfg)


def rate(state: dqn.LearnerState, batch: list[Sample], seconds: float) -> float:
    dqn.update(state, batch)  # warm (and, with graphs, capture)
    dqn.update(state, batch)
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        dqn.update(state, batch)  # reads its losses back: each call ends synchronised
        calls += 1
    return calls * STEPS * state.cfg.batch_size / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    args = p.parse_args()
    if torch.device(args.device).type != "cuda":
        print(f"on {args.device} both learners step as written: the ratio only checks the benchmark itself")
    results = []
    for name in args.nets:
        space, cnn = NETS[name]
        for b in args.batch:
            data = [random_sample(space, gym.spaces.Discrete(6), b * STEPS, terminal=0.01)]
            eager, graphs = learner(space, b, False, args.device, cnn), learner(space, b, True, args.device, cnn)
            r = {"eager": [], "graphs": []}
            for _ in range(2):
                r["eager"].append(rate(eager, data, args.seconds))
                r["graphs"].append(rate(graphs, data, args.seconds))
            e, g = float(np.mean(r["eager"])), float(np.mean(r["graphs"]))
            assert graphs.step.captured == graphs.step.enabled, "the captured learner never captured"
            results.append({"net": name, "batch": b, "eager_fps": e, "graphs_fps": g, "ratio": g / e})
            print(f"{name} batch {b}: eager {e:,.0f} /s, CUDA graphs {g:,.0f} /s: {g / e:.2f} x", flush=True)
    print(table(results, ["net", "batch", "eager_fps", "graphs_fps", "ratio"]))
    device = torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else args.device
    emit("cuda-graphs", {"device": device, "results": results})


if __name__ == "__main__":
    main()
