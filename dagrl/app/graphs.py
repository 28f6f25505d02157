"""Loading a graph file: the spec (:mod:`dagrl.core.graph`) read, overridden and checked against the
algorithm, the env (made once here), replay and the installed extras, before any cluster starts."""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any

from dagrl.app.tensorboard import available as tensorboard_available
from dagrl.app.wandb_log import available as wandb_available
from dagrl.core import distribution
from dagrl.core.fragment import Algorithm, load_algorithm
from dagrl.core.graph import NAME, EnvSpec, Graph, GraphSpec, RoleSpec
from dagrl.core.schema import ConfigError, apply_overrides, from_dict, read_yaml
from dagrl.replay.spill import CODECS

__all__ = ["load_graph", "resolve_graph", "validate_device_request"]


log = logging.getLogger("dagrl")


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
    # policy=NAME names the policy as policy.name=NAME does: the file's options stay where they apply
    overrides = [f"policy.name={o[7:]}" if re.fullmatch(r"policy=[\w-]+", o) else o for o in overrides]
    if isinstance(data.get("policy"), str) and any(o.startswith("policy.") for o in overrides):
        data["policy"] = {"name": data["policy"]}  # --set policy.max_staleness=1 on `policy: async`
    written = copy.deepcopy(data.get("policy"))
    data = apply_overrides(data, overrides)
    if "policy" in data:
        data["policy"] = switched_policy(written, data["policy"], overrides)
    if "name" in data and not str(data["name"] or "").strip():
        raise ConfigError(path, "name", "empty: it names the run's directory (leave it out for the file's name)")
    data.setdefault("name", Path(path).stem)
    return resolve_graph(data, str(path))


def switched_policy(written: Any, policy: Any, overrides: list[str]) -> Any:
    """The ``policy`` value after ``overrides`` that name another policy (``policy.name=NAME``; ``policy=NAME``
    comes here as that): the options the graph file wrote that the named policy takes are kept (``policy=async``
    on a file's ``{name: async, max_staleness: 2}`` keeps the 2); those it does not take are dropped, in one
    logged line. Options the overrides set themselves are left for validation to judge."""
    if not (isinstance(written, dict) and isinstance(policy, dict)) or policy.get("name") == written.get("name"):
        return policy  # not switched: as written, for validation to judge
    name = policy.get("name")
    if name not in distribution.POLICY_OPTIONS:
        return policy  # validation names what is wrong
    fields = distribution.POLICY_OPTIONS[name].__dataclass_fields__
    own = {o.split("=", 1)[0].removeprefix("policy.") for o in overrides if o.startswith("policy.")}
    dropped = sorted(k for k in written if k != "name" and k not in fields and k not in own)
    if dropped:
        log.info(
            "policy %s (the file's: %s): dropped %s, which %s does not take", name, written.get("name"),
            ", ".join(dropped), name,
        )  # fmt: skip
    return {k: v for k, v in policy.items() if k not in dropped}


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
    kind = distribution.traits(spec.policy, options)
    parallel = distribution.data_parallel_roles(algo) if kind.data_parallel else []
    for name, rdef in algo.roles.items():
        rspec = spec.roles.setdefault(name, RoleSpec())
        if rspec.replicas > 1 and not rdef.many and name not in parallel:
            groups = ", ".join(p for p, t in distribution.POLICY_TRAITS.items() if t.data_parallel)
            hint = f" (data-parallel replicas of a learner: policy {groups})" if rdef.recover == "rollback" else ""
            raise ConfigError(
                where, f"roles.{name}.replicas", f"{rspec.replicas}: role {name} runs as a single instance{hint}"
            )
    for name, rspec in spec.roles.items():
        if rspec.codec is not None and rspec.codec not in CODECS:
            raise ConfigError(where, f"roles.{name}.codec", f"must be one of {', '.join(CODECS)}, got {rspec.codec!r}")
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
    if spec.env.groups is not None and spec.env.api != "pettingzoo":
        raise ConfigError(where, "env.groups", "groups agents of a multi-agent env: set env.api: pettingzoo")
    multi = algo.multi_agent
    if multi != (spec.env.api == "pettingzoo"):
        problem = (
            f"{spec.env.api}: algorithm {spec.algorithm} trains the agents of a multi-agent game; set env.api: "
            "pettingzoo and a PettingZoo env id"
            if multi
            else f"pettingzoo: algorithm {spec.algorithm} trains one agent; a PettingZoo game needs a multi-agent "
            "algorithm (mappo, ippo)"
        )
        raise ConfigError(where, "env.api", problem)
    for name, rspec in spec.roles.items():
        if rspec.max_replicas is None:
            continue
        key = f"roles.{name}.max_replicas"
        if name in algo.roles and not algo.roles[name].many:
            raise ConfigError(where, key, f"{rspec.max_replicas}: only a role of many replicas (samplers) grows")
        if not kind.grows:
            growing = " or ".join(p for p, t in distribution.POLICY_TRAITS.items() if t.grows)
            raise ConfigError(
                where, key, f"{rspec.max_replicas}: samplers grow under policy {growing} only, not {spec.policy}"
            )
        if rspec.max_replicas < rspec.replicas:
            raise ConfigError(where, key, f"{rspec.max_replicas} is below roles.{name}.replicas ({rspec.replicas})")
    obs_space, act_space, env_obs_space = _probe_env(spec.env, where)
    if kind.distributed:
        _check_workers_can_make(spec.env, where)
    if algo.action_spaces and not isinstance(act_space, algo.action_spaces):
        kinds = " or ".join(t.__name__ for t in algo.action_spaces)
        raise ConfigError(
            where,
            "env.id",
            f"{spec.env.id}'s action space is {act_space}; algorithm {spec.algorithm} acts in {kinds} spaces",
        )
    for name, rspec in spec.roles.items():
        if rspec.vector == "envpool" and name in algo.roles and spec.env.api == "pettingzoo":
            raise ConfigError(
                where, f"roles.{name}.vector", "envpool: EnvPool has no PettingZoo envs (sync, async or threads)"
            )
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

    if env.api == "pettingzoo":
        return _probe_game(env, where)
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


def _probe_game(env: EnvSpec, where: str) -> tuple[Any, Any, Any]:
    """:func:`_probe_env` for ``env.api: pettingzoo``: the game's spaces (:mod:`dagrl.envs.agents`)."""
    from dagrl.envs.agents import GroupError, PettingZooGame

    if env.wrappers:
        raise ConfigError(where, "env.wrappers", "api: pettingzoo takes no gymnasium wrappers (they wrap one agent)")
    try:
        probe = PettingZooGame(env.id, env.groups, env.kwargs)
    except GroupError as err:
        raise ConfigError(where, "env.groups", str(err)) from None
    except TypeError as err:
        raise ConfigError(where, "env.kwargs", f"{env.kwargs!r}: {err}") from None
    except ValueError as err:
        raise ConfigError(where, "env.id", f"{env.id}: {err}") from None
    spaces = probe.observation_space, probe.action_space, probe.observation_space
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


TRUSTED_ROOTS = ("dagrl", "gymnasium", "ale_py", "mujoco", "pettingzoo", "mpe2", "envpool", "shimmy", "torch", "numpy")
"""Packages a run's ``config.yaml`` may name without a word (dagrl's own and its envs' well-known ones)."""


def foreign_modules(data: dict[str, Any]) -> list[str]:
    """The modules outside :data:`TRUSTED_ROOTS` that a graph as run (``config.yaml``) imports when it
    is loaded: its algorithm (a module path), its env id's module (``package.module:Env-v0``), its
    wrappers'.

    >>> env = {"id": "mylab.envs:Arm-v0", "wrappers": ["gymnasium.wrappers.ClipReward", "mylab.wrap.Noise"]}
    >>> foreign_modules({"algorithm": "ppo", "env": env})
    ['mylab.envs', 'mylab.wrap']
    """
    from dagrl.envs.wrappers import parse

    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    named = []
    algorithm = str(data.get("algorithm") or "")
    if "." in algorithm:
        named.append(algorithm)
    module = str(env.get("id") or "").rpartition(":")[0]
    if module:
        named.append(module)
    try:
        wrappers = parse(env.get("wrappers") or [])
    except ValueError:
        wrappers = []  # the graph's own check names what is wrong with them
    for path, _ in wrappers:
        named.append(path.partition(":")[0] if ":" in path else path.rpartition(".")[0])
    roots = tuple(f"{r}." for r in TRUSTED_ROOTS)
    return sorted({m for m in named if m not in TRUSTED_ROOTS and not f"{m}.".startswith(roots)})


def import_run_modules(config: Path) -> None:
    """Say which modules outside dagrl a run's ``config.yaml`` will import (one line), then import them:
    a run made by someone else runs their code. Imported first so that the checkpoint's snapshots of
    their envs load (:mod:`dagrl.runtime.snapshot` allows the classes of imported env modules only)."""
    from dagrl.core.schema import read_yaml

    modules = foreign_modules(read_yaml(config))
    if not modules:
        return
    logging.getLogger("dagrl").warning("%s imports code from outside dagrl: %s", config, ", ".join(modules))
    for module in modules:
        with contextlib.suppress(ImportError):  # the graph's own load names what cannot be imported, and where
            importlib.import_module(module)


def check_memory(graph: Graph) -> None:
    """Refuse, before anything starts, a role ``memory`` (a replay store's RAM budget) beyond this
    machine's physical memory: for runs whose roles share this machine (``single``, a LocalCluster)."""
    from dagrl.core.schema import format_bytes, memory_bytes

    ram = memory_bytes()
    for name, rspec in graph.spec.roles.items():
        if rspec.memory_bytes is not None and rspec.memory_bytes > ram:
            said = f"{rspec.memory}: more than this machine's {format_bytes(ram)} of RAM"
            raise ConfigError(graph.path, f"roles.{name}.memory", said)


def check_paths(graph: Graph) -> None:
    """Refuse, before anything starts, a role ``path`` (where replay spills) that cannot be written from
    here: its nearest existing folder is a file, or no file can be made in it. For runs whose workers
    share this machine's files (``single``, a LocalCluster); a path that exists only on other hosts is
    theirs to check."""
    import tempfile

    for name, rspec in graph.spec.roles.items():
        if rspec.path is None:
            continue
        key, target = f"roles.{name}.path", Path(rspec.path).expanduser()
        existing = next((p for p in (target, *target.parents) if p.exists()), None)
        if existing is None:
            continue
        if not existing.is_dir():
            raise ConfigError(graph.path, key, f"{rspec.path}: {existing} is a file, not a folder")
        try:
            fd, probe = tempfile.mkstemp(dir=existing, prefix=".dagrl-probe-")
        except OSError as err:
            raise ConfigError(graph.path, key, f"{rspec.path}: cannot write in {existing} ({err.strerror})") from None
        os.close(fd)
        os.unlink(probe)
