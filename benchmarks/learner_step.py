"""What one CPU gradient step of PPO's learner costs: dagrl's against torch's stock parts.

    dagrl bench learner-step [--hidden 64 256] [--minibatch 256] [--steps 300] [--rounds 5]

One step of :func:`~dagrl.algos.common.epochs.train_epochs` on CartPole's spaces: forward through the
actor-critic, :func:`~dagrl.algos.common.epochs.clipped_loss`, backward, clipping, Adam. On a small
network this is mostly per-operation overhead, and under ``async`` on a small machine it sets the
learner's pace (BENCHMARKS.md, scaling). Three setups, one torch thread, alternated ``rounds`` times:

* **stock**: torch's ``Categorical``, Adam's ``foreach`` form, ``clip_grad_norm_`` over
  ``parameters()``, the entropy in the loss (``ent_coef`` 0.01): what dagrl's learner did before.
* **dagrl, ent_coef 0.01**: the lean :class:`~dagrl.algos.common.distributions.Categorical`, fused Adam
  (:func:`dagrl.nn.optim.adam`), the parameter list made once.
* **dagrl, ent_coef 0**: as the CartPole graphs run it: the entropy only logged, outside autograd.

Reported: ms per step (median over rounds) and its ratio to stock in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import torch
from _common import emit, table

from dagrl.algos.common.actor_critic import ActorCritic, Config
from dagrl.algos.common.epochs import clipped_loss
from dagrl.nn.optim import adam

SETUPS = ("stock", "dagrl, ent_coef 0.01", "dagrl, ent_coef 0")


def stepper(setup: str, hidden: int, minibatch: int, batch: int = 1024):
    """A function taking one gradient step of ``setup`` on a random minibatch of a fixed batch."""
    env = gym.make("CartPole-v1")
    torch.manual_seed(0)
    agent = ActorCritic(env.observation_space, env.action_space, hidden)
    cfg = Config(minibatch_size=minibatch, ent_coef=0.0 if setup.endswith(" 0") else 0.01)
    g = torch.Generator().manual_seed(1)
    obs, actions = torch.randn(batch, 4, generator=g), torch.randint(0, 2, (batch,), generator=g)
    logprobs, adv, ret = torch.full((batch,), -0.69), torch.randn(batch, generator=g), torch.randn(batch, generator=g)
    stock = setup == "stock"
    if stock:
        optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3, eps=1e-5, foreach=True)
    else:
        optimizer = adam(agent.parameters(), 1e-3, "cpu", eps=1e-5)
    params = list(agent.parameters())

    def step() -> None:
        idx = torch.randperm(batch, generator=g)[:minibatch]
        if stock:
            features = agent.features(obs[idx])
            dist = torch.distributions.Categorical(logits=agent.actor(features), validate_args=False)
            value = agent.critic(features).squeeze(-1)
        else:
            dist, value = agent.dist_value(obs[idx])
        loss, _ = clipped_loss(cfg, dist, value, actions[idx], logprobs[idx], adv[idx], ret[idx])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters() if stock else params, cfg.max_grad_norm)
        optimizer.step()

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 256], help="the MLPs' width (CartPole's graphs: 64)")
    p.add_argument("--minibatch", type=int, default=256)
    p.add_argument("--steps", type=int, default=300, help="timed steps per setup and round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)  # as a learner role runs (torch_threads: 1)
    rows = []
    for hidden in args.hidden:
        steps = {s: stepper(s, hidden, args.minibatch) for s in SETUPS}
        times: dict[str, list[float]] = {s: [] for s in SETUPS}
        for _ in range(args.rounds):
            for setup, step in steps.items():
                for _ in range(30):  # warm
                    step()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    step()
                times[setup].append((time.perf_counter() - t0) / args.steps * 1e3)
        stock = statistics.median(times["stock"])
        for setup in SETUPS:
            ms = statistics.median(times[setup])
            rows.append({"hidden": hidden, "setup": setup, "ms_per_step": ms, "vs_stock": ms / stock})
            print(f"hidden {hidden}, {setup}: {ms:.3f} ms a step ({ms / stock:.2f} x stock)", flush=True)
    print(table(rows, ["hidden", "setup", "ms_per_step", "vs_stock"]))
    emit("learner-step", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
