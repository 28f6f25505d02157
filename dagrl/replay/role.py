"""The replay role shared by off-policy algorithms: its state and its fragments (``add``, ``sample``).

An off-policy algorithm imports these fragments and declares the role with a factory returning
:func:`replay_state`; its iteration then reads ``update(sample(add(collect(publish()))))``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagrl.context import Episodes, RoleContext
from dagrl.fragment import fragment
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


@dataclass
class ReplayState:
    store: ReplayStore
    batch_size: int
    batches: int
    """Batches per ``sample`` call: the gradient steps of one ``update`` call."""
    learning_starts: int
    shard: int = 0
    """This replica's index: which part of an :class:`UpdateResult` is its own."""

    def state_dict(self) -> dict[str, int]:
        return self.store.state_dict()

    def stats(self) -> dict[str, int]:
        return self.store.stats()

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
    """``batches x batch_size`` rows, or ``None`` until ``learning_starts`` rows are stored."""
    stored = len(state.store)
    if stored < max(state.learning_starts, state.batch_size):
        return None
    want = state.batch_size * state.batches
    if want <= stored:
        out = state.store.sample(want)
        out.shard = state.shard
        return out
    parts = [state.store.sample(min(stored, want - k)) for k in range(0, want, stored)]  # early on: rows repeat
    return Sample(
        {f: np.concatenate([p.data[f] for p in parts]) for f in parts[0].data},
        np.concatenate([p.indices for p in parts]),
        np.concatenate([p.weights for p in parts]),
        state.shard,
    )


@fragment(role="replay")
def reprioritize(state: ReplayState, result: UpdateResult) -> dict[str, float]:
    """Give this shard's sampled rows their new priorities (PER); pass the metrics on."""
    mine = result.priorities.get(state.shard)
    if mine is not None and state.store.prioritized:
        state.store.update_priorities(*mine)
    return result.metrics
