"""Graph files (``graphs/*.yaml``): algorithm, env, distribution policy, roles, hyperparameters, stop.

A graph file is topology plus hyperparameters; machines live in ``clusters/*.yaml``. Every key is
typed and checked on load, before any cluster starts; errors name the file, the key and the value.

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

import importlib
import logging
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagrl.core import distribution
from dagrl.core.fragment import Algorithm, load_algorithm
from dagrl.core.schema import ConfigError, apply_overrides, at_least, from_dict, read_yaml, to_dict
from dagrl.runtime.tensorboard import available as tensorboard_available
from dagrl.runtime.wandb_log import WandbSpec
from dagrl.runtime.wandb_log import available as wandb_available

__all__ = ["EnvSpec", "Graph", "GraphSpec", "RoleSpec", "StopSpec", "load_graph", "resolve_graph"]


@dataclass
class EnvSpec:
    id: str
    """Gymnasium env id, e.g. ``CartPole-v1``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make``."""
    wrappers: list[Any] = field(default_factory=list)
    """Gymnasium wrappers around each env, innermost first: import paths, or one-key mappings of an
    import path to its keyword arguments (:mod:`dagrl.envs.wrappers`)."""


VECTOR_MODES = ("sync", "async", "threads", "envpool")
MAX_ENVS = {"sync": 4096, "async": 256, "threads": 256, "envpool": 4096}
"""Most envs one sampler replica steps: ``async`` starts a process per env."""


@dataclass
class RoleSpec:
    replicas: int = 1
    """How many instances of the role run (each a persistent actor under distributed policies)."""
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
    ``zstd`` or ``none``. Default (:func:`dagrl.replay.store.default_codec`): ``blosc-zstd`` for uniform
    stores; for prioritized ones ``none`` (rows that are not images: each cold row drawn read alone)
    or ``blosc-lz4`` (images: faster to decode). A store reopened keeps the codec it was written with."""
    vector: str = "sync"
    """How a sampler steps its ``envs``: ``sync`` one after another in its own process (gymnasium's
    SyncVectorEnv), ``async`` each in a subprocess of its own (AsyncVectorEnv), so that one sampler
    uses several cores or overlaps envs that wait (remote or sleeping simulators), ``threads`` each
    stepped in a thread of its own (overlaps envs that wait, with no process per env), ``envpool`` in
    EnvPool's C++ threads (:mod:`dagrl.envs.vector`)."""
    vector_threads: int = 0
    """Threads EnvPool steps one replica's envs on (``vector: envpool`` only). 0: EnvPool's default, a
    thread per core of the host, which oversubscribes a host where several samplers run; set it to
    the cores each replica should use there."""

    def __post_init__(self) -> None:
        if self.vector not in VECTOR_MODES:
            raise ValueError(f"vector must be one of {', '.join(VECTOR_MODES)}, got {self.vector!r}")
        if self.memory is not None:
            self.memory_bytes  # noqa: B018 (parses, raising ValueError on a bad size)
        if self.codec is not None:
            from dagrl.replay.store import CODECS

            if self.codec not in CODECS:
                raise ValueError(f"codec must be one of {', '.join(CODECS)}, got {self.codec!r}")
        at_least(self, 1, "replicas", "envs")
        at_least(self, 0, "vector_threads")
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

    def __post_init__(self) -> None:
        at_least(self, 0, "every")
        at_least(self, 1, "keep")


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
    """How often a waiting call checks that the actor's worker is still alive."""
    respawn_after_s: float = 15.0
    """How long a replacement waits for a free worker (a nanny restarts a killed worker within a
    few seconds) before, on a cluster object this process holds (dagrl's LocalCluster), a fresh
    worker is started in place of the dead one; elsewhere the replacement then shares the least
    loaded worker that fits."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        for key in ("window_s", "hang_timeout_s", "poll_s", "respawn_after_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")


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
    (:mod:`dagrl.runtime.tensorboard`; needs ``pip install "dagrl[tensorboard]"``)."""
    wandb: WandbSpec = field(default_factory=WandbSpec)
    """Also send each metrics row to Weights & Biases once ``wandb.project`` is set
    (:mod:`dagrl.runtime.wandb_log`; needs ``pip install "dagrl[wandb]"``)."""


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
    def env_id(self) -> str:
        """``spec.env.id`` as workers, evaluators and exported policies make it: with the module that
        registered it in front when this process imported that module itself
        (:func:`dagrl.envs.vector.importable_env_id`)."""
        from dagrl.envs.vector import importable_env_id

        return importable_env_id(self.spec.env.id)

    def role(self, name: str) -> RoleSpec:
        return self.spec.roles[name]

    @property
    def active_roles(self) -> dict[str, RoleSpec]:
        """The roles this run starts: all of the algorithm's, but evaluation-only ones only when
        ``evaluate.every`` turns evaluation on, and ``inference`` only under ``central-inference``."""
        off = set() if self.spec.evaluate.every else set(self.algorithm.eval_only_roles)
        if self.spec.policy != "central-inference":
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


def load_graph(path: str | Path, overrides: list[str] | None = None) -> Graph:
    """Read, override and validate a graph file.

    Examples
    --------
    >>> g = load_graph("graphs/ppo-cartpole-sync.yaml", ["roles.sampler.replicas=3"])
    >>> g.role("sampler").replicas
    3
    """
    data = read_yaml(path)
    overrides = list(overrides or [])
    if isinstance(data.get("policy"), str) and any(o.startswith("policy.") for o in overrides):
        data["policy"] = {"name": data["policy"]}  # --set policy.max_staleness=1 on `policy: async`
    data = apply_overrides(data, overrides)
    data.setdefault("name", Path(path).stem)
    return resolve_graph(data, str(path))


def resolve_graph(data: dict[str, Any], where: str) -> Graph:
    """Validate an already-read graph mapping (``where`` names it in errors)."""
    spec = from_dict(GraphSpec, data, where)
    flat = {key: getattr(spec, key) for key in distribution.FLAT_KEYS}
    try:
        spec.policy, raw_options = distribution.policy_options(spec.policy, flat)
    except KeyError as err:
        raise ConfigError(where, *err.args) from None
    options = from_dict(distribution.POLICY_OPTIONS[spec.policy], raw_options, where, prefix="policy")
    try:
        algo = load_algorithm(spec.algorithm)
    except (ModuleNotFoundError, TypeError) as err:
        raise ConfigError(where, "algorithm", f"{spec.algorithm!r}: {err}") from None
    try:
        distribution.check(spec.policy, algo, options)
    except TypeError as err:
        raise ConfigError(where, "policy", f"{spec.policy}: {err}") from None
    for name in spec.roles:
        if name not in algo.roles:
            raise ConfigError(
                where, f"roles.{name}", f"algorithm {spec.algorithm} has no such role (it has: {', '.join(algo.roles)})"
            )
    parallel = distribution.data_parallel_roles(algo) if spec.policy == "dp-learners" else []
    for name, rdef in algo.roles.items():
        rspec = spec.roles.setdefault(name, RoleSpec())
        if rspec.replicas > 1 and not rdef.many and name not in parallel:
            hint = " (data-parallel replicas of a learner: policy dp-learners)" if rdef.recover == "rollback" else ""
            raise ConfigError(
                where, f"roles.{name}.replicas", f"{rspec.replicas}: role {name} runs as a single instance{hint}"
            )
    _check_shards(spec, algo, parallel, where)
    _warn_unequal_shards(spec, algo, parallel, where)
    if spec.evaluate.every and algo.eval_graph is None:
        raise ConfigError(
            where, "evaluate.every", f"{spec.evaluate.every}: algorithm {spec.algorithm} has no @evaluation"
        )
    if spec.stop.eval_return is not None and not spec.evaluate.every:
        raise ConfigError(
            where, "stop.eval_return", f"{spec.stop.eval_return:g}: needs evaluations (set evaluate.every)"
        )
    if spec.torch_threads < 1:
        raise ConfigError(where, "torch_threads", f"must be >= 1, got {spec.torch_threads}")
    if spec.seed < 0:
        raise ConfigError(where, "seed", f"must be >= 0 (numpy seeds are unsigned), got {spec.seed}")
    if spec.tensorboard and not tensorboard_available():
        raise ConfigError(where, "tensorboard", "true needs the tensorboard package: pip install 'dagrl[tensorboard]'")
    if spec.wandb.project is not None and not wandb_available():
        raise ConfigError(where, "wandb.project", "set, but the wandb package is missing: pip install 'dagrl[wandb]'")
    if spec.name and not NAME.fullmatch(spec.name):  # "": a graph built in code, not read from a file
        raise ConfigError(
            where, "name", f"letters, digits, '.', '-' and '_' only (it names a directory), got {spec.name!r}"
        )
    config = from_dict(algo.config_cls, spec.hyperparameters, where, prefix="hyperparameters")
    obs_space, act_space, env_obs_space = _probe_env(spec.env, where)
    if spec.policy != "single":
        _check_workers_can_make(spec.env, where)
    if algo.action_spaces and not isinstance(act_space, algo.action_spaces):
        kinds = " or ".join(t.__name__ for t in algo.action_spaces)
        raise ConfigError(
            where,
            "env.id",
            f"{spec.env.id}'s action space is {act_space}; algorithm {spec.algorithm} acts in {kinds} spaces",
        )
    for name, rspec in spec.roles.items():
        if rspec.vector == "envpool" and name in algo.roles:
            _check_envpool(spec.env, (obs_space, act_space), where, f"roles.{name}.vector")
    check = getattr(config, "check_spaces", None)  # hyperparameters that depend on the env's spaces
    if check is not None:
        try:
            check(obs_space, act_space)
        except ValueError as err:
            raise ConfigError(where, "hyperparameters", f"{err} (env {spec.env.id})") from None
    check = getattr(config, "check_budget", None)  # hyperparameters that depend on the run's length
    if check is not None:
        try:
            check(spec.stop.env_steps)
        except ValueError as err:
            raise ConfigError(where, "hyperparameters", str(err)) from None
    return Graph(spec, algo, config, obs_space, act_space, where, options, env_obs_space)


def _check_shards(spec: GraphSpec, algo: Algorithm, parallel: list[str], where: str) -> None:
    """Data-parallel replicas all-reduce once per minibatch, so each must get as many rollouts as the
    others: a replicated role feeding one needs a multiple of its replicas."""
    for edge in algo.graph.edges:
        src, dst = edge.src.role, edge.dst.role
        if dst not in parallel or not algo.roles[src].many:
            continue
        n, k = spec.roles[src].replicas, spec.roles[dst].replicas
        if n % k:
            raise ConfigError(
                where,
                f"roles.{src}.replicas",
                f"{n}: must be a multiple of roles.{dst}.replicas ({k}), so every {dst} replica gets the same share",
            )


def _warn_unequal_shards(spec: GraphSpec, algo: Algorithm, parallel: list[str], where: str) -> None:
    """Replica i of a replicated role feeds replica ``i % k`` of another (samplers into replay shards):
    with a count that is not a multiple of ``k``, some replicas get more than others. Replay shards
    that hear from the learner through ``reprioritize`` draw in proportion to what they hold
    (:func:`dagrl.replay.role.shard_draws`); the others draw the same number of rows whatever they
    hold, so the rows of a shard that fills more slowly are drawn more often until the shards are full
    (Reverb's sharded servers behave alike). Data-parallel learners are refused the same shape
    (:func:`_check_shards`)."""
    from dagrl.replay.role import reprioritize

    steered = {n.role for n in algo.graph.nodes if n.fragment.fn is reprioritize.fn}
    seen = set()
    for edge in algo.graph.edges:
        src, dst = edge.src.role, edge.dst.role
        if src == dst or dst in parallel or dst in steered or (src, dst) in seen:
            continue
        if not (algo.roles[src].many and algo.roles[dst].many):
            continue
        seen.add((src, dst))
        n, k = spec.roles[src].replicas, spec.roles[dst].replicas
        if n > k > 1 and n % k:  # fewer producers than consumers: each fed one feeds it alone
            logging.getLogger("dagrl").warning(
                "%s: roles.%s.replicas %d is not a multiple of roles.%s.replicas %d: %s replica i feeds %s "
                "replica i %% %d, so they get unequal shares (a replay shard's rows are drawn more often the "
                "less it holds, until the shards are full)",
                where, src, n, dst, k, src, dst, k,
            )  # fmt: skip


def _probe_env(env: EnvSpec, where: str) -> tuple[Any, Any, Any]:
    """The observation and action spaces the networks are built for, and the observation space the
    wrapped env gives before :func:`dagrl.envs.vector.vector_observations`."""
    import gymnasium as gym

    module, _, name = env.id.rpartition(":")
    if module:  # gymnasium's "package.module:Env-v0": importing the module registers the env
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(where, "env.id", f"cannot import {module!r} for {env.id!r} ({err})") from None
    try:
        gym.spec(name)
    except gym.error.Error as err:
        hint = ""
        if not module and isinstance(err, gym.error.NamespaceNotFound):  # "ALE/Pong-v5": ale_py registers ALE
            package = {"ALE": "ale_py"}.get(name.partition("/")[0], "<package>")
            hint = f"; a package's envs register when it is imported: env.id: '{package}:{name}'"
        raise ConfigError(where, "env.id", f"unknown env {env.id!r} ({err}{hint})") from None
    from dagrl.envs.registry import route_mujoco_warnings

    route_mujoco_warnings(env.id)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe = gym.make(env.id, **env.kwargs)
    except (TypeError, ValueError, gym.error.Error) as err:
        raise ConfigError(where, "env.kwargs", f"{env.kwargs!r}: {err}") from None
    probe = _wrap_probe(probe, env.wrappers, where)
    own = probe.observation_space
    from dagrl.envs.vector import vector_observations

    try:
        probe = vector_observations(probe)  # what the samplers' envs give (dagrl.envs.vector.make_vector)
    except ValueError as err:
        probe.close()
        raise ConfigError(where, "env.id", f"{env.id}: {err}") from None
    spaces = probe.observation_space, probe.action_space, own
    probe.close()
    return spaces


def _check_workers_can_make(env: EnvSpec, where: str) -> None:
    """Refuse an env registered from ``__main__`` (a notebook cell, the script being run): Dask's workers
    are other processes and cannot import it. (One registered by an importable module is made there as
    ``module:Env-v0``: :func:`dagrl.envs.vector.importable_env_id`.)"""
    from dagrl.envs.vector import registering_module

    if registering_module(env.id) == "__main__":
        raise ConfigError(
            where, "env.id",
            f"{env.id!r} is registered in __main__ (this notebook or script), which Dask's workers cannot "
            f"import: define the env in a module of its own and write env.id: '<module>:{env.id}' "
            "(policy single runs it as is)",
        )  # fmt: skip


def _wrap_probe(probe: Any, entries: list[Any], where: str) -> Any:
    """``probe`` inside the graph's ``env.wrappers``, each imported and built as a sampler will."""
    from dagrl.envs import wrappers

    for i, given in enumerate(entries):
        try:
            probe = wrappers.wrap(probe, [wrappers.entry(given)])
        except ValueError as err:
            probe.close()
            raise ConfigError(where, f"env.wrappers[{i}]", str(err)) from None
    return probe


def _check_envpool(env: EnvSpec, spaces: tuple[Any, Any], where: str, key: str) -> None:
    """EnvPool is installed, has the env's task, and gives the spaces gymnasium's env does."""
    from dagrl.envs.vector import envpool_task

    try:
        import envpool
    except ImportError:
        raise ConfigError(where, key, "envpool: EnvPool is not installed (pip install envpool)") from None
    if env.wrappers:
        raise ConfigError(
            where, key, "envpool: EnvPool steps its envs in C++ and takes no env.wrappers (use sync, async or threads)"
        )
    try:
        task, options = envpool_task(env.id, env.kwargs)
    except ValueError as err:
        raise ConfigError(where, "env.kwargs", f"{env.kwargs!r}: {err}") from None
    if task not in envpool.list_all_envs():
        raise ConfigError(where, key, f"envpool: EnvPool has no task {task!r} for env {env.id!r}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # EnvPool's Box bounds are float64: gymnasium warns on the cast
            made = envpool.make_spec(task, **options)
            theirs = made.gymnasium_observation_space, made.gymnasium_action_space
    except Exception as err:  # EnvPool's own config errors (an unknown option) are plain exceptions
        raise ConfigError(where, "env.kwargs", f"{env.kwargs!r}: EnvPool's {task}: {err}") from None
    for what, ours, other in zip(("observation", "action"), spaces, theirs, strict=True):
        differs = type(ours) is not type(other) or getattr(ours, "shape", None) != getattr(other, "shape", None)
        if differs or (what == "observation" and ours.dtype != other.dtype):  # actions are cast either way
            raise ConfigError(
                where, key, f"envpool: EnvPool's {task} {what} space {other} differs from {env.id}'s {ours}"
            )


def replace_spec(graph: Graph, **changes: Any) -> Graph:
    """A copy of ``graph`` with top-level spec fields changed (re-validated)."""
    data = graph.to_dict()
    data.update(changes)
    return resolve_graph(data, graph.path)


def validate_device_request(graph: Graph, cuda_available: bool) -> None:
    """Refuse a GPU role on a GPU-less machine when the graph forbids the CPU fallback."""
    if graph.spec.gpu_fallback or cuda_available:
        return
    for name, rspec in graph.spec.roles.items():
        if rspec.gpus > 0:
            raise ConfigError(
                graph.path,
                f"roles.{name}.resources.GPU",
                f"{rspec.gpus:g} requested but no CUDA device is available (gpu_fallback is false)",
            )
