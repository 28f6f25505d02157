"""What an image encoder costs a sampler that acts for itself: the Nature CNN against IMPALA's residual
CNN, beside the env step they act between.

    dagrl bench encoders [--game Pong] [--envs 8] [--batch 64] [--threads 1] [--rounds 5] [--device cpu]

For each encoder (``hyperparameters.cnn``): parameters, the forward of one vector step's observations
(``envs`` rows: what a sampler runs every env step) and a forward and backward of ``batch`` rows (a
learner's gradient step), on the Atari preset's observations (84 x 84, 4 frames); and the env step itself,
``envs`` envs of ``game`` in one gymnasium sync vector env. Timings alternate between the encoders in
``rounds`` rounds and report medians, with torch on ``threads`` threads (a sampler's one by default).
``forward_share`` is the forward's part of a sampler's step (forward + env step): what central inference
can take off a sampler at best, paying a round trip per step instead.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import emit, table

from dagrl.nn.encoders import CNNS


def timed(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--game", default="Pong")
    p.add_argument("--envs", type=int, default=8, help="envs per sampler: the rows of its forward")
    p.add_argument("--batch", type=int, default=64, help="rows of the learner's forward and backward")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    import gymnasium as gym

    import dagrl.envs  # noqa: F401  (registers the Atari preset)

    torch.set_num_threads(args.threads)
    envs = gym.make_vec("dagrl.envs:Atari-v0", num_envs=args.envs, vectorization_mode="sync", game=args.game)
    obs, _ = envs.reset(seed=1)
    shape = obs.shape[1:]
    nets = {name: cls(shape[0], tuple(shape[1:])).to(args.device) for name, cls in CNNS.items()}
    act = torch.as_tensor(obs, device=args.device)
    learn = torch.randint(0, 256, (args.batch, *shape), dtype=torch.uint8, device=args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def forward(net):
        with torch.no_grad():
            net(act)
        sync()

    def gradient(net):
        net(learn).square().mean().backward()
        sync()

    samples = {name: {"forward_ms": [], "fwd_bwd_ms": []} for name in nets}
    env_ms = []
    for r in range(args.rounds):
        env_ms.append(1e3 * timed(lambda: envs.step(envs.action_space.sample()), 50))
        for name in list(nets) if r % 2 == 0 else list(nets)[::-1]:
            samples[name]["forward_ms"].append(1e3 * timed(lambda n=nets[name]: forward(n), 20))
            samples[name]["fwd_bwd_ms"].append(1e3 * timed(lambda n=nets[name]: gradient(n), 3))
    envs.close()
    env_step = statistics.median(env_ms)
    rows = []
    for name, net in nets.items():
        fwd = statistics.median(samples[name]["forward_ms"])
        rows.append({
            "cnn": name, "params": sum(p.numel() for p in net.parameters()), "features": net.features,
            "forward_ms": fwd, "fwd_bwd_ms": statistics.median(samples[name]["fwd_bwd_ms"]),
            "env_step_ms": env_step, "forward_share": fwd / (fwd + env_step),
        })  # fmt: skip
    base = rows[0]
    for r in rows:
        r["forward / nature"] = r["forward_ms"] / base["forward_ms"]
        r["fwd_bwd / nature"] = r["fwd_bwd_ms"] / base["fwd_bwd_ms"]
    print(f"{args.game}, observations {tuple(shape)}; forward of {args.envs} rows, forward + backward of")
    print(f"{args.batch}; {args.envs} envs stepped in one vector env; torch on {args.threads} thread(s), {args.device}")
    print(table(rows, list(rows[0])))
    emit("encoders", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
