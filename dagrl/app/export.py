"""``dagrl export``: a run's greedy policy as one ``torch.export`` file that needs only torch to act.

The policy is the one ``dagrl eval`` plays: the algorithm's ``evaluate`` fragment is run once on the
checkpoint's weights, in this process, with an :class:`~dagrl.algos.common.evaluation.EpisodeRunner` that keeps the
action function it is handed instead of playing episodes (argmax of Q, the most likely action, the
squashed mean). That function and the network it calls are exported with ``torch.export`` (a batch
dimension of any size; TorchScript, the older route, is deprecated in torch 2.13) and saved with what
it was made from in an extra file ``dagrl.json`` (env id, kwargs and ``env.wrappers``, observation and
action spaces, algorithm, checkpoint).

Using it, in any process with torch::

    policy = torch.export.load("policy.pt2").module()
    actions = policy(torch.as_tensor(observations))   # a batch: (B, *observation shape)

A recurrent policy (``ppo_lstm``) takes its state besides the observations and returns the state after
them; ``dagrl.json``'s ``"state"`` lists the state's tensors, zeros at an episode's first step::

    h, c = torch.zeros(n, 128), torch.zeros(n, 128)    # n envs; the shapes in dagrl.json's "state"
    actions, h, c = policy(torch.as_tensor(observations), h, c)
    h[done], c[done] = 0.0, 0.0                          # the envs whose episode ended

Observations are what dagrl's envs give, in the observation space's dtype (``float32`` vectors,
``uint8`` images): the env made with the graph's ``env.kwargs`` and ``env.wrappers``, then
:func:`dagrl.envs.vector.vector_observations` (``dagrl.envs.vector.make_env`` does both; float ``Box``
observations and ``(C, H, W)`` ``uint8`` images are the env's own). Actions come back as the env takes
them (``Box`` actions clipped to the space's bounds); observation statistics a network normalises with
(PPO's ``norm_obs``) are inside it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from dagrl.core.schema import ConfigError

__all__ = ["Exported", "GreedyPolicy", "RecurrentGreedyPolicy", "export_policy"]


class GreedyPolicy(nn.Module):
    """``act(obs)`` over ``net``'s parameters (observations cast to ``float32`` as the evaluator's are), ``Box``
    actions clipped to the space."""

    def __init__(self, net: nn.Module, act: Any, action_space: gym.Space):
        super().__init__()
        self.net, self.act = net, act
        self.clip = isinstance(action_space, gym.spaces.Box)
        if self.clip:
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.clipped(self.act(obs.to(torch.float32)))

    def clipped(self, action: torch.Tensor) -> torch.Tensor:
        return torch.max(torch.min(action, self.high), self.low) if self.clip else action


class RecurrentGreedyPolicy(GreedyPolicy):
    """A policy that carries a state between steps (``act.recurrent``, as ``ppo_lstm``'s): ``forward(obs,
    *state)`` returns the actions and the state after them, by ``act.step``."""

    def forward(self, obs: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        action, *after = self.act.step(obs.to(torch.float32), *state)
        return (self.clipped(action), *after)


@dataclass
class Exported:
    path: Path
    info: dict[str, Any]

    def line(self) -> str:
        i = self.info
        state = "".join(f", state {tuple(t['shape'])}" for t in i.get("state", []))
        env = i["env"].get("name", i["env"]["id"])
        return (
            f"{i['algorithm']} on {env}: greedy policy of {Path(i['checkpoint']).name} (iteration "
            f"{i['iteration']}, {i['env_steps']:,} env steps) -> {self.path}; observations "
            f"{tuple(i['observation']['shape'])} {i['observation']['dtype']}{state} in, actions {i['action']['space']}"
            f"{' and the state' if state else ''} out"
        )


FORMATS = {"torch": ".pt2", "onnx": ".onnx"}
"""What ``--format`` takes, and each one's file suffix."""


def export_policy(
    run: str | Path,
    out: str | Path | None = None,
    overrides: list[str] | None = None,
    group: str | None = None,
    fmt: str = "torch",
) -> Exported:
    """Write the greedy policy of the checkpoint ``run`` names (a run directory's newest, or one file) to
    ``out`` (default ``<run>/export/<checkpoint>.pt2``, ``.onnx`` for ``fmt="onnx"``); check that the file
    read back acts as the evaluator does on observations from the env.

    ``fmt="onnx"`` (the ``onnx`` extra) writes an ONNX model instead, made by torch's exporter, checked in
    onnxruntime; its inputs are named ``obs`` (then ``state0``, ``state1``, ...), its outputs ``action``
    (then the state after it), and ``dagrl.json`` is its metadata entry of that name.

    ``group`` (a multi-agent run): only that group's policy, taking the rows of its agents ``[B, k, W]``
    and returning their actions ``[B, k]`` (``dagrl.json`` names the agents, in order)."""
    from dagrl.app.agent import capture
    from dagrl.app.evaluate import load_run

    if fmt not in FORMATS:
        raise ConfigError("dagrl export", "--format", f"{fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "onnx":
        _onnx_installed()
    run_dir, ckpt = load_run(run, "dagrl export")
    with capture(run_dir, ckpt, list(overrides or [])) as (graph, runner, acts):
        act = acts[True]
        recurrent = getattr(act, "recurrent", False)
        kind = RecurrentGreedyPolicy if recurrent else GreedyPolicy
        policy = kind(runner.net, act, runner.envs.single_action_space)
        obs = _observations(runner.envs, 32)
    agents = None
    state = act.initial_state(len(obs)) if recurrent else ()
    if group is not None:
        policy, members = _group_policy(runner.net, group, graph.spec.algorithm)
        agents = [graph.observation_space.agents[a] for a in members]
        obs, state = obs[:, members], tuple(s[:, members] for s in state)
    policy.eval().requires_grad_(False)
    args = (obs, *state)
    batch = {0: torch.export.Dim.DYNAMIC}  # every input's first dimension: the batch
    shapes = {"obs": batch, **({"state": (batch,) * (len(args) - 1)} if recurrent else {})}
    with warnings.catch_warnings():  # nn.LSTM re-assigns its flat weight list when traced; harmless (checked below)
        warnings.filterwarnings("ignore", message=r".*_flat_weights.*assigned during export", category=UserWarning)
        program = torch.export.export(policy, args, dynamic_shapes=shapes)
    counters = ckpt.get("counters", {})
    space = graph.observation_space
    info = {
        "format": 1,
        "algorithm": graph.spec.algorithm,
        "env": {
            "id": graph.env_id,
            "kwargs": graph.env_kwargs,
            "wrappers": graph.spec.env.wrappers,
            "name": graph.spec.env.id,  # as the graph names it: a PettingZoo game's, not the wrapper's id
        },  # fmt: skip
        "observation": {"shape": list(space.shape), "dtype": str(space.dtype)},
        "action": {"space": str(graph.action_space)},
        "checkpoint": ckpt["path"],
        "iteration": int(counters.get("iteration", 0)),
        "env_steps": int(counters.get("env_steps", 0)),
    }
    if agents is not None:  # one group's policy: its agents' rows in, their actions out
        info["group"], info["agents"] = group, agents
        info["observation"]["shape"] = [len(agents), *space.shape[1:]]
    if recurrent:  # what to pass besides the observations: each entry zeros of [batch, *shape] at first
        info["state"] = [{"shape": list(s.shape[1:]), "dtype": str(s.dtype).removeprefix("torch.")} for s in args[1:]]
    path = Path(out) if out is not None else run_dir / "export" / f"{Path(ckpt['path']).stem}{FORMATS[fmt]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "onnx":
        _save_onnx(path, program, policy, args, info)
        return Exported(path, info)
    archive = io.BytesIO()  # torch wants a file named *.pt2 or a buffer; the file then replaces the old at once
    torch.export.save(program, archive, extra_files={"dagrl.json": json.dumps(info)})
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(archive.getvalue())
    tmp.replace(path)
    _check(path, policy, args)
    return Exported(path, info)


def _onnx_installed() -> None:
    try:
        import onnxruntime  # noqa: F401  (the check runs the model in it)
        import onnxscript  # noqa: F401  (torch's ONNX exporter needs it)
    except ImportError:
        raise ConfigError(
            "dagrl export", "--format", "onnx needs onnxscript and onnxruntime: pip install 'dagrl[onnx]'"
        ) from None


def _save_onnx(
    path: Path, program: torch.export.ExportedProgram, policy: nn.Module, args: tuple, info: dict[str, Any]
) -> None:
    """``program`` as an ONNX model at ``path``, ``info`` in its metadata; checked in onnxruntime
    (:func:`_acts_alike`) before it replaces what was there."""
    import onnxruntime

    n = len(args) - 1
    names = ["obs", *(f"state{i}" for i in range(n))]
    outputs = ["action", *(f"state{i}_after" for i in range(n))]
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")  # "torchvision is not installed"
    level = registry.level
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # the exporter's progress lines
        warnings.simplefilter("ignore")  # its deprecation notices about torch's own internals
        registry.setLevel(logging.ERROR)
        try:
            onnx = torch.onnx.export(program, input_names=names, output_names=outputs, dynamo=True, verbose=False)
        finally:
            registry.setLevel(level)
    onnx.model.metadata_props["dagrl.json"] = json.dumps(info)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(str(tmp))
    session = onnxruntime.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])

    def run(*x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = {k: v.numpy() for k, v in zip(names, x, strict=True)}
        return tuple(torch.as_tensor(out) for out in session.run(None, feed))

    if not _acts_alike(policy, run, args, atol=1e-4):
        tmp.unlink()
        raise RuntimeError(f"{path}: the ONNX policy acts unlike the evaluator's in onnxruntime; not written")
    tmp.replace(path)


class GroupPolicy(nn.Module):
    """One group's greedy policy of a multi-agent network (:meth:`AgentsActorCritic.group_greedy`); with
    GRU policies it also takes their states and returns the states after the step."""

    def __init__(self, net: nn.Module, group: str):
        super().__init__()
        self.net, self.group = net, group

    def forward(self, obs: torch.Tensor, *state: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self.net.group_greedy(obs.to(torch.float32), self.group, *state)


def _group_policy(net: nn.Module, group: str, algorithm: str) -> tuple[nn.Module, list[int]]:
    from dagrl.core.schema import closest

    names = getattr(net, "names", None)
    if names is None or not hasattr(net, "group_greedy"):
        raise ConfigError("--group", "", f"{group}: algorithm {algorithm} has no agent groups (a multi-agent run has)")
    if group not in names:
        raise ConfigError("--group", "", f"{group}: no such group in this run ({closest(group, names, 'groups')})")
    return GroupPolicy(net, group), net.members(group)


def _observations(envs: Any, steps: int) -> torch.Tensor:
    """A batch of observations from ``steps`` random-action steps of ``envs``, for tracing and checking."""
    seen, (obs, _) = [], envs.reset(seed=12_345)
    envs.action_space.seed(12_345)
    for _ in range(steps):
        seen.append(obs)
        obs = envs.step(envs.action_space.sample())[0]
    return torch.as_tensor(np.concatenate(seen))


def _check(path: Path, policy: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    """The file read back acts as ``policy`` (:func:`_acts_alike`)."""
    loaded = torch.export.load(path).module()
    if not _acts_alike(policy, lambda *x: _outputs(loaded(*x)), args, atol=1e-5):
        path.unlink()
        raise RuntimeError(f"{path}: the exported policy acts unlike the evaluator's; removed")


def _acts_alike(policy: nn.Module, run: Any, args: tuple[torch.Tensor, ...], atol: float) -> bool:
    """``run`` (an exported form of ``policy``, its outputs as a tuple) gives ``policy``'s outputs on ``args``
    (the observations, then any state), on the first row alone, and for a recurrent policy also from the
    state its first step left."""
    inputs = [args, tuple(a[:1] for a in args)]
    with torch.no_grad():
        if len(args) > 1:
            inputs.append((args[0], *_outputs(policy(*args))[1:]))
        pairs = [(w, g) for x in inputs for w, g in zip(_outputs(policy(*x)), run(*x), strict=True)]
    return all(w.shape == g.shape and torch.allclose(w.float(), g.float(), atol=atol) for w, g in pairs)


def _outputs(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, tuple | list) else (out,)
