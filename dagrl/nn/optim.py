"""The learners' optimizer, in its fastest form for the device.

On a small network the cost of a CPU gradient step is mostly per-tensor overhead, not arithmetic: for
PPO's two 64-unit MLPs on 256 rows, Adam's fused kernel takes 0.15 ms a step where its ``foreach``
form takes 0.35, of about 1.7 ms in all. That sets the learner's pace under ``async`` whenever it,
not the samplers, is the bottleneck (BENCHMARKS.md, scaling).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

FUSED = ("cpu", "cuda")
"""Devices with a fused Adam kernel; elsewhere (``mps``, ...) Adam's ``foreach`` form."""


def adam(params: Iterable[nn.Parameter], lr: float, device: str | torch.device, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam, fused into one kernel per step where the device has one. Its weights differ from the
    ``foreach`` form's in the last bit now and then (the same arithmetic, ordered otherwise)."""
    if torch.device(device).type in FUSED:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    return torch.optim.Adam(params, lr=lr, eps=eps, foreach=True)


def load_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """``optimizer.load_state_dict(state)``, keeping the learning rate (and the other options) each
    parameter group had: those of the graph the run goes on with, which may differ from the run's that
    wrote the checkpoint (``--set hyperparameters.lr=...`` on a resume; a PBT member's perturbed rate).
    What the optimizer learnt (Adam's moments, its step counts) is the checkpoint's."""
    options = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, kept in zip(optimizer.param_groups, options, strict=True):
        group.update(kept)
