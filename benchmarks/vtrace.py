"""What V-trace buys when rollouts are stale: IMPALA with and without the correction, lag forced.

    dagrl bench vtrace [--lags 0 4 16] [--seeds 0 1 2] [--iterations 150] [--lr 1e-3] [--epochs 4]
        [--env CartPole-v1]

In one process per (lag, seed, setting), no Dask: a sampler (8 envs x 32 steps) always acts
with the weights the learner had ``lag`` updates ago; the learner (``dagrl.algos.impala.update``)
runs ``epochs`` gradient steps per rollout with V-trace (``vtrace: true``) or with every importance
ratio taken as 1 (``vtrace: false``: the same update, uncorrected). Two scores after ``iterations``
updates: the mean return of the sampler's last 30 episodes (acting ``lag`` updates behind), and the
learner's own, acting greedily over 10 episodes. A lag of at least ``iterations`` keeps the first
weights throughout. ``--env dagrl.envs:LaterPayoff-v0`` is a task built so that an uncorrected learner
goes wrong on stale data (:class:`dagrl.envs.registry.LaterPayoff`). Runs in parallel on the machine's cores.
"""

from __future__ import annotations

import argparse
import collections
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from _common import emit, table


def score(vtrace: bool, lag: int, seed: int, args: argparse.Namespace) -> tuple[float, float]:
    import gymnasium as gym
    import torch

    from dagrl.algos import impala, ppo
    from dagrl.core.context import RoleContext

    torch.set_num_threads(1)
    cfg = impala.Config(vtrace=vtrace, lr=args.lr, update_epochs=args.epochs, eval_episodes=10)
    env = gym.make(args.env)
    spaces = {"observation_space": env.observation_space, "action_space": env.action_space}
    sampler = ppo.sampler(RoleContext("sampler", 0, 1, seed=seed, env_id=args.env, num_envs=8), cfg)
    learner = impala.learner(RoleContext("learner", 0, 1, seed=seed + 1, env_id=args.env, **spaces), cfg)
    evaluator = ppo.evaluator(RoleContext("evaluator", 0, 1, seed=seed + 2, env_id=args.env), cfg)
    history: collections.deque = collections.deque(maxlen=lag + 1)
    returns: list[float] = []
    for _ in range(args.iterations):
        history.append(ppo.publish(learner))
        rollout = ppo.collect(sampler, history[0])  # the weights of `lag` updates ago
        returns.extend(rollout.episodes.returns.tolist())
        impala.update(learner, [rollout])
    greedy = ppo.evaluate(evaluator, ppo.publish(learner))["eval/return_mean"]
    return float(np.mean(returns[-30:])), float(greedy)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lags", type=int, nargs="+", default=[0, 4, 16])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--env", default="CartPole-v1", help="a gymnasium env id with discrete actions")
    args = p.parse_args()
    jobs = [(v, lag, seed) for lag in args.lags for seed in args.seeds for v in (True, False)]
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        futures = {job: pool.submit(score, *job, args) for job in jobs}
        scores = {job: f.result() for job, f in futures.items()}
    rows = []
    for lag in args.lags:
        corrected = [scores[(True, lag, s)] for s in args.seeds]
        plain = [scores[(False, lag, s)] for s in args.seeds]
        rows.append({
            "lag": lag, "vtrace": float(np.mean([c[0] for c in corrected])),
            "uncorrected": float(np.mean([p[0] for p in plain])),
            "vtrace greedy": float(np.mean([c[1] for c in corrected])),
            "uncorrected greedy": float(np.mean([p[1] for p in plain])),
            "vtrace per seed": " ".join(f"{x:.3g}/{y:.3g}" for x, y in corrected),
            "uncorrected per seed": " ".join(f"{x:.3g}/{y:.3g}" for x, y in plain),
        })  # fmt: skip
    print(f"\nIMPALA on {args.env} after {args.iterations} updates: mean return of the sampler's last 30 episodes,")
    print("and of the learner's 10 greedy episodes (per seed: sampler/greedy)")
    cols = ["lag", "vtrace", "uncorrected", "vtrace greedy", "uncorrected greedy", "vtrace per seed"]
    print(table(rows, [*cols, "uncorrected per seed"]))
    emit("vtrace", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
