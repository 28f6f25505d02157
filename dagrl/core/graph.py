"""Graph files (``graphs/*.yaml``): algorithm, env, distribution policy, roles, hyperparameters, stop.

A graph file is topology plus hyperparameters; machines live in ``clusters/*.yaml``. Every key is
typed and checked on load (:mod:`dagrl.app.graphs`), before any cluster starts; errors name the file,
the key and the value.

Example::

    algorithm: ppo                # dagrl.algos.ppo, or any importable module path
    env: {id: CartPole-v1}
    policy: sync                  # or {name: async, max_staleness: 2}: see dagrl.core.distribution
    seed: 1
    roles:
      sampler: {replicas: 2, envs: 4}
      learner: {resources: {GPU: 1}}
    hyperparameters: {lr: 1.0e-3}
    stop: {mean_return: 475, env_steps: 200000}
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from dagrl.core import distribution
from dagrl.core.fragment import Algorithm
from dagrl.core.schema import at_least, to_dict

__all__ = ["EnvSpec", "Graph", "GraphSpec", "RoleSpec", "StopSpec", "WandbSpec"]


@dataclass
class EnvSpec:
    id: str
    """Gymnasium env id, e.g. ``CartPole-v1``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make``."""
    wrappers: list[Any] = field(default_factory=list)
    """Gymnasium wrappers around each env, innermost first: import paths, or one-key mappings of an
    import path to its keyword arguments (:mod:`dagrl.envs.wrappers`)."""
    api: Literal["gymnasium", "pettingzoo"] = "gymnasium"
    """``pettingzoo``: ``id`` names a PettingZoo parallel env (``"mpe2:simple_spread_v3"``), made a
    gymnasium env with a row per agent (:mod:`dagrl.envs.agents`); ``kwargs`` are its own."""
    groups: dict[str, list[str]] | None = None
    """``api: pettingzoo``: agents that share one policy, by group name (default: by their name before
    the last ``_``). Within a group, every agent's spaces must be equal."""

    def made_as(self) -> tuple[str, dict[str, Any]]:
        """The gymnasium id and ``gymnasium.make`` keywords samplers make this env with."""
        if self.api == "pettingzoo":
            from dagrl.envs.agents import GAME_ID

            return GAME_ID, {"env": self.id, "groups": self.groups, "kwargs": dict(self.kwargs)}
        return self.id, dict(self.kwargs)


VECTOR_MODES = ("auto", "sync", "async", "threads", "envpool")
DOUBLE_BUFFER_MODES = ("auto", "on", "off")
MAX_ENVS = {"auto": 4096, "sync": 4096, "async": 256, "threads": 256, "envpool": 4096}
"""Most envs one sampler replica steps: ``async`` starts a process per env."""


@dataclass
class RoleSpec:
    replicas: int = 1
    """How many instances of the role run (each a persistent actor under distributed policies)."""
    max_replicas: int | None = None
    """Samplers under ``async``: start ``replicas``, and add one on each worker that joins during the run
    and hosts nothing yet (a new host, SLURM granting more jobs), up to this many; above ``replicas``, a
    sampler lost with its worker is dropped rather than replaced. The metrics' ``samplers/active`` counts
    them."""
    envs: int = 1
    """Environments stepped by each replica (sampler roles)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Dask resources each replica needs, e.g. ``{CPU: 1}`` or ``{GPU: 1}``."""
    path: str | None = None
    """Where the role keeps data on disk (replay stores); replica i uses ``<path>/<i>``. Default:
    ``<run dir>/<role>-<i>``."""
    memory: str | None = None
    """RAM each replica may use for data, e.g. ``2GiB`` (a replay store's memory budget)."""
    codec: str | None = None
    """How a replay store compresses the chunks it spills to disk: ``blosc-zstd``, ``blosc-lz4``,
    ``zstd`` or ``none``. Default (:func:`dagrl.replay.spill.default_codec`): ``blosc-zstd`` for uniform
    stores; for prioritized ones ``none`` (rows that are not images: each cold row drawn read alone)
    or ``blosc-lz4`` (images: faster to decode). A store reopened keeps the codec it was written with."""
    vector: str = "auto"
    """How a sampler steps its ``envs``: ``auto`` (the default) one after another, unless its first
    steps show the envs waiting rather than computing, then each in a thread of its own
    (:class:`dagrl.envs.vector.AutoVectorEnv`); ``sync`` one after another in its own process
    (gymnasium's SyncVectorEnv), ``async`` each in a subprocess of its own (AsyncVectorEnv), so that
    one sampler uses several cores or overlaps envs that wait (remote or sleeping simulators),
    ``threads`` each stepped in a thread of its own from the start (overlaps envs that wait, with no
    process per env), ``envpool`` in EnvPool's C++ threads (:mod:`dagrl.envs.vector`)."""
    vector_threads: int = 0
    """Threads EnvPool steps one replica's envs on (``vector: envpool`` only). 0: EnvPool's default, a
    thread per core of the host, which oversubscribes a host where several samplers run; set it to
    the cores each replica should use there."""
    double_buffer: bool | str = "auto"
    """Whether a sampler steps its envs in two groups, one stepping while the other's actions are
    picked: ``auto`` (the default) where that pays (envs on threads, or actions from the ``inference``
    role), ``true`` (``on``), ``false`` (``off``) (:mod:`dagrl.envs.double_buffer`)."""

    def __post_init__(self) -> None:
        if self.vector not in VECTOR_MODES:
            raise ValueError(f"vector must be one of {', '.join(VECTOR_MODES)}, got {self.vector!r}")
        if self.memory is not None:
            self.memory_bytes  # noqa: B018 (parses, raising ValueError on a bad size)
        at_least(self, 1, "replicas", "envs")
        at_least(self, 0, "vector_threads")
        self.double_buffer = {True: "on", False: "off"}.get(self.double_buffer, self.double_buffer)  # YAML's on/off
        if self.double_buffer not in DOUBLE_BUFFER_MODES:
            raise ValueError(f"double_buffer must be auto, true (on) or false (off), got {self.double_buffer!r}")
        if self.double_buffer == "on" and self.vector not in ("auto", "threads"):
            raise ValueError(
                f"double_buffer: on needs vector: auto or threads (envs stepped in groups), not {self.vector!r}"
            )
        if self.vector_threads and self.vector != "envpool":
            raise ValueError(f"vector_threads applies to vector: envpool only (vector is {self.vector!r})")
        most = MAX_ENVS[self.vector]
        if self.envs > most:
            raise ValueError(
                f"envs must be <= {most} with vector: {self.vector} (one replica's envs; add replicas), got {self.envs}"
            )
        for name, amount in self.resources.items():
            if amount < 0:
                raise ValueError(f"resources.{name} must be >= 0, got {amount}")

    @property
    def gpus(self) -> float:
        return self.resources.get("GPU", 0.0)

    @property
    def memory_bytes(self) -> int | None:
        if self.memory is None:
            return None
        from dask.utils import parse_bytes

        try:
            return int(parse_bytes(self.memory))
        except (ValueError, TypeError):
            raise ValueError(f"memory must be a size like 512MiB or 2GB, got {self.memory!r}") from None


@dataclass
class StopSpec:
    mean_return: float | None = None
    """Stop when the mean return of the last ``window`` episodes reaches this."""
    window: int = 20
    """Episodes averaged for ``mean_return`` (and for the progress bar); a sampler's episodes count only
    once each of its envs has finished one since they were reset together (:mod:`dagrl.envs.episodes`)."""
    env_steps: int | None = None
    """Stop after this many env steps."""
    wall_time_s: float | None = None
    """Stop after this many seconds of training."""
    iterations: int | None = None
    """Stop after this many iterations."""
    eval_return: float | None = None
    """Stop when an evaluation's mean return (``eval/return_mean``, greedy, whole episodes from fresh
    resets) reaches this; needs ``evaluate.every``. Under ``evaluate.concurrent`` the stop comes with
    the row the evaluation's metrics join."""

    def __post_init__(self) -> None:
        at_least(self, 1, "window", "env_steps", "iterations")
        if self.wall_time_s is not None and not self.wall_time_s > 0:
            raise ValueError(f"wall_time_s must be > 0, got {self.wall_time_s}")
        for key in ("mean_return", "eval_return"):
            value = getattr(self, key)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, got {value}")


@dataclass
class CheckpointSpec:
    every: int = 50
    """Write a checkpoint every this many iterations (0: only at the end)."""
    keep: int = 3
    """How many recent checkpoints to keep on disk."""
    stop_wait_s: float = 20.0
    """After a stop signal (Ctrl-C, ``SIGTERM``, ``SIGUSR1``), how long the iteration in flight may take
    to finish before it is abandoned and the run ends on its last periodic checkpoint: below SLURM's
    ``KillWait`` (30 s by default), which ends the job with ``SIGKILL`` after its ``SIGTERM``."""

    def __post_init__(self) -> None:
        at_least(self, 0, "every")
        at_least(self, 1, "keep")
        if self.stop_wait_s <= 0:
            raise ValueError(f"stop_wait_s must be > 0, got {self.stop_wait_s}")


@dataclass
class EvaluateSpec:
    every: int = 0
    """Run the algorithm's ``@evaluation`` every this many iterations (0: never); its ``eval/*``
    metrics join that iteration's row, and its evaluation-only roles (``evaluator``) are started."""
    concurrent: bool = False
    """Evaluate beside training instead of between iterations: the evaluation starts after iteration
    N with that iteration's weights, training goes on, and its ``eval/*`` metrics join the row of
    the iteration during which it finished, with ``eval/iteration: N``. One at a time: an evaluation
    due while the previous one still runs is skipped."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"every must be >= 0, got {self.every}")


@dataclass
class SupervisionSpec:
    """What happens when a role actor's worker dies, hangs or its fragment raises (see docs/architecture.md)."""

    max_restarts: int = 3
    """Restarts of one role allowed within ``window_s``; one more is a crash loop and stops the run."""
    window_s: float = 600.0
    hang_timeout_s: float = 600.0
    """A fragment call running longer than this counts as a hung role: its worker is restarted."""
    poll_s: float = 1.0
    """How often a waiting call asks the scheduler whether the actor's worker is still alive. A worker
    the scheduler removes (a killed process, a host cut off) ends the call at once, before this."""
    respawn_after_s: float = 15.0
    """How long a replacement waits for a free worker (a nanny restarts a killed worker within a
    few seconds) before, on a cluster object this process holds (dagrl's LocalCluster), a fresh
    worker is started in place of the dead one; elsewhere the replacement then shares the least
    loaded worker that fits."""
    unreachable_s: float = 10.0
    """A worker whose heartbeats stop reaching the scheduler for this long, while others' arrive, is
    treated as lost (a host cut off by a partition, or frozen): dagrl removes it from the scheduler and
    replaces its roles. Dask's own worker TTL is 5 minutes. When it comes back it is restarted (what it
    ran is stale) and joins as spare capacity."""
    probe_after_s: float = 2.0
    """Sooner than ``unreachable_s``: a worker whose heartbeats are this late has its host asked for a
    TCP connection from the scheduler (1 s to answer). The host's kernel answers for a busy worker; a
    host behind a partition does not, and is treated as lost at once. Dask's workers beat every 0.5 s
    up to 10 workers, 1 s to 50, 2 s to 200, then slower: where that is longer, this bound and
    ``unreachable_s`` rise to 2 and 5 heartbeat intervals."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        for key in ("window_s", "hang_timeout_s", "poll_s", "respawn_after_s", "unreachable_s", "probe_after_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")


@dataclass
class WandbSpec:
    """Where a run's metrics go in Weights & Biases; nothing is sent while ``project`` is unset."""

    project: str | None = None
    """The W&B project; setting it turns the logging on."""
    entity: str | None = None
    """The W&B user or team (default: W&B's own, from ``wandb login`` or ``WANDB_ENTITY``)."""
    group: str | None = None
    """Groups runs in W&B's UI (the seeds of one setting, say)."""
    tags: list[str] = field(default_factory=list)
    mode: Literal["online", "offline", "disabled"] | None = None
    """``offline``: written under ``<run>/wandb/`` only, for ``wandb sync`` later (a node with no
    network); default: W&B's own (``WANDB_MODE``, else online)."""

    def __post_init__(self) -> None:
        if self.project is not None and not self.project.strip():
            raise ValueError("project must not be empty (leave it out to log nothing)")


@dataclass
class GraphSpec:
    algorithm: str
    """Algorithm module: ``ppo`` for ``dagrl.algos.ppo``, or a dotted path to your own module."""
    env: EnvSpec
    policy: str | dict[str, Any] = "single"
    """Distribution policy: a name (``sync``) or a name with options (``{name: async, max_staleness: 2}``);
    see :mod:`dagrl.core.distribution`. After loading, the name (options: ``Graph.policy_options``)."""
    name: str = ""
    """Run name (default: the file's stem); run directories are ``runs/<name>-<timestamp>``."""
    description: str = ""
    """What the graph is, in one line of at most :data:`DESCRIPTION_CHARS` characters (``dagrl graphs``
    lists it)."""
    seed: int = 0
    roles: dict[str, RoleSpec] = field(default_factory=dict)
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    stop: StopSpec = field(default_factory=StopSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    supervision: SupervisionSpec = field(default_factory=SupervisionSpec)
    evaluate: EvaluateSpec = field(default_factory=EvaluateSpec)
    max_staleness: int | None = None
    """Earlier form of ``policy.max_staleness`` (``async``)."""
    rollouts_per_update: int | None = None
    """Earlier form of ``policy.rollouts_per_update`` (``async``)."""
    update_ratio: float | None = None
    """Earlier form of ``policy.update_ratio`` (``apex``, ``split-learner``)."""
    rate_limit: bool | None = None
    """Earlier form of ``policy.rate_limit`` (``apex``, ``split-learner``)."""
    max_lead: int | None = None
    """Earlier form of ``policy.max_lead`` (``apex``, ``split-learner``)."""
    publish_every: int | None = None
    """Earlier form of ``policy.publish_every`` (``apex``, ``split-learner``)."""
    gpu_fallback: bool = True
    """A role asking for ``GPU`` runs on CPU (with a log line) where none exists; false: an error."""
    torch_threads: int = 1
    """Threads each role's torch may use (one role per worker process)."""
    shared_memory: bool = True
    """Arrays of 1 MiB or more in fragment outputs (image rollouts, replay batches) cross to a worker
    on the same host through ``/dev/shm`` instead of a socket (:mod:`dagrl.runtime.shm`); false:
    always over Dask's comms."""
    runs_dir: str = "runs"
    """Where run directories are created."""
    tensorboard: bool = False
    """Also write each metrics row as TensorBoard scalars under ``<run>/tensorboard/``
    (:mod:`dagrl.app.tensorboard`; needs ``pip install "dagrl[tensorboard]"``)."""
    wandb: WandbSpec = field(default_factory=WandbSpec)
    """Also send each metrics row to Weights & Biases once ``wandb.project`` is set
    (:mod:`dagrl.app.wandb_log`; needs ``pip install "dagrl[wandb]"``)."""

    def __post_init__(self) -> None:
        if "\n" in self.description or len(self.description) > DESCRIPTION_CHARS:
            raise ValueError(
                f"description: one line of at most {DESCRIPTION_CHARS} characters, got {len(self.description)} "
                f"characters{' over several lines' if chr(10) in self.description else ''}"
            )


DESCRIPTION_CHARS = 120

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclass
class Graph:
    """A validated graph file with its algorithm, typed hyperparameters and env spaces resolved."""

    spec: GraphSpec
    algorithm: Algorithm
    config: Any
    observation_space: Any
    action_space: Any
    path: str
    policy_options: Any = None
    """The options dataclass of ``spec.policy`` (:data:`dagrl.core.distribution.POLICY_OPTIONS`)."""
    env_observation_space: Any = None
    """The observation space of the env with its ``env.wrappers``, before dagrl made it what the networks
    take (:attr:`observation_space`; :func:`dagrl.envs.vector.vector_observations`)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def traits(self) -> distribution.Traits:
        """What its policy is (:class:`~dagrl.core.distribution.Traits`): read instead of the policy's name."""
        return distribution.traits(self.spec.policy, self.policy_options)

    @property
    def env_id(self) -> str:
        """``spec.env.id`` as workers, evaluators and exported policies make it: with the module that
        registered it in front when this process imported that module itself
        (:func:`dagrl.envs.vector.importable_env_id`)."""
        from dagrl.envs.vector import importable_env_id

        return importable_env_id(self.spec.env.made_as()[0])

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """The keywords ``gymnasium.make`` gets for :attr:`env_id`."""
        return self.spec.env.made_as()[1]

    def role(self, name: str) -> RoleSpec:
        return self.spec.roles[name]

    @property
    def active_roles(self) -> dict[str, RoleSpec]:
        """The roles this run starts: all of the algorithm's, but evaluation-only ones only when
        ``evaluate.every`` turns evaluation on, and ``inference`` only under ``central-inference``."""
        off = set() if self.spec.evaluate.every else set(self.algorithm.eval_only_roles)
        if not self.traits.inference:
            off.add(distribution.INFERENCE_ROLE)
        return {r: self.spec.roles[r] for r in self.algorithm.roles if r not in off}

    @property
    def n_actors(self) -> int:
        return sum(r.replicas for r in self.active_roles.values())

    @property
    def n_gpu_actors(self) -> int:
        """Role replicas asking for a GPU (a share of one or more)."""
        return sum(r.replicas for r in self.active_roles.values() if r.gpus > 0)

    def to_dict(self) -> dict[str, Any]:
        """The resolved configuration, hyperparameters with defaults filled in."""
        data = to_dict(self.spec)
        for key in distribution.FLAT_KEYS:
            data.pop(key, None)  # folded into the policy's options
        options = to_dict(self.policy_options) if self.policy_options is not None else {}
        data["policy"] = {"name": self.spec.policy, **options} if options else self.spec.policy
        data["hyperparameters"] = to_dict(self.config)
        return data
