"""What a role-state factory is given: its identity, its seed, its device and a way to make envs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dagrl.envs.episodes import Episodes

__all__ = ["Acting", "Episodes", "RoleContext"]


class Acting(Protocol):
    """What picks actions for a batch of observations: a sampler's own network, or, under
    ``central-inference``, the batched ``inference`` role reached through :meth:`RoleContext.acting`.

    ``__call__(obs, *extra)`` takes observations stacked on the first axis (and any other arrays along
    the same axis: a recurrent policy's state) and returns arrays with the same first axis (e.g. actions
    and their log-probs); ``load(weights)`` takes what the learner publishes.
    """

    def __call__(self, obs: np.ndarray, *extra: np.ndarray) -> tuple[np.ndarray, ...]: ...

    def load(self, weights: Any) -> None: ...


@dataclass
class RoleContext:
    """Identity and environment of one role instance, built by the runtime for the state factory.

    Examples
    --------
    >>> ctx = RoleContext("sampler", index=0, replicas=1, seed=3, env_id="CartPole-v1", num_envs=2)
    >>> envs = ctx.make_envs()
    >>> envs.num_envs
    2
    """

    role: str
    index: int
    replicas: int
    seed: int
    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    env_wrappers: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """The graph's ``env.wrappers``, each ``(import path, kwargs)`` (:mod:`dagrl.envs.wrappers`)."""
    num_envs: int = 1
    vector: str = "auto"
    """``auto``: envs stepped one after another in this process, each in a thread of its own once they
    are seen to wait; ``sync``: one after another; ``threads``: each in a thread; ``async``: each in
    a subprocess; ``envpool``: EnvPool's C++ threads (:mod:`dagrl.envs.vector`)."""
    vector_threads: int = 0
    """EnvPool's thread count under ``envpool`` (0: EnvPool's default, one per core)."""
    double_buffer: str = "auto"
    """Whether a sampler's ``collect`` steps its envs in two groups, one stepping while the other's
    actions are picked: ``auto``, ``on``, ``off`` (:mod:`dagrl.envs.double_buffer`)."""
    device: str = "cpu"
    observation_space: Any = None
    action_space: Any = None
    path: str | None = None
    """Directory for this replica's on-disk data (e.g. a replay store); ``None``: keep it in RAM."""
    memory_bytes: int | None = None
    """RAM this replica may use for data (``roles.<role>.memory`` in the graph), if given."""
    codec: str | None = None
    """How a replay store compresses spilled chunks (``roles.<role>.codec``); ``None``: the store's default."""
    env_steps: int = 0
    """The run's env steps when this instance started: 0 in a fresh run, more in a resumed run or
    for a replacement of a failed instance. Per-sampler schedules (random steps before learning,
    an epsilon decay) go on from ``env_steps // replicas`` rather than from the start."""
    env_steps_budget: int | None = None
    """The run's ``stop.env_steps``, for schedules that end with the run (PPO's ``anneal_lr``);
    ``None`` when the graph sets none."""
    inference: Any = None
    """Set by the runtime under ``central-inference``: what :meth:`acting` hands samplers instead of
    their own network."""
    made: list[NamedEnvErrors] = field(default_factory=list, repr=False, compare=False)
    """The vector envs :meth:`make_envs` returned (each timing its steps), closed by :meth:`close` when
    the role ends."""

    def env_seconds(self) -> float:
        """Seconds this role instance has spent inside its vector envs' ``step`` (0 without envs): with
        the seconds its fragments took (the host's ``busy_s``), where a sampler's time goes."""
        return sum(envs.step_s for envs in self.made)

    def env_backends(self) -> list[str]:
        """What each of its vector envs steps on now: its ``vector`` backend, or for ``auto`` the one
        its envs' first steps chose (``sync`` or ``threads``)."""
        return [getattr(envs, "backend", self.vector) for envs in self.made]

    def double_buffered(self) -> list[bool | None]:
        """Whether each of its vector envs' collects double-buffer now (:func:`dagrl.envs.double_buffer.chosen`):
        ``None`` while ``double_buffer: auto`` still times both ways."""
        from dagrl.envs.double_buffer import chosen

        acting = self.inference if self.inference is not None else object()  # any local acting object
        return [chosen(envs, acting) for envs in self.made]

    def per_replica(self, env_steps: int) -> int:
        """This replica's share of ``env_steps`` counted over the whole role (e.g. ``learning_starts``,
        or :attr:`env_steps` for where its own schedules stand)."""
        return env_steps // max(self.replicas, 1)

    def acting(self, local: Acting) -> Acting:
        """What this sampler should act with: ``local`` (its own network), or under
        ``central-inference`` a client of the batched ``inference`` role, which answers every
        sampler's observations of one env step with one forward pass.

        The algorithm still loads the weights it receives into its own network (e.g. for the value
        of a time-limit bootstrap); only the per-step action choice moves.
        """
        return local if self.inference is None else self.inference

    @contextmanager
    def seeded(self) -> Iterator[None]:
        """Inside it, torch's generator starts from this instance's :attr:`seed`; after it, the process's
        generator is as before. Build a role's networks inside, so that each replica's initial weights
        follow from the run's seed and its place in the role, whatever ran before in that worker.

        >>> import torch
        >>> with RoleContext("learner", 0, 1, seed=7, env_id="CartPole-v1").seeded():
        ...     a = torch.rand(2)
        >>> with RoleContext("learner", 0, 1, seed=7, env_id="CartPole-v1").seeded():
        ...     b = torch.rand(2)
        >>> bool((a == b).all())
        True
        """
        import torch

        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            yield

    def average_gradients(self, parameters: Any) -> None:
        """Average the ``.grad`` of ``parameters`` over this role's data-parallel replicas, in place.

        Call it between ``loss.backward()`` and clipping/``optimizer.step()``: under ``dp-learners``
        every replica then steps with the same gradient and stays identical; anywhere else (one
        learner) it does nothing. One all-reduce of all gradients flattened into a single buffer.
        """
        dist = _group()
        if dist is None:
            return
        import torch

        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        at = 0
        for g in grads:
            g.copy_(flat[at : at + g.numel()].view_as(g))
            at += g.numel()

    def mean_over_replicas(self, value: float) -> float:
        """``value`` averaged over this role's data-parallel replicas (``value`` itself with one).

        For decisions every replica must take alike, e.g. stopping epochs early on the approximate KL.
        """
        dist = _group()
        if dist is None:
            return value
        return float(self.sum_over_replicas(np.array([float(value)]))[0]) / dist.get_world_size()

    def least_over_replicas(self, value: int) -> int:
        """The smallest ``value`` of this role's data-parallel replicas (``value`` itself with one).

        For counts every replica must share, e.g. the gradient steps of an update on what each sampled: a
        replica whose replay shard holds too little yet would otherwise step less, and the others would
        wait in an all-reduce it never joins.
        """
        dist = _group()
        if dist is None:
            return value
        import torch

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor([float(value)], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def sum_over_replicas(self, values: np.ndarray) -> np.ndarray:
        """``values`` summed elementwise over this role's data-parallel replicas (a float64 copy with one).

        For statistics every replica must fold in alike, e.g. the moments of a running observation norm.
        """
        out = np.array(values, dtype=np.float64)
        dist = _group()
        if dist is None:
            return out
        import torch

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces GPU tensors only
        t = torch.from_numpy(out).to(device)
        dist.all_reduce(t)
        return t.cpu().numpy()

    def make_envs(self) -> Any:
        """A gymnasium vector env of ``num_envs`` copies (``vector`` mode), autoreset in the same step.

        When an episode ends, ``step`` returns the first observation of the next one and puts the
        last observation of the finished one in ``info["final_obs"]``.
        """

        from dagrl.envs.registry import route_mujoco_warnings

        route_mujoco_warnings(self.env_id)
        if self.vector == "envpool":
            from dagrl.envs.vector import EnvPoolVector

            spaces = (self.observation_space, self.action_space) if self.action_space is not None else None
            envs = EnvPoolVector(
                self.env_id,
                self.num_envs,
                seed=self.seed,
                num_threads=self.vector_threads,
                spaces=spaces,
                **self.env_kwargs,
            )
        else:
            from dagrl.envs.vector import make_vector

            envs = make_vector(self.env_id, self.num_envs, self.vector, self.env_wrappers, **self.env_kwargs)
        self.made.append(NamedEnvErrors(envs, self.env_id, f"{self.role}[{self.index}]", self.double_buffer))
        return self.made[-1]

    def with_spaces(self) -> RoleContext:
        """This context with :attr:`observation_space` and :attr:`action_space` those of one of its envs,
        as a run sets them from the graph's env: for a role built outside a run (a test, a notebook, a
        benchmark) whose state needs them but who makes no envs, such as a learner.

        >>> ctx = RoleContext("learner", 0, 1, seed=0, env_id="CartPole-v1").with_spaces()
        >>> ctx.observation_space.shape, ctx.action_space
        ((4,), Discrete(2))
        """
        import dataclasses

        envs = dataclasses.replace(self, num_envs=1, made=[]).make_envs()
        try:
            return dataclasses.replace(
                self, observation_space=envs.single_observation_space, action_space=envs.single_action_space
            )
        finally:
            envs.close()

    def start_envs(self) -> tuple[Any, Any, dict[str, Any]]:
        """:meth:`make_envs`, env ``i`` reset with seed ``seed + i`` and the action space seeded with
        ``seed`` (a sampler's start): the envs, their first observations and the reset's info."""
        envs = self.make_envs()
        obs, info = envs.reset(seed=[self.seed + i for i in range(envs.num_envs)])
        envs.action_space.seed(self.seed)
        return envs, obs, info

    def close(self) -> None:
        """End what this context made for the role: its vector envs (their env processes or threads)
        and its connection to the inference role. The runtime calls it when the role's instance ends;
        the first error is raised after everything was tried."""
        items = [*reversed(self.made), self.inference]
        self.made.clear()
        close_each(item.close for item in items if item is not None and not getattr(item, "closed", False))


def close_each(closes: Iterable[Callable[[], Any] | None]) -> None:
    """Call every ``close`` given (``None``: skipped), all of them even if some raise; then raise the
    first error."""
    errors = []
    for close in closes:
        if close is None:
            continue
        try:
            close()
        except Exception as err:  # noqa: BLE001 (raised below, once all are closed)
            errors.append(err)
    if errors:
        raise errors[0]


def _group() -> Any:
    """``torch.distributed`` when this process is one of several data-parallel replicas, else ``None``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


class EnvError(RuntimeError):
    """An env raised inside ``reset`` or ``step``; the message names the env id and the role replica,
    and carries the env's own traceback (which does not survive pickling as ``__cause__``)."""

    def __init__(self, message: str, traceback_text: str = ""):
        super().__init__(message, traceback_text)
        self.message, self.traceback_text = message, traceback_text

    def __str__(self) -> str:
        return self.message


class NamedEnvErrors:
    """Wraps a vector env so an exception inside it becomes an :class:`EnvError` naming env and role;
    counts the seconds spent in ``step`` (``step_s``)."""

    def __init__(self, envs: Any, env_id: str, owner: str, double_buffer: str = "auto"):
        self._envs, self._env_id = envs, env_id
        self.double_buffer = double_buffer
        """The role's ``double_buffer`` mode (:mod:`dagrl.envs.double_buffer`)."""
        self.owner = owner
        """The role replica whose envs these are (``sampler[0]``)."""
        self.step_s = 0.0
        self.steps = 0
        """Vector steps taken (the step a non-finite value is reported at)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._envs, name)

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        out = self._guard("reset", args, kwargs)
        self._finite(out[0], "observation", "reset()")
        return out

    def step(self, *args: Any, **kwargs: Any) -> Any:
        return self._checked(self._timed("step", args, kwargs))

    def send_rows(self, rows: slice, actions: Any) -> Any:
        """Start stepping the envs ``rows`` alone (a double-buffered sampler's group:
        :meth:`dagrl.envs.vector.ThreadVectorEnv.send_rows`)."""
        return self._guard("send_rows", (rows, actions), {})

    def receive_rows(self, sent: Any) -> Any:
        """Wait for the envs :meth:`send_rows` started (the time counted in ``step_s``)."""
        return self._checked(self._timed("receive_rows", (sent,), {}), sent[0].start)

    def _timed(self, method: str, args: tuple, kwargs: dict) -> Any:
        t0 = time.perf_counter()
        try:
            return self._guard(method, args, kwargs)
        finally:
            self.step_s += time.perf_counter() - t0

    def _checked(self, out: Any, first: int = 0) -> Any:
        self.steps += first == 0  # a vector step of all envs, or its first group's
        self._finite(out[0], "observation", f"step {self.steps}", first)
        self._finite(out[1], "reward", f"step {self.steps}", first)
        return out

    def _finite(self, value: Any, what: str, when: str, first: int = 0) -> None:
        """An :class:`EnvError` naming env, role and step where ``value`` (an observation, a reward) holds
        NaN or inf: found here, not as a sampling error in the policy's network several calls later.
        ``value``'s rows are the envs from ``first`` on."""
        if isinstance(value, dict):
            for key, part in value.items():
                self._finite(part, f"{what} {key!r}", when, first)
            return
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "fc" or np.isfinite(value).all():
            return
        bad = np.argwhere(~np.isfinite(value))[0]
        at = f"env {bad[0] + first}" + (f", index {tuple(int(i) for i in bad[1:])}" if len(bad) > 1 else "")
        raise EnvError(
            f"env {self._env_id} gave a non-finite {what} ({value[tuple(bad)]}) at {when} of {self.owner} ({at})"
        )

    def _guard(self, method: str, args: tuple, kwargs: dict) -> Any:
        import traceback

        try:
            return getattr(self._envs, method)(*args, **kwargs)
        except Exception as err:
            raise EnvError(
                f"env {self._env_id} raised in {method}() on {self.owner}: {type(err).__name__}: {err}",
                "".join(traceback.format_exception(err)).rstrip(),
            ) from err
