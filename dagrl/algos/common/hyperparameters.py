"""The hyperparameters every PPO-style algorithm has (PPO, IMPALA, MAPPO, IPPO): rollouts, advantages
and the clipped update. Each algorithm's ``Config`` extends :class:`ClippedPPO` with its own, and may
give these other defaults."""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.core.schema import Widths, at_least, positive, unit_interval, widths_fit


@dataclass
class ClippedPPO:
    num_steps: int = 32
    """Env steps per env per rollout (a sampler collects ``num_steps * envs`` transitions a call)."""
    gamma: float = 0.98
    """Discount factor."""
    gae_lambda: float = 0.8
    """Lambda of generalised advantage estimation."""
    lr: float = 1e-3
    """Adam learning rate."""
    anneal_lr: bool = False
    """Decay the learning rate linearly from ``lr`` towards 0 over the run's ``stop.env_steps``,
    counted in the env steps the learner has trained on (CleanRL's and rl-zoo's MuJoCo setting);
    logged as ``losses/lr``. Needs ``stop.env_steps``."""
    clip_coef: float = 0.2
    """PPO ratio clipping."""
    update_epochs: int = 20
    """Passes over each batch of rollouts."""
    minibatch_size: int = 256
    """Transitions per gradient step (the batch is split into as many minibatches as fit)."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    target_kl: float | None = None
    """Stop an update's epochs early when the approximate KL exceeds this."""
    decoupled: bool = False
    """Decoupled PPO (Hilton et al., 2021, "Batch size-invariance for policy optimization"): clip each
    sample's ratio around the learner's policy at the update's start (the proximal policy), not around
    the policy that collected it, and weight the sample by proximal / behaviour probability. On fresh
    rollouts (``single``, ``sync``) both policies are one and the objective is PPO's; on rollouts
    some versions old (``async``) clipping against the old weights spends part of each update's trust
    region on the lag, and this gives it back. One more forward pass over the batch per update; logs
    ``losses/stale_kl``, the approximate KL from the behaviour policies to the proximal one. Off by
    default: MAPPO on simple_spread under ``async`` (lag 1.5 versions) gained within one seed's noise
    (-15.1 against -15.5 over 0.5-1M env steps)."""
    hidden: Widths = 64
    """The hidden layers' widths of the actor and of the critic: one width for two layers, or each layer's in order
    (``[400, 300]``)."""

    def __post_init__(self) -> None:
        at_least(self, 1, "num_steps", "update_epochs", "minibatch_size", "hidden")
        widths_fit(self, "hidden")
        at_least(self, 0, "ent_coef", "vf_coef")
        positive(self, "lr", "clip_coef", "max_grad_norm", "target_kl")
        unit_interval(self, "gamma", "gae_lambda")

    def check_budget(self, env_steps: int | None) -> None:
        """Refuse, before any cluster starts, what the run's ``stop.env_steps`` (``None``: none) rules out."""
        if self.anneal_lr and env_steps is None:
            raise ValueError("anneal_lr: true needs stop.env_steps (the rate falls to 0 there)")
