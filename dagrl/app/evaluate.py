"""Evaluating a saved policy: ``dagrl eval RUN`` loads a checkpoint and plays whole episodes with it.

The run's own resolved graph (``config.yaml``) names the algorithm, the env and the networks. Only
the roles of the algorithm's ``@evaluation`` are built (the learner side that publishes the weights,
and the evaluator), in this process and on the CPU whatever the run used; no cluster, no samplers,
no replay. The episodes are played by the algorithm's own ``evaluate`` fragment (greedy actions),
so the numbers mean what the run's ``eval/*`` metrics mean, over as many episodes as asked.

With ``video``, the evaluator's first env is wrapped in gymnasium's ``RecordVideo``: one MP4 per
episode (``moviepy`` must be installed, and the env must render ``rgb_array`` frames). On a machine
without a display MuJoCo renders through EGL unless ``MUJOCO_GL`` says otherwise (its own default,
GLFW, needs a display).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

from dagrl.core.graph import Graph
from dagrl.core.schema import ConfigError

__all__ = ["EvalResult", "evaluate_checkpoint", "load_run"]

log = logging.getLogger("dagrl")


def headless_gl() -> str | None:
    """Have MuJoCo render off-screen through EGL where nothing says how and there is no display
    (GLFW, its default, needs one); return the backend MuJoCo will use, if known."""
    if "MUJOCO_GL" not in os.environ and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ["MUJOCO_GL"] = "egl"
        log.info("no display: MuJoCo renders through EGL (set MUJOCO_GL to choose: egl, osmesa, glfw)")
    return os.environ.get("MUJOCO_GL")


@dataclasses.dataclass
class EvalResult:
    """What ``dagrl eval`` reports; ``to_json`` is what it writes beside the checkpoint's run."""

    checkpoint: str
    iteration: int
    env_steps: int
    env_id: str
    seed: int
    returns: list[float]
    lengths: list[int]
    videos: list[str] = dataclasses.field(default_factory=list)
    deterministic: bool = True

    @property
    def mean(self) -> float:
        return sum(self.returns) / len(self.returns)

    @property
    def std(self) -> float:
        m = self.mean
        return (sum((r - m) ** 2 for r in self.returns) / len(self.returns)) ** 0.5

    def line(self) -> str:
        how = "" if self.deterministic else " (stochastic)"
        return (
            f"{self.env_id}{how}: return {self.mean:.1f} ± {self.std:.1f} over {len(self.returns)} episodes "
            f"(min {min(self.returns):.1f}, max {max(self.returns):.1f}, mean length "
            f"{sum(self.lengths) / len(self.lengths):.0f}); {Path(self.checkpoint).name}: iteration "
            f"{self.iteration}, {self.env_steps:,} env steps"
        )

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "return_mean": self.mean, "return_std": self.std}


def load_run(path: str | Path, command: str = "dagrl eval") -> tuple[Path, dict[str, Any]]:
    """The run directory and the checkpoint that ``path`` names: a run directory (its newest readable
    checkpoint) or one checkpoint file inside ``<run>/checkpoints/``; errors name ``command``."""
    from dagrl.runtime.checkpoint import CheckpointError, load_checkpoint

    path = Path(path)
    if not path.exists():
        raise ConfigError(command, "RUN", f"{path} does not exist")
    run = path if path.is_dir() else path.parent.parent
    if not (run / "config.yaml").exists():
        raise ConfigError(command, "RUN", f"{run} is not a dagrl run directory (no config.yaml)")
    from dagrl.app.graphs import import_run_modules

    import_run_modules(run / "config.yaml")
    try:
        return run, load_checkpoint(path)
    except (FileNotFoundError, CheckpointError) as err:
        raise ConfigError(command, "RUN", str(err)) from None


def eval_graph(run: Path, episodes: int, seed: int | None, overrides: list[str], video: bool) -> Any:
    """The run's graph set up for evaluation in this process: policy ``single``, evaluation on,
    ``episodes`` episodes on one evaluator replica, ``seed`` (default: the run's) and ``overrides``."""
    from dagrl.app.graphs import resolve_graph
    from dagrl.core.fragment import load_algorithm
    from dagrl.core.schema import apply_overrides, read_yaml

    if episodes < 1:
        raise ConfigError("dagrl eval", "--episodes", f"must be >= 1, got {episodes}")
    data = read_yaml(run / "config.yaml")
    data["policy"] = "single"
    data["evaluate"] = {"every": 1}
    data.setdefault("hyperparameters", {})["eval_episodes"] = episodes
    if seed is not None:
        data["seed"] = seed
    if video:
        data.setdefault("env", {}).setdefault("kwargs", {})["render_mode"] = "rgb_array"
    try:
        algo = load_algorithm(str(data.get("algorithm")))
        single, eval_only = {r for r, d in algo.roles.items() if not d.many}, algo.eval_only_roles
    except (ModuleNotFoundError, TypeError):
        single, eval_only = set(), set()  # resolve_graph says what is wrong with the algorithm
    roles = data.setdefault("roles", {})
    for role in single | eval_only:  # one learner (data-parallel replicas are identical), one evaluator
        spec = roles.setdefault(role, {})
        if isinstance(spec, dict):
            spec["replicas"] = 1
            if video and role in eval_only:  # one env: a file per episode
                spec.update(envs=1, vector="sync")
    data = apply_overrides(data, overrides)
    where = f"{run / 'config.yaml'}"
    graph = resolve_graph(data, where)
    if graph.algorithm.eval_graph is None:
        raise ConfigError(where, "algorithm", f"{graph.spec.algorithm}: has no @evaluation to run")
    return graph


def evaluate_checkpoint(
    path: str | Path,
    episodes: int = 10,
    seed: int | None = None,
    overrides: list[str] | None = None,
    video: str | Path | None = None,
    deterministic: bool = True,
) -> EvalResult:
    """Play ``episodes`` greedy episodes (``deterministic`` off: stochastic, see
    :attr:`~dagrl.algos.common.evaluation.EpisodeRunner.deterministic`) with the checkpoint ``path``
    names (see :func:`load_run`).

    Examples
    --------
    >>> from dagrl.app.graphs import load_graph
    >>> from dagrl.app.training import train
    >>> g = load_graph("graphs/ppo-cartpole-single.yaml", ["stop.iterations=2", "runs_dir=/tmp/dagrl-doctest"])
    >>> run = train(g)["run_dir"]
    >>> result = evaluate_checkpoint(run, episodes=3)
    >>> len(result.returns), result.iteration
    (3, 2)
    """
    if video is not None:
        try:
            import moviepy  # noqa: F401  (gymnasium's RecordVideo writes with it)
        except ImportError:
            raise ConfigError("dagrl eval", "--video", "needs moviepy: pip install 'dagrl[video]'") from None
        headless_gl()
    from dagrl.algos.common.evaluation import EpisodeRunner

    run, ckpt = load_run(path)
    graph = eval_graph(run, episodes, seed, list(overrides or []), video is not None)
    hosts = _hosts(graph, run, ckpt)
    evaluator = hosts[graph.algorithm.eval_graph.output.role][0].target.state
    if not isinstance(evaluator, EpisodeRunner):
        raise ConfigError(
            "dagrl eval", "", f"algorithm {graph.spec.algorithm}: its evaluator state is not a dagrl EpisodeRunner"
        )
    evaluator.deterministic = deterministic
    prefix = Path(ckpt["path"]).stem
    recorder = _record(evaluator, Path(video), prefix) if video is not None else None
    from dagrl.core.context import EnvError
    from dagrl.runtime.executor import Executor
    from dagrl.runtime.hosts import close_all

    eval_nodes = graph.algorithm.eval_graph
    executor = Executor()
    try:
        calls = executor.run_nodes(eval_nodes.nodes, hosts, graph.algorithm.roles)
        executor.wait(calls[eval_nodes.output.id])
    except EnvError as err:  # most often an env that cannot render frames for --video
        hint = ""
        if video and "OpenGL" in str(err):
            hint = f" (MUJOCO_GL={gl}: try another of egl, osmesa, glfw)" if (gl := os.environ.get("MUJOCO_GL")) else ""
        raise ConfigError("dagrl eval", "--video" if video else "env", f"{err}{hint}") from None
    finally:
        if recorder is not None:  # the episode left unfinished: no partial MP4
            recorder.recorded_frames, recorder.recording = [], False
        close_all([h for handles in hosts.values() for h in handles])
    returns, lengths = evaluator.last_returns, evaluator.last_lengths
    # one env records, every episode: the i-th episode played is RecordVideo's episode i
    names = [Path(video) / f"{prefix}-episode-{i}.mp4" for i in range(len(returns))] if video else []
    counters = ckpt.get("counters", {})
    return EvalResult(
        checkpoint=ckpt["path"],
        iteration=int(counters.get("iteration", 0)),
        env_steps=int(counters.get("env_steps", 0)),
        env_id=graph.spec.env.id,
        seed=graph.spec.seed,
        returns=[float(r) for r in returns],
        lengths=[int(n) for n in lengths],
        videos=[str(p) for p in names if p.exists()],
        deterministic=deterministic,
    )


def _hosts(graph: Graph, run: Path, ckpt: dict[str, Any]) -> dict[str, list[Any]]:
    """In-process hosts of the evaluation's roles, on the CPU, loaded with the checkpoint's states."""
    from dagrl.runtime.hosts import Handle, Start, cpu_host
    from dagrl.runtime.snapshot import KEY as SNAPSHOT

    counters = ckpt.get("counters", {})
    start = Start(seed_offset=0, run_dir=str(run), env_steps=int(counters.get("env_steps", 0)))
    hosts: dict[str, list[Any]] = {}
    for role in sorted({n.role for n in graph.algorithm.eval_graph.nodes}):
        states = ckpt.get("roles", {}).get(role) or []
        hosts[role] = []
        for i in range(graph.role(role).replicas):
            state = states[i] if i < len(states) else None
            if isinstance(state, dict) and SNAPSHOT in state:
                state = None  # an evaluator's envs as the run left them: evaluation plays from its own seed
            try:
                host = cpu_host(graph, role, i, start, state)
            except ValueError as err:  # a --set that changed a network's shape
                detail = str(err).removeprefix(f"role {role}: ")
                raise ConfigError(ckpt["path"], role, f"checkpoint does not load: {detail}") from None
            hosts[role].append(Handle(role, i, host))
    return hosts


def _record(runner: Any, folder: Path, prefix: str) -> Any:
    """Wrap the first env of ``runner``'s vector env in ``RecordVideo``: every episode, whole, its last
    frame included (the vector env resets that env right after its last step, which ends the file)."""
    import gymnasium as gym

    envs = runner.envs
    inner = getattr(envs, "_envs", envs)
    subs = getattr(inner, "envs", None)
    if not isinstance(subs, list) or not subs:
        raise ConfigError("dagrl eval", "--video", "records envs of the sync and threads vector backends only")
    subs[0] = gym.wrappers.RecordVideo(subs[0], str(folder), episode_trigger=lambda _: True, name_prefix=prefix)
    return subs[0]


def write_result(run: Path, result: EvalResult) -> Path:
    """``<run>/eval/<checkpoint>-seed<seed>.json``."""
    how = "" if result.deterministic else "-stochastic"
    out = run / "eval" / f"{Path(result.checkpoint).stem}-seed{result.seed}{how}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result.to_json(), indent=2))
    return out
