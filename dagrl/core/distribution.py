"""Distribution policies as data: their names, their options, and the iteration shapes each can run.

Graph files choose a policy either by name (``policy: async``) or with options
(``policy: {name: async, max_staleness: 2}``); this module validates both without importing Dask
or the runtime, so a bad graph is refused before anything starts. The engines that run the
policies live in :mod:`dagrl.policies`.

Every policy runs the same traced iteration; they differ in how its fragment calls are submitted:

* ``single``/``sync``: the whole iteration at once, each fragment on every replica of its role;
* ``async``/``apex``/``split-learner``: the iteration split at its *stream* (the first fragment on
  a replicated role, ``collect``): fragments *before* it run once per weights version, the stream
  runs back to back on every replica, *insert* fragments (consumers of the stream on another
  replicated role: a replay ``add``) run on each arrival, and the rest, the *learn* fragments,
  run as learner rounds tied to arrivals by a rate limiter.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from dagrl.core.fragment import Algorithm, Node

__all__ = [
    "INFERENCE_ROLE",
    "POLICY_OPTIONS",
    "CentralInferenceOptions",
    "ApexOptions",
    "AsyncOptions",
    "DataParallelOptions",
    "GroupOptions",
    "NoOptions",
    "POLICY_TRAITS",
    "StreamShape",
    "SyncOptions",
    "Traits",
    "check",
    "data_parallel_roles",
    "mail_edges",
    "stream_shape",
    "traits",
    "warmup_steps",
]


@dataclass
class NoOptions:
    """``single`` and ``sync`` take no options."""


@dataclass
class SyncOptions:
    mailbox: bool = True
    """Samplers on the learner's host wait for the next weights in a same-host mailbox
    (:mod:`dagrl.runtime.mailbox`), and the learner for their rollouts, rather than for Dask to send
    each task once its inputs exist: the iteration's two boundaries without the scheduler's round
    trips (BENCHMARKS.md). Across hosts, with ``false`` or with ``shared_memory: false``, the values
    go through Dask."""


BACKENDS = ("auto", "gloo", "nccl")


@dataclass
class GroupOptions:
    """How a learner role given ``replicas: K`` runs as a data-parallel group (:mod:`dagrl.runtime.groups`)."""

    backend: str = "auto"
    """``torch.distributed`` backend of the learner replicas: ``gloo`` (CPU, or CUDA tensors through
    the host), ``nccl`` (one distinct GPU per replica); ``auto``: nccl when every replica has a GPU
    of its own, else gloo."""
    timeout_s: float = 120.0
    """How long a replica waits for the others (joining the group, one gradient all-reduce) before
    failing; a replica whose peer died fails at once."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


@dataclass
class DataParallelOptions(GroupOptions):
    mailbox: bool = True
    """As ``sync``'s: samplers on a learner replica's host wait for its weights in a same-host
    mailbox, and each replica for its samplers' rollouts (:class:`SyncOptions`)."""


@dataclass
class AsyncOptions(GroupOptions):
    max_staleness: int = 4
    """Rollouts collected with weights older than this many updates are dropped (still counted)."""
    rollouts_per_update: int | Literal["auto"] = "auto"
    """The most rollouts one update takes (:mod:`dagrl.policies.pull`); ``auto``: as many as there are
    samplers, so a graph scales with samplers without retuning."""
    min_rollouts_per_update: int | None = None
    """The fewest rollouts an update waits for; default: ``rollouts_per_update`` (a full batch). Lower
    lets a learner faster than the samplers update on what has arrived, more often on smaller batches:
    each update is then a weights version, and a sampler's rollout ages by every update made while it
    collected, so at 1 a fast learner can age rollouts past ``max_staleness`` (dropped, counted)."""
    in_flight: int = 2
    """Rollouts per sampler on their way at once: the one being collected, plus ``in_flight - 1``
    waiting for the learner at its hub (at least one update's worth in all). A sampler whose rollout
    finds no room waits: the backpressure that bounds staleness."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.rollouts_per_update != "auto" and self.rollouts_per_update < 1:
            raise ValueError(f"rollouts_per_update must be >= 1 or auto, got {self.rollouts_per_update}")
        if self.min_rollouts_per_update is not None and self.min_rollouts_per_update < 1:
            raise ValueError(f"min_rollouts_per_update must be >= 1, got {self.min_rollouts_per_update}")
        if self.in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {self.in_flight}")

    def per_update(self, samplers: int) -> int:
        """The most rollouts one update takes with ``samplers`` samplers."""
        return samplers if self.rollouts_per_update == "auto" else int(self.rollouts_per_update)

    def least_per_update(self, samplers: int) -> int:
        """The fewest rollouts one update waits for with ``samplers`` samplers."""
        most = self.per_update(samplers)
        return most if self.min_rollouts_per_update is None else min(self.min_rollouts_per_update, most)


@dataclass
class ApexOptions(GroupOptions):
    update_ratio: float | None = None
    """Learner rounds per sampler collect; default one per N collects (N samplers), as ``sync``."""
    rate_limit: bool = True
    """Enforce ``update_ratio`` both ways (false: samplers and learner run free)."""
    max_lead: int | None = None
    """Collects samplers may run ahead of the ratio (default: one per sampler, what overlaps collecting with
    the learner's round; each more per sampler makes the acting weights a round staler: DQN on CartPole took
    1.17 x ``single``'s env steps to 195 with 2 per sampler, 1.11 x with 1 and 1.01 x with 0, median of 8 seeds)."""
    publish_every: int = 1
    """Learner rounds between weight pushes to the samplers."""
    in_flight: int = 2
    """Collect calls each sampler keeps queued on its worker."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.update_ratio is not None and self.update_ratio <= 0:
            raise ValueError(f"update_ratio must be > 0, got {self.update_ratio}")
        if self.max_lead is not None and self.max_lead < 0:
            raise ValueError(f"max_lead must be >= 0, got {self.max_lead}")
        if self.publish_every < 1:
            raise ValueError(f"publish_every must be >= 1, got {self.publish_every}")
        if self.in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {self.in_flight}")


@dataclass(frozen=True)
class Traits:
    """What a policy is, beside its options: the graph checks, the CLI, the tuner and the role hosts read
    these, never a policy's name."""

    distributed: bool = True
    """Runs on a Dask cluster (``False``: every role in the driver's process)."""
    streams: bool = False
    """Samplers loop on their workers and the learner pulls what arrived (:mod:`dagrl.runtime.watch`);
    else each iteration is one graph of calls, submitted at once (:mod:`dagrl.runtime.iteration`)."""
    replay: bool = False
    """Samplers feed replay, the learner samples it (off-policy); else rollouts go to the learner."""
    inference: bool = False
    """An ``inference`` role picks every sampler's actions."""
    data_parallel: bool = False
    """Learner roles may run as identical replicas averaging gradients."""
    split: bool = False
    """Two learner roles update at once, a value between them arriving one round late."""
    grows: bool = False
    """Samplers may grow to ``max_replicas`` as workers join, and shrink back as they leave."""
    snapshots: bool = False
    """The samplers' envs are checkpointed with the run, so a resume goes on exactly."""
    cost: str = ""
    """The tuner's cost model of it (:mod:`dagrl.app.tune.model`): ``serial`` (one process), ``lockstep``,
    ``stream`` (rollouts to the learner), ``replay``; empty: not modelled."""


POLICY_TRAITS: dict[str, Traits] = {
    "single": Traits(distributed=False, snapshots=True, cost="serial"),
    "sync": Traits(snapshots=True, cost="lockstep"),
    "async": Traits(streams=True, grows=True, data_parallel=True, cost="stream"),
    "apex": Traits(streams=True, replay=True, data_parallel=True, cost="replay"),
    "split-learner": Traits(streams=True, replay=True, split=True, cost="replay"),
    "dp-learners": Traits(data_parallel=True),
    "central-inference": Traits(inference=True),
}


def traits(policy: str, options: Any = None) -> Traits:
    """``policy``'s :class:`Traits` with ``options`` (central inference with ``asynchronous: true`` streams).

    >>> traits("apex").replay, traits("central-inference", CentralInferenceOptions(asynchronous=True)).streams
    (True, True)
    """
    found = POLICY_TRAITS[policy]
    if found.inference and getattr(options, "asynchronous", False):
        return dataclasses.replace(found, streams=True)
    return found


INFERENCE_ROLE = "inference"
"""The role ``central-inference`` starts to pick every sampler's actions; an algorithm declares it with
``@role("inference", recover="replace")`` (its state: the acting object samplers would use) and no
fragment, and other policies leave it unstarted."""


@dataclass
class CentralInferenceOptions:
    max_wait_ms: float = 1.0
    """How long the inference role waits, after a step's first request, for the other samplers'
    before answering with the batch it has (every sampler asking ends the wait at once). Samplers
    drift apart within an iteration, so a long window mostly holds back those that have asked: PPO
    Pong with 14 samplers and a GPU inference role ran 1.04 x ``sync`` with 5 ms and 1.28 x with
    0.25 ms (BENCHMARKS.md); on the CartPole MLP, 1 ms and 5 ms were within 6 %."""
    asynchronous: bool = False
    """``true``: the samplers stream as under ``async`` (SEED RL's shape): the learner updates on
    every ``rollouts_per_update`` rollouts while they go on collecting, and the inference role takes
    each new weights version as it is published, between two env steps. ``false``: lockstep, as ``sync``."""
    max_staleness: int | None = None
    """With ``asynchronous``: as ``async``'s (default 4)."""
    rollouts_per_update: int | None = None
    """With ``asynchronous``: the rollouts each update takes (default 1)."""
    in_flight: int | None = None
    """With ``asynchronous``: as ``async``'s (default 2)."""

    def __post_init__(self) -> None:
        if not self.max_wait_ms >= 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self._given() and not self.asynchronous:
            raise ValueError(f"{', '.join(self._given())} only apply with asynchronous: true")
        self.streaming  # noqa: B018  (async's checks of the given values)

    def _given(self) -> dict[str, int]:
        keys = ("max_staleness", "rollouts_per_update", "in_flight")  # not min_: this form takes exactly
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}

    @property
    def streaming(self) -> AsyncOptions:
        """The options of the stream under ``asynchronous``, ``async``'s defaults filled in (one
        rollout per update: this form's learner rounds take exactly that many)."""
        return AsyncOptions(**{"rollouts_per_update": 1, **self._given()})


POLICY_OPTIONS: dict[str, type] = {
    "single": NoOptions,
    "sync": SyncOptions,
    "dp-learners": DataParallelOptions,
    "async": AsyncOptions,
    "apex": ApexOptions,
    "split-learner": ApexOptions,
    "central-inference": CentralInferenceOptions,
}
"""Every policy name and the dataclass of its options."""


@dataclass(frozen=True)
class StreamShape:
    """An iteration split at its stream (see the module docstring)."""

    before: list[Node]
    stream: Node
    insert: list[Node]
    learn: list[Node]


def stream_shape(algorithm: Algorithm) -> StreamShape:
    """Split the iteration at its first fragment on a replicated role; ``TypeError`` if it has none."""
    nodes, roles = algorithm.graph.nodes, algorithm.roles
    streamed = [n for n in nodes if roles[n.role].many]
    if not streamed:
        raise TypeError("needs a fragment on a replicated role (samplers) in the iteration")
    stream = streamed[0]
    if any(isinstance(a, Node) and roles[a.role].many for a in stream.inputs):
        raise TypeError(f"{stream.name} may only take inputs from single-instance roles")
    before = [n for n in nodes if n.id < stream.id]
    insert = [n for n in nodes if n.id > stream.id and stream in n.inputs and roles[n.role].many]
    if any(n.role == stream.role for n in insert):
        raise TypeError(f"the consumers of {stream.name} must run on another role (replay)")
    learn = [n for n in nodes if n.id > stream.id and n not in insert]
    return StreamShape(before, stream, insert, learn)


def mail_edges(algorithm: Algorithm) -> dict[tuple[int, int], tuple[int, ...]]:
    """Edges (src, dst node ids) whose value the consumer may wait for in a same-host mailbox, its task
    already running (:mod:`dagrl.runtime.mailbox`), each with the nodes of the consumer's role that it
    must then also wait for (an ordering edge within the iteration).

    A waiting task holds its worker's thread, so nothing the producer needs may queue behind it there.
    Submitted behind the previous iteration, a consumer starts once its role's previous call ended:

    * *broadcast*, from a single-instance role (``publish -> collect``): the consumer's role has no
      other fragment in the iteration and none the producer depends on (not a replay shard's
      ``reprioritize``, whose ``add`` and ``sample`` the learner's ``update`` waits for);
    * *gather*, from a replicated role into a single-instance one (``collect -> update``,
      ``sample -> update``): the consumer also waits for the fragments of its role that the producer
      depends on (``publish``), so it never holds the thread one of them needs.
    """
    nodes, roles = algorithm.graph.nodes, algorithm.roles
    per_role = collections.Counter(n.role for n in nodes)

    def ancestors(node: Node) -> list[Node]:
        seen: dict[int, Node] = {}
        todo = [node]
        while todo:
            for a in todo.pop().inputs:
                if isinstance(a, Node) and a.id not in seen:
                    seen[a.id] = a
                    todo.append(a)
        return list(seen.values())

    out = {}
    for e in algorithm.graph.edges:
        src, dst = e.src, e.dst
        if src.role == dst.role:
            continue
        before = [a for a in ancestors(src) if a.role == dst.role]
        if not roles[src.role].many and per_role[dst.role] == 1 and not before:
            out[src.id, dst.id] = ()
        elif roles[src.role].many and not roles[dst.role].many:
            out[src.id, dst.id] = tuple(sorted(a.id for a in before))
    return out


def delayed_edges(algorithm: Algorithm) -> set[tuple[int, int]]:
    """``split-learner``: (src, dst) node ids of learn-side edges between two single-instance roles;
    such an edge carries the previous round's value, so both roles update at once."""
    learn = {n.id for n in stream_shape(algorithm).learn}
    roles = algorithm.roles
    return {
        (e.src.id, e.dst.id)
        for e in algorithm.graph.edges
        if e.src.id in learn and e.dst.id in learn and e.src.role != e.dst.role
        and not roles[e.src.role].many and not roles[e.dst.role].many
    }  # fmt: skip


def warmup_steps(config: Any) -> int:
    """Env steps stored before the learner has anything to learn from: the hyperparameter
    ``learning_starts`` of an off-policy algorithm (its replay samples nothing until then), else 0.
    The stream policies let samplers run free until then and start no learner round."""
    return max(0, int(getattr(config, "learning_starts", 0) or 0))


def check(policy: str, algorithm: Algorithm, options: Any = None) -> None:
    """Raise ``TypeError`` (one line) if ``policy`` (with ``options``) cannot run ``algorithm``'s iteration."""
    kind = traits(policy)
    if kind.inference:
        if INFERENCE_ROLE not in algorithm.roles:
            raise TypeError(
                f"needs an {INFERENCE_ROLE!r} role whose state picks actions for samplers "
                f"(@role({INFERENCE_ROLE!r}) and ctx.acting in the sampler, as in ppo.py); "
                f"this algorithm has roles {', '.join(algorithm.roles)}"
            )
        stream_shape(algorithm)  # samplers, fed by single-instance roles (the weights)
        if getattr(options, "asynchronous", False):
            check("async", algorithm)
        return
    if not kind.streams:
        return
    if not kind.replay:
        streamed = [n.name for n in algorithm.graph.nodes if algorithm.roles[n.role].many]
        if len(streamed) != 1:
            raise TypeError(
                "needs exactly one fragment on a replicated role, streamed straight to the learner; found "
                f"{', '.join(streamed) or 'none'} (an off-policy shape with replay: use apex)"
            )
        stream_shape(algorithm)  # its inputs come from single-instance roles
        return
    shape = stream_shape(algorithm)
    stream = shape.stream
    direct = [n.name for n in shape.learn if stream in n.inputs]
    if not shape.insert or direct:
        raise TypeError(
            f"{policy} needs samplers -> replay -> learner, but {stream.name} feeds "
            f"{', '.join(direct) or 'nothing'} directly (an on-policy iteration: use sync or async)"
        )
    if not shape.learn:
        raise TypeError(f"{policy}: nothing runs after {', '.join(n.name for n in shape.insert)} (no learner round)")
    if kind.split and not delayed_edges(algorithm):
        raise TypeError(
            "split-learner needs two learner roles that pass values within a round "
            "(e.g. critic -> actor, as in sac.py); this iteration has none"
        )


def data_parallel_roles(algorithm: Algorithm) -> list[str]:
    """Roles ``dp-learners`` may run as several identical replicas: single-instance roles whose state
    is the run (``recover="rollback"``: learners), not evaluators or replicated roles."""
    return [name for name, r in algorithm.roles.items() if not r.many and r.recover == "rollback"]


FLAT_KEYS = ("max_staleness", "rollouts_per_update", "update_ratio", "rate_limit", "max_lead", "publish_every")
"""Top-level graph keys of earlier graph files, read as options of the policy they belong to."""


def policy_options(policy: Any, flat: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The policy's name and raw options from a graph's ``policy`` value and its flat keys.

    ``policy`` is a name or ``{name: ..., option: value}``. Flat keys that belong to the chosen
    policy's options join them (giving one both ways is an error); the others are ignored, as
    they always were. Raises ``KeyError(key, problem)`` naming the offending key.
    """
    if isinstance(policy, str):
        name, options = policy, {}
    elif isinstance(policy, dict):
        options = dict(policy)
        name = options.pop("name", None)
        if not isinstance(name, str):
            raise KeyError("policy.name", f"expected a policy name, got {name!r}")
    else:
        raise KeyError("policy", f"expected a name or a mapping with a name, got {policy!r}")
    if name not in POLICY_OPTIONS:
        raise KeyError("policy", f"unknown policy {name!r} (expected one of: {', '.join(POLICY_OPTIONS)})")
    fields = POLICY_OPTIONS[name].__dataclass_fields__
    for key, value in flat.items():
        if value is None or key not in fields:
            continue
        if key in options:
            raise KeyError(key, f"given twice: here and as policy.{key}; keep policy.{key}")
        options[key] = value
    return name, options
