"""Gradient steps replayed from a CUDA graph, for learners whose networks are too small to keep a GPU busy.

A gradient step of SAC's 128-unit networks is a few hundred small kernels; on a GPU its time is the
CPU launching them, whatever the batch (BENCHMARKS.md, "SAC update frame rate on the H100"). A CUDA
graph records the kernels of one step once and replays them with a single launch. What the step reads
and writes must then keep its memory from one replay to the next: the batch is copied into tensors
the graph owns, parameters are updated in place (``Module.load_state_dict`` copies into them), the
optimizer's state lives on the device (``capturable=True``), and random draws come from generators
registered with the graph, so each replay draws new numbers.

This is a compute detail of a learner, in the spirit of Spreeze's "make the update as fast as the
device allows"; it knows nothing of Dask. On the CPU, or when turned off, a step runs as written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]


def wants_graphs(enabled: bool, device: torch.device | str) -> bool:
    """Whether a learner on ``device`` captures its steps: asked for, and the device is a CUDA GPU."""
    return enabled and torch.device(device).type == "cuda"


def set_capturable(optimizer: torch.optim.Optimizer, on: bool) -> torch.optim.Optimizer:
    """``optimizer`` with its step counts where a captured (``on``) or an eager step wants them.

    A captured step needs them on the parameters' device (torch's ``capturable=True``); an eager one
    on the CPU keeps them there. Call it after ``optimizer.load_state_dict`` too: that takes the flag
    from the saved state, and a checkpoint crosses between learners that capture and learners that do
    not (a GPU run resumed on a laptop).
    """
    for group in optimizer.param_groups:
        group["capturable"] = on
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if "step" in state:
                where = p.device if on else torch.device("cpu")
                state["step"] = state["step"].to(device=where, dtype=torch.float32)
    return optimizer


def step_means(outs: list[Tensors], names: dict[str, str], missing: float = 0.0) -> dict[str, float]:
    """Metric name -> the mean over a call's steps of the step output it names, all read back from the
    device in one transfer (a read-back waits for every kernel queued before it, so one per call, not
    one per step or per metric). An output the steps did not give, or a call without steps, reads
    ``missing``.

    Examples
    --------
    >>> outs = [{"loss": torch.tensor(1.0)}, {"loss": torch.tensor(2.0)}]
    >>> step_means(outs, {"losses/q": "loss", "losses/alpha": "alpha_loss"})
    {'losses/q': 1.5, 'losses/alpha': 0.0}
    """
    given = [key for key in dict.fromkeys(names.values()) if outs and key in outs[0]]
    read = torch.stack([torch.stack([o[key] for o in outs]) for key in given]).tolist() if given else []
    means = {key: float(np.mean(values)) for key, values in zip(given, read, strict=True)}
    return {name: means.get(key, missing) for name, key in names.items()}


class CapturedStep:
    """``step(inputs) -> outputs``, both dicts of tensors, replayed from a CUDA graph once warm.

    The first ``warmup`` calls run ``step`` eagerly on a side stream (what lazy initialisation, such
    as the optimizer's first moments, needs before a capture). The next call captures it with its
    inputs copied into tensors the graph owns; that call and every later one copy their inputs in,
    replay the graph and return copies of its outputs, so a caller may keep them.

    Every tensor ``step`` touches besides its inputs must keep its storage between calls. After
    anything replaces one (a checkpoint loaded into the optimizer), call :meth:`reset`: the next calls
    warm up and capture again. Inputs must keep their shapes and dtypes between calls.

    Parameters
    ----------
    step:
        One gradient step. No host synchronisation inside (``.item()``, ``float(tensor)``).
    device:
        The learner's device. Anything but a CUDA device runs ``step`` as written, every call.
    generators:
        Non-default generators ``step`` draws from (the default one is registered by torch itself).
    enabled:
        ``False`` runs ``step`` as written, every call.

    Examples
    --------
    >>> net = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
    >>> def step(b):
    ...     loss = ((net(b["x"]) - b["y"]) ** 2).mean()
    ...     opt.zero_grad()
    ...     loss.backward()
    ...     opt.step()
    ...     return {"loss": loss.detach()}
    >>> captured = CapturedStep(step, "cpu")  # on the CPU: step as written
    >>> out = captured({"x": torch.ones(4, 2), "y": torch.zeros(4, 1)})
    >>> sorted(out)
    ['loss']
    """

    def __init__(
        self,
        step: Callable[[Tensors], Tensors],
        device: torch.device | str,
        generators: Iterable[torch.Generator] = (),
        enabled: bool = True,
        warmup: int = 3,
    ):
        self.step = step
        self.device = torch.device(device)
        self.enabled = wants_graphs(enabled, self.device)
        self.generators = list(generators)
        self.warmup = warmup
        self.replays = 0
        self.reset()

    def reset(self) -> None:
        """Forget the graph: the next ``warmup`` calls run eagerly, the one after captures again."""
        self._graph: torch.cuda.CUDAGraph | None = None
        self._inputs: Tensors = {}
        self._outputs: Tensors = {}
        self._eager_calls = 0

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def __call__(self, inputs: Tensors) -> Tensors:
        if not self.enabled:
            return self.step(inputs)
        if self._graph is None:
            if self._eager_calls < self.warmup:
                self._eager_calls += 1
                return self._on_side_stream(inputs)
            self._capture(inputs)
        for k, v in inputs.items():
            self._inputs[k].copy_(v, non_blocking=True)
        self._graph.replay()
        self.replays += 1
        return {k: v.clone() for k, v in self._outputs.items()}

    def _on_side_stream(self, inputs: Tensors) -> Tensors:
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = self.step(inputs)
        main.wait_stream(side)
        return out

    def _capture(self, inputs: Tensors) -> None:
        self._inputs = {k: v.detach().clone() for k, v in inputs.items()}
        graph = torch.cuda.CUDAGraph()
        for gen in self.generators:
            graph.register_generator_state(gen)
        # thread_local: other roles may run their own fragments on this worker's other threads meanwhile
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._outputs = self.step(self._inputs)
        self._graph = graph
