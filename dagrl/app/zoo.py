"""``dagrl graph --from-zoo ALGO ENV_ID``: a graph with the rl-zoo's tuned hyperparameters, converted.

The hyperparameters are read from the files the ``rl-zoo3`` package ships (the ``zoo`` extra), without
importing the zoo. What an entry leaves out is Stable-Baselines3's own default, read from the installed
SB3's signatures (the zoo runs SB3, so that is what the zoo's run used). The graph runs under ``single``
with the zoo's env count, so its updates per env step are the zoo's; change ``policy`` and the samplers
to spread it. Each converted value carries a comment naming the zoo's key and any change of unit, and the
settings dagrl has no equivalent for are named on one line (:attr:`Converted.dropped`).

Units: SB3's ``train_freq`` counts steps of the vectorised env (each steps every env), as dagrl's
``steps`` does; ``gradient_steps: -1`` means one gradient step per env step collected; ``learning_starts``
and ``target_update_interval`` count env steps, as dagrl's do. SB3's ``DQN`` is not double DQN, so the
graph sets ``double: false``; TD3's action noise is relative to the action range's half-width in both.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dagrl.core.schema import ConfigError, closest

ALGOS = ("ppo", "dqn", "sac", "td3")
"""The zoo's algorithms a graph can be written for."""

NET_ARCH = {"ppo": [64, 64], "dqn": [64, 64], "sac": [256, 256], "td3": [400, 300]}
"""SB3's default hidden layers per algorithm (its policies' ``net_arch``; PPO's actor and critic alike)."""

ACTIVATION = {"ppo": "Tanh", "dqn": "ReLU", "sac": "ReLU", "td3": "ReLU"}
"""The activation of dagrl's networks per algorithm, which SB3's defaults share."""

ROLES = {
    "ppo": {"learner": {}},
    "dqn": {"replay": {"replicas": 1}, "learner": {}},
    "sac": {"replay": {"replicas": 1}, "critic": {}, "actor": {}},
    "td3": {"replay": {"replicas": 1}, "critic": {}, "actor": {}},
}
"""The roles beside the sampler under ``single``."""

IGNORED = {"policy", "n_timesteps", "n_envs", "seed", "verbose", "device", "tensorboard_log", "stats_window_size"}
"""Zoo keys converted apart (the run's length, the envs) or that change no learning."""


@dataclass
class Converted:
    """A graph from the zoo: its YAML text and what did not carry over."""

    algo: str
    env_id: str
    text: str
    dropped: list[str] = field(default_factory=list)
    """``key=value`` of each zoo setting dagrl has no equivalent for."""


def zoo_dir() -> Path:
    """The hyperparameter files of the installed ``rl-zoo3`` package."""
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("--from-zoo", "rl_zoo3", "the rl-zoo3 package is not installed: pip install 'dagrl[zoo]'")
    return Path(next(iter(spec.submodule_search_locations))) / "hyperparams"


def zoo_entry(algo: str, env_id: str) -> dict[str, Any]:
    """The zoo's hyperparameters for ``algo`` on ``env_id``, as its file gives them."""
    if algo not in ALGOS:
        raise ConfigError("--from-zoo", algo, f"no conversion for this algorithm ({closest(algo, ALGOS)})")
    path = zoo_dir() / f"{algo}.yml"
    entries = yaml.safe_load(path.read_text())  # the package's own file, with merge keys (<<: *defaults)
    if env_id not in entries:
        envs = [k for k in entries if k not in ("default", "atari")]
        raise ConfigError(path, env_id, f"the zoo has no {algo} entry for this env ({closest(env_id, envs)})")
    return dict(entries[env_id])


def sb3_defaults(algo: str) -> dict[str, Any]:
    """SB3's keyword defaults for ``algo`` (the zoo's extra installs SB3)."""
    try:
        import stable_baselines3
    except ImportError:
        raise ConfigError("--from-zoo", algo, "stable-baselines3 is not installed: pip install 'dagrl[zoo]'") from None
    init = getattr(stable_baselines3, algo.upper()).__init__
    return {k: p.default for k, p in inspect.signature(init).parameters.items() if p.default is not p.empty}


def policy_kwargs(text: Any) -> dict[str, Any]:
    """The zoo's ``policy_kwargs`` string (``"dict(net_arch=[400, 300], activation_fn=nn.ReLU)"``) as a
    dict, read without evaluating it: literals, ``dict(...)`` calls and ``nn.X`` names (as ``"X"``).

    >>> policy_kwargs("dict(net_arch=dict(pi=[64], vf=[64]), activation_fn=nn.ReLU, ortho_init=False)")
    {'net_arch': {'pi': [64], 'vf': [64]}, 'activation_fn': 'ReLU', 'ortho_init': False}
    """
    if not text:
        return {}
    if isinstance(text, dict):
        return dict(text)

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            return {kw.arg: value(kw.value) for kw in node.keywords}
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.List | ast.Tuple):
            return [value(e) for e in node.elts]
        return ast.literal_eval(node)

    try:
        out = value(ast.parse(str(text), mode="eval").body)
    except (SyntaxError, ValueError) as err:
        raise ConfigError("--from-zoo", "policy_kwargs", f"cannot read {text!r}: {err}") from None
    if not isinstance(out, dict):
        raise ConfigError("--from-zoo", "policy_kwargs", f"expected dict(...), got {text!r}")
    return out


def schedule(value: Any) -> tuple[float, bool]:
    """A zoo value that may be a linear schedule (``"lin_7.3e-4"``): its start and whether it decays."""
    if isinstance(value, str) and value.startswith("lin_"):
        return float(value[4:]), True
    return float(value), False


class _Graph:
    """The hyperparameters being written, each with its comment, and the zoo keys used."""

    def __init__(self, entry: dict[str, Any], defaults: dict[str, Any]) -> None:
        self.entry, self.defaults = entry, defaults
        self.values: dict[str, tuple[Any, str]] = {}
        self.used: set[str] = set(IGNORED)
        self.dropped: list[str] = []

    def get(self, key: str) -> Any:
        """The zoo's value for ``key``, else SB3's default; marks the key used."""
        self.used.add(key)
        return self.entry.get(key, self.defaults.get(key))

    def source(self, name: str, key: str) -> str:
        """Where a value came from: the zoo's entry, else SB3's default, named where dagrl's name differs."""
        where = "zoo" if key in self.entry else "SB3's default"
        return where if name == key else f"{where} {key}: {self.entry.get(key, self.defaults.get(key))}"

    def put(self, name: str, value: Any, key: str, note: str = "") -> None:
        self.values[name] = (value, self.source(name, key) + (f"; {note}" if note else ""))

    def copy(self, name: str, key: str) -> None:
        self.put(name, self.get(key), key)

    def drop(self, key: str, value: Any | None = None) -> None:
        self.used.add(key)
        self.dropped.append(f"{key}={self.entry.get(key) if value is None else value!r}")


def convert(algo: str, env_id: str) -> Converted:
    """The graph for ``algo`` on ``env_id`` with the zoo's hyperparameters (module docstring)."""
    entry = zoo_entry(algo, env_id)
    g = _Graph(entry, sb3_defaults(algo))
    n_envs = int(entry.get("n_envs", 1))
    lr, decays = schedule(g.get("learning_rate"))
    if algo == "ppo":
        _ppo(g, lr, decays)
    else:
        if decays:
            g.drop("learning_rate")
        _offpolicy(g, algo, lr, n_envs)
    _networks(g, algo)
    _normalize(g, algo)
    for key in entry:
        if key not in g.used:
            g.drop(key)
    return Converted(algo, env_id, _text(algo, env_id, entry, g, n_envs), g.dropped)


def _ppo(g: _Graph, lr: float, decays: bool) -> None:
    g.put("lr", lr, "learning_rate", "decays to 0 over stop.env_steps (anneal_lr)" if decays else "")
    g.put("anneal_lr", decays, "learning_rate")
    for name, key in [("num_steps", "n_steps"), ("minibatch_size", "batch_size"), ("update_epochs", "n_epochs"),
                      ("gamma", "gamma"), ("gae_lambda", "gae_lambda"), ("ent_coef", "ent_coef"),
                      ("vf_coef", "vf_coef"), ("max_grad_norm", "max_grad_norm"), ("target_kl", "target_kl"),
                      ("norm_adv", "normalize_advantage")]:  # fmt: skip
        g.copy(name, key)
    clip, clip_decays = schedule(g.get("clip_range"))
    g.put("clip_coef", clip, "clip_range")
    if clip_decays:
        g.drop("clip_range")  # dagrl keeps the clipping range
    for key in ("clip_range_vf", "use_sde"):
        if g.get(key):
            g.drop(key)


def _offpolicy(g: _Graph, algo: str, lr: float, n_envs: int) -> None:
    if algo == "sac":
        g.put("policy_lr", lr, "learning_rate")
        g.put("q_lr", lr, "learning_rate")
    else:
        g.put("lr", lr, "learning_rate")
    freq = g.get("train_freq")
    if isinstance(freq, list | tuple):
        if str(freq[1]).startswith("episode"):
            g.drop("train_freq")
        freq = freq[0]
    g.put("steps", int(freq), "train_freq", "env steps of each env between updates")
    steps = int(g.get("gradient_steps"))
    g.put("gradient_steps", steps if steps > 0 else int(freq) * n_envs, "gradient_steps",
          "one per env step collected (train_freq x n_envs)" if steps < 0 else "")  # fmt: skip
    for name in ("batch_size", "buffer_size", "learning_starts", "gamma"):
        g.copy(name, name)
    g.put("n_step", int(g.get("n_steps") or 1), "n_steps")
    if algo == "dqn":
        _dqn(g)
    elif algo == "sac":
        g.copy("tau", "tau")
        ent = g.get("ent_coef")
        if isinstance(ent, str):  # "auto" or "auto_0.1": tuned toward -action_dim entropy
            g.put("alpha", None, "ent_coef", "tuned (its start value is not carried)" if ent != "auto" else "tuned")
        else:
            g.put("alpha", float(ent), "ent_coef")
        for key, same in [("target_entropy", "auto"), ("target_update_interval", 1), ("use_sde", False)]:
            if g.get(key) != same:
                g.drop(key)
    else:
        g.copy("tau", "tau")
        g.copy("policy_delay", "policy_delay")
        g.copy("target_noise", "target_policy_noise")
        g.copy("target_noise_clip", "target_noise_clip")
        kind = g.entry.get("noise_type")
        g.used.update({"noise_type", "noise_std"})
        if kind is None:
            g.values["exploration_noise"] = (0.0, "noise_type: none (SB3 default): the policy's own actions")
        else:
            g.values["exploration_noise"] = (float(g.entry.get("noise_std", 0.1)), f"noise_std ({kind})")
            if kind != "normal":
                g.drop("noise_type")


def _dqn(g: _Graph) -> None:
    g.copy("target_update_interval", "target_update_interval")
    g.copy("exploration_fraction", "exploration_fraction")
    g.copy("eps_start", "exploration_initial_eps")
    g.copy("eps_end", "exploration_final_eps")
    g.copy("max_grad_norm", "max_grad_norm")
    g.values["double"] = (False, "SB3's DQN takes the target network's own maximum")
    if g.get("tau") != 1.0:
        g.drop("tau")  # soft target updates


def _networks(g: _Graph, algo: str) -> None:
    kwargs = policy_kwargs(g.get("policy_kwargs"))
    arch = kwargs.pop("net_arch", None)
    if isinstance(arch, list) and arch and isinstance(arch[0], dict):  # older files: [dict(pi=..., vf=...)]
        arch = arch[0]
    if isinstance(arch, dict):
        if arch.get("pi") != arch.get("vf") or set(arch) - {"pi", "vf", "qf"}:
            g.drop("policy_kwargs.net_arch", arch)
        arch = arch.get("pi") or arch.get("qf")
    hidden = list(arch or NET_ARCH[algo])
    source = "policy_kwargs.net_arch" if arch else f"net_arch: {NET_ARCH[algo]} (SB3 default)"
    g.values["hidden"] = (hidden, source)
    act = kwargs.pop("activation_fn", ACTIVATION[algo])
    if algo == "ppo" and act in ("Tanh", "ReLU"):
        g.values["activation"] = (act.lower(), "policy_kwargs.activation_fn" if act != "Tanh" else "SB3's default")
    elif act != ACTIVATION[algo]:
        g.drop("policy_kwargs.activation_fn", act)
    if algo == "ppo" and "log_std_init" in kwargs:
        g.values["log_std_init"] = (float(kwargs.pop("log_std_init")), "policy_kwargs.log_std_init")
    for key, value in kwargs.items():
        g.drop(f"policy_kwargs.{key}", value)


def _normalize(g: _Graph, algo: str) -> None:
    norm = g.entry.get("normalize")
    g.used.add("normalize")
    if not norm:
        return
    if isinstance(norm, str):  # "dict(norm_obs=True, norm_reward=False)"
        norm = policy_kwargs(norm)
    obs, reward = (True, True) if norm is True else (norm.get("norm_obs", True), norm.get("norm_reward", True))
    if algo != "ppo":
        g.drop("normalize", norm)
        return
    g.values["norm_obs"] = (bool(obs), "normalize (VecNormalize's observations)")
    g.values["norm_reward"] = (bool(reward), "normalize (VecNormalize's returns)")


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if "e" in repr(value) or "." in repr(value) else f"{value:.1f}"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


def _text(algo: str, env_id: str, entry: dict[str, Any], g: _Graph, n_envs: int) -> str:
    lines = [
        f"# rl-zoo's {algo} hyperparameters for {env_id}, converted by `dagrl graph --from-zoo {algo} {env_id}`",
        "# (Stable-Baselines3's defaults where the zoo gives none; each value's source is on its line).",
        f"# No equivalent in dagrl: {', '.join(g.dropped)}" if g.dropped else "# Every zoo setting carried over.",
        f'description: "{algo.upper()} on {env_id} with the rl-zoo\'s hyperparameters (--from-zoo)"',
        f"algorithm: {algo}",
        f"env: {{id: {env_id}}}",
        "policy: single",
        "seed: 1",
        "roles:",
        f"  sampler: {{replicas: 1, envs: {n_envs}}}  # n_envs: {n_envs}",
    ]
    for role, opts in ROLES[algo].items():
        body = ", ".join(f"{k}: {v}" for k, v in opts.items())
        lines.append(f"  {role}: {{{body}}}")
    lines.append("hyperparameters:")
    width = max(len(f"  {k}: {_yaml(v)}") for k, (v, _) in g.values.items()) + 2
    for name, (value, note) in g.values.items():
        lines.append(f"  {name}: {_yaml(value)}".ljust(width) + f"# {note}")
    lines += ["stop:", f"  env_steps: {int(float(entry.get('n_timesteps', 1e6)))}  # n_timesteps"]
    return "\n".join(lines) + "\n"
