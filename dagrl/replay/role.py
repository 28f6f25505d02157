"""The replay role shared by off-policy algorithms: its state and its fragments (``add``, ``sample``).

An off-policy algorithm imports these fragments and declares the role with a factory returning
:func:`replay_state`; its iteration then reads ``update(sample(add(collect(publish()))))``.

Sharded replay (``roles.replay.replicas`` > 1) draws as one replay holding every shard's rows would
when the learner answers through ``reprioritize``: its :class:`UpdateResult` carries
:func:`shard_draws`, the rows each shard draws next, in proportion to what it holds (its priority
mass under PER), and :func:`pooled_weights` puts the shards' importance weights on one scale.
Without that answer every shard draws the same number of rows, so the rows of a shard that holds
fewer are drawn more often (Reverb's sharded tables behave alike).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dagrl.core.context import Episodes, RoleContext
from dagrl.core.fragment import fragment
from dagrl.replay.schema import Schema
from dagrl.replay.store import ReplayStore, Sample

DEFAULT_MEMORY = 1 << 30


@dataclass
class Transitions:
    """Rows a sampler collected (one per env step, fields as the replay schema says)."""

    data: dict[str, np.ndarray]
    episodes: Episodes = field(default_factory=Episodes)
    env_steps: int = 0


@dataclass
class UpdateResult:
    """A learner's metrics plus new priorities for the rows it sampled: (indices, |TD error|) by the
    shard that drew them (:attr:`Sample.shard`), so a shard finds its own whoever sampled it."""

    metrics: dict[str, float]
    priorities: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    draws: dict[int, int] = field(default_factory=dict)
    """Rows each shard draws from its next ``sample`` on (:func:`shard_draws`); a shard not named keeps
    drawing ``batch_size x batches``."""


@dataclass
class ReplayState:
    store: ReplayStore
    batch_size: int
    batches: int
    """Batches per ``sample`` call: the gradient steps of one ``update`` call."""
    learning_starts: int
    shard: int = 0
    """This replica's index: which part of an :class:`UpdateResult` is its own."""
    draws: int | None = None
    """Rows per ``sample`` as the learner last asked (:attr:`UpdateResult.draws`); else the default."""

    @property
    def rows_per_sample(self) -> int:
        """Rows one ``sample`` draws: the learner's :attr:`draws`, else ``batches x batch_size``."""
        return self.draws or self.batch_size * self.batches

    def state_dict(self) -> dict[str, int]:
        return self.store.state_dict()

    def stats(self) -> dict[str, int]:
        """The store's counts, and the rows this shard draws per ``sample``."""
        return {**self.store.stats(), "draws": self.rows_per_sample}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.store.load_state_dict(state)

    def close(self) -> None:
        """Stop the store's prefetch thread (checkpoints have made its rows durable)."""
        self.store.close()


def replay_state(
    ctx: RoleContext,
    schema: Schema,
    *,
    capacity: int,
    batch_size: int,
    batches: int = 1,
    learning_starts: int = 0,
    **store_options: Any,
) -> ReplayState:
    """A replay role's state: a store at the role's path, with its memory budget from the graph."""
    budget = ctx.memory_bytes or min(DEFAULT_MEMORY, 2 * capacity * schema.row_bytes + (8 << 20))
    store_options.setdefault("codec", ctx.codec)  # roles.replay.codec, unless the algorithm chose
    store = ReplayStore(schema, capacity, budget, ctx.path, seed=ctx.seed, **store_options)
    return ReplayState(store, batch_size, batches, learning_starts, ctx.index)


@fragment(role="replay")
def add(state: ReplayState, items: list[Transitions]) -> int:
    """Store every collected row; return how many rows the store holds."""
    for item in items:
        state.store.add(item.data)
    return len(state.store)


@fragment(role="replay")
def sample(state: ReplayState, stored: int) -> Sample | None:
    """``batches x batch_size`` rows (or the learner's :attr:`ReplayState.draws`), or ``None`` until
    ``learning_starts`` rows are stored."""
    stored = len(state.store)
    if stored < max(state.learning_starts, state.batch_size):
        return None
    want = state.rows_per_sample
    if want <= stored:
        out = state.store.sample(want)
        out.shard = state.shard
        return out
    parts = [state.store.sample(min(stored, want - k)) for k in range(0, want, stored)]  # early on: rows repeat
    return replace(
        parts[0],
        data={f: np.concatenate([p.data[f] for p in parts]) for f in parts[0].data},
        indices=np.concatenate([p.indices for p in parts]),
        weights=np.concatenate([p.weights for p in parts]),
        shard=state.shard,
    )


@fragment(role="replay")
def reprioritize(state: ReplayState, result: UpdateResult) -> dict[str, float]:
    """Give this shard's sampled rows their new priorities (PER) and take its next draw count; pass the
    metrics on."""
    mine = result.priorities.get(state.shard)
    if mine is not None and state.store.prioritized:
        state.store.update_priorities(*mine)
    state.draws = result.draws.get(state.shard, state.draws)
    return result.metrics


# ---------------------------------------------------------------------------------------------------
# Pooling shards' samples (on the learner)
# ---------------------------------------------------------------------------------------------------


def _steerable(present: list[Sample]) -> bool:
    return len(present) > 1 and all(s.mass > 0 for s in present)  # built by hand: no shard stats


def shard_draws(samples: list[Sample | None]) -> dict[int, int]:
    """Rows each shard that drew should draw next: as many rows in all as it drew this time, split in
    proportion to each shard's mass (its rows; its priority sum under PER) by largest remainders, at
    least one each. Each stored row's chance per draw is then that of one replay holding every shard's
    rows (uniform: ``1 / rows``; PER: ``p / mass``), up to the change in sizes since this draw. Empty for
    one shard, and for samples without shard stats."""
    present = [s for s in samples if s is not None]
    if not _steerable(present):
        return {}
    total = sum(len(s) for s in present)
    mass = np.array([s.mass for s in present], np.float64)
    exact = total * mass / mass.sum()
    counts = np.floor(exact).astype(np.int64)
    for i in np.argsort(counts - exact, kind="stable")[: total - int(counts.sum())]:  # largest remainders
        counts[i] += 1
    for i in np.flatnonzero(counts == 0):  # a shard drawn from keeps reporting its size
        counts[np.argmax(counts)] -= 1
        counts[i] = 1
    return {s.shard: int(c) for s, c in zip(present, counts, strict=True)}


def pooled_weights(samples: list[Sample | None]) -> np.ndarray:
    """The importance weights of the rows of ``samples``, concatenated, as one replay holding every
    shard's rows would give them. Each shard normalises by its own least priority
    (``(floor / p) ** beta``); pooled, all are normalised by the least of all."""
    present = [s for s in samples if s is not None]
    if not _steerable(present):
        return np.concatenate([s.weights for s in present])
    floor = min(s.floor for s in present)
    return np.concatenate([s.weights * np.float32((floor / s.floor) ** s.beta) for s in present])
