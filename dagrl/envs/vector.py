"""Vector env backends beyond gymnasium's own: EnvPool (``roles.sampler.vector: envpool``), threads
(``vector: threads``) and the default, ``auto``, all with gymnasium's same-step autoreset.

Threads
-------
:class:`ThreadVectorEnv` is gymnasium's SyncVectorEnv with each env made, reset, stepped (with its
autoreset) and closed in a thread of its own, so envs that wait overlap: remote or GPU-bound
simulators, I/O, C extensions that release the GIL. An env whose step is Python holding the GIL
gains nothing and pays ~0.04 ms a step for the hand-off. Its steps, observations and infos equal
SyncVectorEnv's for the same seeds and actions (tested); unlike ``async``, no process per env, no
pickling. :class:`AutoVectorEnv` (``vector: auto``) starts in turn and moves its envs onto such
threads once its first steps show them waiting.

EnvPool
-------

`EnvPool <https://envpool.readthedocs.io>`_ steps a batch of envs in C++ threads, so one sampler's
envs can use several cores without a process per env, and Atari's preprocessing runs there too.
``pip install envpool`` (an optional dependency; a graph asking for it without it is refused).

What dagrl changes
------------------
EnvPool resets an env in the step *after* the one that ended its episode (that step ignores the
action and returns the first observation, reward 0). Every dagrl ``collect`` fragment expects
gymnasium's same-step autoreset: the step that ends an episode returns the next episode's first
observation and puts the last one in ``info["final_obs"]``. :class:`EnvPoolVector` gives that by
resetting the finished envs itself at once (EnvPool resets a subset of its envs on request), so the
next step acts in every env.

Which EnvPool task an env id names
----------------------------------
``dagrl.envs:Atari-v0`` becomes EnvPool's ``<game>-v5`` with the same preprocessing (no-op starts,
frame skip, 84x84 grayscale, frame stack, reward clipping, episodic life, no sticky actions, no
FIRE at reset); any other id is looked up in EnvPool under the same name (``CartPole-v1``,
``Pendulum-v1``, ``HalfCheetah-v5``...), its ``env.kwargs`` passed through. The graph is checked
before anything starts: the task must exist, and its spaces must equal those of the gymnasium env
of the same id (which evaluators and the driver still use).

How ``auto`` decides, seeding and threads
----------------------------------------

``auto`` is ``sync`` for its first 18 vector steps, timed (wall time, the thread's CPU time, its
voluntary context switches); envs that waited then move each to a thread of its own, which
``EnvThreads`` adopts, and step as ``threads`` does from then on. Envs that computed, even on a
machine whose cores other processes take (involuntary switches), stay in turn. On EnvPool env ``i``
gets ``seed + i`` when the pool is made; EnvPool cannot reseed at reset, so a run on EnvPool is
reproducible with itself, not with ``sync``. EnvPool runs a thread per core of the host unless
``roles.<role>.vector_threads`` says otherwise: where several samplers share a host, give each the
cores it should use (e.g. its ``resources.CPU``), or their threads contend.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import queue
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np

from dagrl.envs.wrappers import Wrapper, as_functions, wrap

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

log = logging.getLogger("dagrl")

__all__ = [
    "AutoVectorEnv", "EnvPoolVector", "ThreadVectorEnv", "envpool_task", "importable_env_id", "make_env",
    "vector_observations",
]  # fmt: skip

ATARI_OPTIONS = {  # dagrl.envs.registry.make_atari's keyword -> EnvPool's Atari option
    "noop_max": "noop_max",
    "frame_skip": "frame_skip",
    "frame_stack": "stack_num",
    "episodic_life": "episodic_life",
    "clip_rewards": "reward_clip",
    "repeat_action_probability": "repeat_action_probability",
}


def envpool_task(env_id: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """EnvPool's task id and options for a dagrl env id and its ``env.kwargs`` (module docstring).

    >>> envpool_task("dagrl.envs:Atari-v0", {"game": "Breakout", "episodic_life": True})[0]
    'Breakout-v5'
    >>> envpool_task("CartPole-v1", {})
    ('CartPole-v1', {})
    """
    if env_id.rpartition(":")[2] != "Atari-v0":
        return env_id, dict(kwargs)
    from dagrl.envs.registry import make_atari

    params = inspect.signature(make_atari).parameters.values()
    given = {**{p.name: p.default for p in params if p.kind is p.POSITIONAL_OR_KEYWORD}, **kwargs}
    unknown = set(given) - set(ATARI_OPTIONS) - {"game", "screen_size"}
    if unknown:
        raise ValueError(f"Atari-v0 options EnvPool has no counterpart for: {', '.join(sorted(unknown))}")
    options = {ATARI_OPTIONS[k]: v for k, v in given.items() if k in ATARI_OPTIONS}
    options.update(img_height=given["screen_size"], img_width=given["screen_size"], use_fire_reset=False)
    return f"{given['game']}-v5", options


class EnvPoolVector(gym.vector.VectorEnv):
    """``num_envs`` envs of one EnvPool task stepped as a batch, autoreset in the same step.

    Env ``i`` is seeded ``seed + i`` when the pool is made (EnvPool seeds only then: ``reset``
    ignores ``seed``). Observations are copies, safe to keep across steps. ``spaces`` (observation,
    action), when given, are shown instead of EnvPool's: the gymnasium env's, which the graph check
    found of the same shapes (EnvPool's MuJoCo actions are float64 where gymnasium's are float32, and
    a replay schema follows the graph's).
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int = 0,
        num_threads: int = 0,
        spaces: tuple[gym.Space, gym.Space] | None = None,
        **kwargs: Any,
    ):
        import envpool

        task, options = envpool_task(env_id, kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # EnvPool's Box bounds are float64: gymnasium warns on the cast
            self.pool = envpool.make_gymnasium(task, num_envs=num_envs, seed=seed, num_threads=num_threads, **options)
            self.single_observation_space, self.single_action_space = spaces or (
                self.pool.observation_space,
                self.pool.action_space,
            )
            self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
            self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.num_envs = num_envs

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, _ = self.pool.reset()
        return np.array(obs), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, reward, terminated, truncated, _ = self.pool.step(np.asarray(actions))
        obs, done = np.array(obs), np.asarray(terminated) | np.asarray(truncated)
        info: dict[str, Any] = {}
        if done.any():
            ended = np.flatnonzero(done)
            final = np.empty(self.num_envs, dtype=object)
            final[ended] = list(obs[ended])
            first, _ = self.pool.reset(ended.astype(np.int32))
            obs[ended] = first
            info = {"final_obs": final, "_final_obs": done}
        return obs, np.asarray(reward), np.asarray(terminated), np.asarray(truncated), info

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.closed = True
            self.pool.close()


class Batch:
    """One job on some of :class:`EnvThreads`' envs: each thread hands in its outcome, the last one
    wakes the caller (a countdown, not a future per env)."""

    def __init__(self, indices: Sequence[int]):
        self.indices = list(indices)
        self.results: dict[int, tuple[bool, Any]] = {}
        self.left = len(self.indices)
        self.lock = threading.Lock()
        self.done = threading.Event()
        if not self.left:
            self.done.set()

    def finish(self, i: int, outcome: tuple[bool, Any]) -> None:
        self.results[i] = outcome
        with self.lock:
            self.left -= 1
            if self.left == 0:
                self.done.set()

    def outcomes(self, timeout_s: float | None) -> list[tuple[bool, Any]]:
        """Each env's ``(ok, value or exception)``, in the order of ``indices``."""
        if not self.done.wait(timeout_s):
            raise TimeoutError(f"envs {self.indices} did not finish within {timeout_s:g} s")
        return [self.results[i] for i in self.indices]

    def values(self, timeout_s: float | None = None) -> list[Any]:
        """The results in the order of ``indices``; the first env's exception, if any, raised here."""
        outcomes = self.outcomes(timeout_s)
        for ok, value in outcomes:
            if not ok:
                raise value
        return [value for _, value in outcomes]


Sent = tuple[range, list[Any], "Batch | None"]
"""What :meth:`ThreadVectorEnv.send_rows` hands :meth:`~ThreadVectorEnv.receive_rows`: the envs, their
actions, and their threads' job (``None``: they step in turn when received)."""


class EnvThreads:
    """One thread per env, the only one ever to touch it: each env is made, reset, stepped and closed
    in its own thread; :meth:`each` runs a job on all of them (or some) at once, :meth:`submit` starts
    one without waiting (a double-buffered sampler's group of envs steps while it picks the other's
    actions: :mod:`dagrl.envs.double_buffer`).

    The threads hold their envs and this object, never the vector env, so a vector env nobody closed
    is still collected, and a finalizer then closes its envs and ends the threads (:meth:`close`).
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]):
        n = len(env_fns)
        self.jobs: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(n)]
        self.closed = False
        making = Batch(range(n))  # the first job of every thread: making its env
        self.threads = [
            threading.Thread(target=self._serve, args=(i, make, making), name=f"dagrl-env-{i}", daemon=True)
            for i, make in enumerate(env_fns)
        ]
        for thread in self.threads:
            thread.start()
        made = making.outcomes(None)
        if not all(ok for ok, _ in made):  # close the envs that were made, in their threads, and fail
            with contextlib.suppress(Exception):
                self.close(only=np.array([ok for ok, _ in made]))
            raise next(value for ok, value in made if not ok)
        self.envs: list[gym.Env] = [env for _, env in made]

    def _serve(self, i: int, make: Callable[[], gym.Env], making: Batch) -> None:
        try:
            env = make()
        except BaseException as err:  # noqa: BLE001 (raised in the caller)
            making.finish(i, (False, err))
            return
        making.finish(i, (True, env))
        jobs = self.jobs[i]
        while (job := jobs.get()) is not None:
            fn, arg, batch = job
            try:
                outcome = (True, fn(env, arg))
            except BaseException as err:  # noqa: BLE001 (raised in the caller)
                outcome = (False, err)
            batch.finish(i, outcome)

    def submit(self, fn: Callable[[gym.Env, Any], Any], args: Sequence[Any], indices: Sequence[int]) -> Batch:
        """Start ``fn(env, arg)`` on the envs ``indices``, ``args`` in the same order; :meth:`Batch.values`
        waits for them. Batches on disjoint envs may run at once."""
        batch = Batch(indices)
        for i, arg in zip(indices, args, strict=True):
            self.jobs[i].put((fn, arg, batch))
        return batch

    def each(
        self,
        fn: Callable[[gym.Env, Any], Any],
        args: Sequence[Any],
        only: np.ndarray | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """``fn(env, arg)`` for every env (or those where the mask ``only`` is true) and its argument,
        at once; the results in env order. The first env's exception, if any, is raised here."""
        indices = list(range(len(self.jobs))) if only is None else np.flatnonzero(only).tolist()
        if not indices:
            return []
        return self.submit(fn, [args[i] for i in indices], indices).values(timeout_s)

    def close(self, timeout_s: float = 30.0, only: np.ndarray | None = None) -> None:
        """Close every env (or those of the mask ``only``: the ones made) in its own thread, then end
        the threads. Once; at interpreter shutdown, when threads may no longer run, the threads are only
        told to end."""
        if self.closed:
            return
        self.closed = True
        if sys.is_finalizing():
            self.stop(wait=False)
            return
        hung = False
        try:
            self.each(_close, [None] * len(self.jobs), only=only, timeout_s=timeout_s)
        except TimeoutError:  # an env's close hangs: its thread (a daemon) is left behind
            hung = True
            raise
        finally:
            self.stop(wait=not hung)

    def stop(self, wait: bool = True) -> None:
        for jobs in self.jobs:
            jobs.put(None)
        if wait and threading.current_thread() not in self.threads:
            for thread in self.threads:
                thread.join()


def _close(env: gym.Env, _: Any) -> None:
    env.close()


class ThreadVectorEnv(gym.vector.SyncVectorEnv):
    """SyncVectorEnv whose envs step (and reset) at once, each in a thread of its own; same-step autoreset.

    Each env has a thread that lives as long as the vector env and is the only one to touch it: the
    env is made, reset (all envs, or those of a ``reset_mask``), stepped and closed there, as
    simulators bound to a thread need (a GL context made current on it, a client with thread-local
    state); a thread pool hands an env to whichever thread is free. A call gives each thread its job
    and waits once, for the last to finish (a countdown), rather than for each env's future in turn.
    Speed against the pool it replaced (BENCHMARKS.md, "`vector: threads` with a thread per env"):
    1.14-1.26 x for envs that sleep, measured alone; within noise in a sampler's ``collect``; 0.8-0.9 x
    for envs that hold the GIL, which gain nothing from threads either way. Results are gathered in
    env order, so everything returned is what SyncVectorEnv returns for the same seeds and actions.
    An env's exception is raised in the caller, the first env's first.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], copy: bool = True):
        threads = EnvThreads(env_fns)  # makes each env in its own thread
        try:
            made = [lambda env=env: env for env in threads.envs]
            super().__init__(made, copy=copy, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        except BaseException:
            threads.close()
            raise
        self.env_fns, self.threads = env_fns, threads
        self._close_threads = weakref.finalize(self, threads.close)  # collected unclosed: envs closed, threads end

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[Any, dict]:
        seeds = [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else seed
        seeds = seeds if seeds is not None else [None] * self.num_envs
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs")
        mask = np.ones(self.num_envs, np.bool_)
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = options.pop("reset_mask")
            if not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (self.num_envs,)):
                shape = f"({self.num_envs},)"
                raise ValueError(f"options['reset_mask'] must be a bool array of shape {shape}, got {mask!r}")
            if not mask.any():
                raise ValueError(f"options['reset_mask'] must reset at least one env, got {mask!r}")
        done = self.threads.each(lambda env, s: env.reset(seed=s, options=options), seeds, only=mask)
        self._terminations[mask] = False
        self._truncations[mask] = False
        self._autoreset_envs[mask] = False
        infos: dict[str, Any] = {}
        for i, (obs, info) in zip(np.flatnonzero(mask), done, strict=True):
            self._env_obs[i] = obs
            infos = self._add_info(infos, info, int(i))
        self._observations = gym.vector.utils.concatenate(
            self.single_observation_space, self._env_obs, self._observations
        )
        return (deepcopy(self._observations) if self.copy else self._observations), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        done = self.threads.each(_step_and_autoreset, list(gym.vector.utils.iterate(self.action_space, actions)))
        infos = self._taken(range(self.num_envs), done)
        self._observations = gym.vector.utils.concatenate(
            self.single_observation_space, self._env_obs, self._observations
        )
        obs = deepcopy(self._observations) if self.copy else self._observations
        return obs, self._rewards.copy(), self._terminations.copy(), self._truncations.copy(), infos

    can_step_rows = True
    """Steps a slice of its envs apart from the others (:meth:`send_rows`): a double-buffered sampler's
    groups (:mod:`dagrl.envs.double_buffer`)."""

    def send_rows(self, rows: slice, actions: Any) -> Sent:
        """Start stepping the envs ``rows`` (a slice) with their ``actions``, each in its thread; while
        they step, the caller may step or start other rows. :meth:`receive_rows` waits for them."""
        indices = range(self.num_envs)[rows]
        acts = list(gym.vector.utils.iterate(self.action_space, actions))
        if len(acts) != len(indices):
            raise ValueError(f"{len(acts)} actions for the {len(indices)} envs of rows {rows}")
        if self.threads is None:  # AutoVectorEnv stepping in turn: the caller steps them in receive_rows
            return indices, acts, None
        return indices, acts, self.threads.submit(_step_and_autoreset, acts, list(indices))

    def receive_rows(self, sent: Sent) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """What ``step`` returns, for the envs :meth:`send_rows` started alone: arrays of their length,
        infos indexed within them; same-step autoreset as ``step``."""
        indices, acts, batch = sent
        done = self._in_turn(indices, acts) if batch is None else batch.values()
        infos = self._taken(indices, done)
        rows = slice(indices.start, indices.stop)
        space = self.single_observation_space
        obs = gym.vector.utils.concatenate(
            space, [self._env_obs[i] for i in indices], gym.vector.utils.create_empty_array(space, len(indices))
        )
        return obs, self._rewards[rows].copy(), self._terminations[rows].copy(), self._truncations[rows].copy(), infos

    def _in_turn(self, indices: range, acts: list[Any]) -> list[tuple]:
        return [_step_and_autoreset(self.envs[i], a) for i, a in zip(indices, acts, strict=True)]

    def _taken(self, indices: range, done: list[tuple]) -> dict[str, Any]:
        """Keep the envs ``indices``' step results (``_step_and_autoreset``'s); their infos, indexed within
        ``indices``, in SyncVectorEnv's order (a final step's info first, then the reset's)."""
        infos: dict[str, Any] = {}
        rows = _Rows(len(indices))
        for j, (i, (obs, reward, terminated, truncated, info, final)) in enumerate(zip(indices, done, strict=True)):
            self._env_obs[i], self._rewards[i] = obs, reward
            self._terminations[i], self._truncations[i] = terminated, truncated
            self._autoreset_envs[i] = terminated or truncated
            if final is not None:
                infos = rows._add_info(infos, {"final_obs": final[0], "final_info": final[1]}, j)
            infos = rows._add_info(infos, info, j)
        return infos

    def close_extras(self, **kwargs: Any) -> None:
        self._close_threads()  # each env closed in its thread


class AutoVectorEnv(ThreadVectorEnv):
    """``vector: auto``, the default: steps its envs one after another, as SyncVectorEnv, while it times
    its first vector steps; if the envs spent that time waiting rather than computing, it hands each
    env to a thread of its own for the rest of its life, as :class:`ThreadVectorEnv`, so their waits
    overlap.

    Waiting means, over :attr:`PROBE` vector steps after the first :attr:`SKIP` (first-call costs):
    the wall time of a step exceeds this thread's CPU time by at least half the wall time and by
    :attr:`WAIT_S` per env step, and (on Linux, where a thread's context switches are counted) the
    thread gave up its core at least once every other env step. The last rule keeps envs that compute
    in turn when other processes take the core from them (involuntary switches): a busy machine
    stretches their wall time without their waiting. Sleeping, remote and I/O-bound simulators wait;
    CartPole, MuJoCo and Atari compute, and stay in turn, where a thread hand-off (~0.04 ms a step)
    would only cost.

    Either way its steps, observations and infos are SyncVectorEnv's for the same seeds and actions
    (tested), so the choice never changes what a run learns. An env that must stay on the thread
    that made it (a GL context, a thread-bound client) takes ``vector: threads`` (made in its own
    thread) or ``sync``. :attr:`backend` says which it steps on now.
    """

    SKIP, PROBE = 2, 16
    WAIT_S = 1e-4
    """Least wait per env step worth a thread: a few times the hand-off it costs."""
    MOST_THREADS = 256
    """Most envs it puts on threads, as many as ``vector: threads`` takes; more stay in turn."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], copy: bool = True):
        gym.vector.SyncVectorEnv.__init__(self, env_fns, copy=copy, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.threads = None
        self.backend = "sync"
        self.probe = WaitProbe(self.SKIP) if 1 < self.num_envs <= self.MOST_THREADS else None

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[Any, dict]:
        if self.threads is None:
            return gym.vector.SyncVectorEnv.reset(self, seed=seed, options=options)
        return super().reset(seed=seed, options=options)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self.threads is not None:
            return super().step(actions)
        if self.probe is None:
            return gym.vector.SyncVectorEnv.step(self, actions)
        with self.probe.timing(self.num_envs):
            out = gym.vector.SyncVectorEnv.step(self, actions)
        self._probed()
        return out

    def _in_turn(self, indices: range, acts: list[Any]) -> list[tuple]:
        if self.probe is None:
            return super()._in_turn(indices, acts)
        with self.probe.timing(len(indices)):
            done = super()._in_turn(indices, acts)
        self._probed()
        return done

    def _probed(self) -> None:
        if self.probe.steps == self.SKIP + self.PROBE:
            probe, self.probe = self.probe, None
            if probe.waited(self.WAIT_S):
                self._to_threads(probe)

    def _to_threads(self, probe: WaitProbe) -> None:
        self.threads = EnvThreads([lambda env=env: env for env in self.envs])  # adopted, not made there
        self._close_threads = weakref.finalize(self, self.threads.close)
        self.backend = "threads"
        log.info(
            "vector: auto: %d envs of %s waited %.0f %% of their step time (%.2f ms per env step): each steps "
            "in a thread of its own from now on",
            self.num_envs, getattr(self.envs[0].spec, "id", None) or type(self.envs[0].unwrapped).__name__,
            100 * probe.wait_share(), 1e3 * probe.wait_per_env_step(),
        )  # fmt: skip

    def close_extras(self, **kwargs: Any) -> None:
        if self.threads is None:
            gym.vector.SyncVectorEnv.close_extras(self, **kwargs)
        else:
            super().close_extras(**kwargs)


class WaitProbe:
    """Times vector steps (after the first ``skip``), each of some envs: their wall time, this thread's
    CPU time and, where Linux counts them, its voluntary context switches (it gave up the core to
    wait: a sleep, a socket, a lock)."""

    def __init__(self, skip: int = 0) -> None:
        self.skip = skip
        self.steps = self.counted = self.env_steps = 0
        self.wall_s = self.wait_s = 0.0
        self.switches: int | None = 0 if _switches() is not None else None

    @contextlib.contextmanager
    def timing(self, envs: int) -> Any:
        self.steps += 1
        if self.steps <= self.skip:
            yield
            return
        wall, cpu, switches = time.perf_counter(), time.thread_time(), _switches()
        yield
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        self.counted += 1
        self.env_steps += envs
        self.wall_s += wall
        self.wait_s += max(0.0, wall - cpu)
        if self.switches is not None:
            self.switches += _switches() - switches

    def wait_share(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    def wait_per_env_step(self) -> float:
        return self.wait_s / self.env_steps if self.env_steps else 0.0

    def waited(self, least_s: float) -> bool:
        """Whether the envs waited (see :class:`AutoVectorEnv`).

        >>> p = WaitProbe()
        >>> p.counted, p.env_steps, p.wall_s, p.wait_s, p.switches = 16, 64, 0.64, 0.6, 64
        >>> p.waited(1e-4), p.waited(0.05)
        (True, False)
        >>> p.switches = 3  # the core was taken from it, it did not give it up
        >>> p.waited(1e-4)
        False
        """
        if not self.env_steps or self.wait_share() < 0.5 or self.wait_per_env_step() < least_s:
            return False
        return self.switches is None or self.switches >= self.env_steps / 2


def _switches() -> int | None:
    """Voluntary context switches of this thread so far (``None`` where the OS does not count them)."""
    who = getattr(resource, "RUSAGE_THREAD", None) if resource is not None else None
    return None if who is None else resource.getrusage(who).ru_nvcsw


class _Rows:
    """Gymnasium's way of gathering per-env infos into arrays (``VectorEnv._add_info``), for some rows."""

    def __init__(self, num_envs: int):
        self.num_envs = num_envs

    _add_info = gym.vector.VectorEnv._add_info


def _step_and_autoreset(env: gym.Env, action: Any) -> tuple:
    obs, reward, terminated, truncated, info = env.step(action)
    final = None
    if terminated or truncated:
        final = (obs, info)
        obs, info = env.reset()
    return obs, reward, terminated, truncated, info, final


def vector_observations(env: gym.Env) -> gym.Env:
    """``env`` with observations every algorithm's networks take: a ``float32`` vector where the env's
    own are not a ``Box`` (``Discrete`` states one-hot, ``Tuple``/``Dict`` concatenated, by gymnasium's
    ``FlattenObservation``; a ``Dict`` or ``Tuple`` holding an image as one ``uint8`` vector instead, laid out so
    that the networks give the image a CNN: :mod:`dagrl.spaces.mixed`) or are integers other than an image (an Atari
    console's ``uint8`` RAM, an image too small for the CNN); other ``uint8`` images as ``(C, H, W)``, stacked
    frames folded into the channels (an ALE game's RGB screen, CarRacing's, a stack of them:
    :mod:`dagrl.spaces.images`); ``(C, H, W)`` images (:func:`dagrl.spaces.images.is_image`) and float ``Box``
    observations unchanged.

    >>> vector_observations(gym.make("FrozenLake-v1")).observation_space
    Box(0.0, 1.0, (16,), float32)

    Raises ``ValueError`` for a space of no fixed size (``Sequence``, ``Graph``).
    """
    from dagrl.envs.mixed import MixedObservation
    from dagrl.spaces.images import image_layout
    from dagrl.spaces.mixed import mixed_space

    space = env.observation_space
    mixed = mixed_space(space)
    if mixed is not None:  # a Dict holding an image: one vector, which the networks cut apart again
        return MixedObservation(env, mixed)
    if not isinstance(space, gym.spaces.Box):
        try:
            flat = gym.spaces.flatten_space(space)
        except (NotImplementedError, TypeError, ValueError):
            flat = None
        if not isinstance(flat, gym.spaces.Box):  # a Sequence flattens to a Sequence
            raise ValueError(f"observation space {space} has no fixed-size vector form")
        env = gym.wrappers.FlattenObservation(env)
    elif np.issubdtype(space.dtype, np.floating):
        return env
    elif (layout := image_layout(space)) is not None:
        if layout.order == "chw":
            return env
        return gym.wrappers.TransformObservation(env, layout.channels_first, layout.space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flattened bounds are float64: gymnasium warns on the cast
        return gym.wrappers.DtypeObservation(env, np.float32)


def importable_env_id(env_id: str) -> str:
    """``env_id`` as a fresh process can make it: with the module that registered it in front
    (gymnasium's ``"module:Env-v0"``), where that is a module a fresh process has not imported.

    A notebook that ran ``import ale_py`` can make ``"ALE/Pong-v5"``; a Dask worker started beside it
    cannot, as ALE's envs register when ``ale_py`` is imported. Ids already naming a module, ids
    gymnasium itself registers, ids registered from ``__main__`` and ids unknown here come back as they are.

    >>> importable_env_id("CartPole-v1")
    'CartPole-v1'
    >>> import dagrl.envs
    >>> importable_env_id("BrightHalf-v0")
    'dagrl.envs.registry:BrightHalf-v0'
    """
    module = registering_module(env_id)
    if not module or module == "__main__" or module.partition(".")[0] == "gymnasium":
        return env_id
    return f"{module}:{env_id}"


def registering_module(env_id: str) -> str | None:
    """The module of the entry point this process has registered for ``env_id``; ``None`` for an id that
    names its module already (``"module:Env-v0"``) or that is unknown here."""
    if ":" in env_id:
        return None
    try:
        entry = gym.spec(env_id).entry_point
    except gym.error.Error:
        return None
    return entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None)


def make_env(env_id: str, wrappers: Sequence[Wrapper] = (), **kwargs: Any) -> gym.Env:
    """``gym.make(env_id, **kwargs)`` inside the graph's ``env.wrappers`` (:mod:`dagrl.envs.wrappers`), then
    :func:`vector_observations`."""
    return vector_observations(wrap(gym.make(env_id, **kwargs), wrappers))


def make_vector(
    env_id: str, num_envs: int, vector: str, wrappers: Sequence[Wrapper] = (), **kwargs: Any
) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_id`` (:func:`make_env`) on gymnasium's ``sync`` or ``async`` vector
    env, or on threads; same-step autoreset. (EnvPool takes other arguments: :class:`EnvPoolVector`.)"""
    same_step = gym.vector.AutoresetMode.SAME_STEP
    if vector in ("threads", "auto"):
        kind = ThreadVectorEnv if vector == "threads" else AutoVectorEnv
        return kind([lambda: make_env(env_id, wrappers, **kwargs) for _ in range(num_envs)])
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode=vector,
        vector_kwargs={"autoreset_mode": same_step},
        wrappers=[*as_functions(wrappers), vector_observations],
        **kwargs,
    )
