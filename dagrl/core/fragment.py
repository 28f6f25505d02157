"""Fragments, role states and the tracing that turns a training iteration into a graph.

An algorithm is written as plain functions:

* role-state factories, ``@role("sampler", many=True)``: build the state one role instance keeps
  (envs, networks, optimiser) from a :class:`~dagrl.core.context.RoleContext` and the hyperparameters;
* fragments, ``@fragment(role="sampler")``: take that state explicitly as their first argument and
  return new data;
* one ``@iteration`` function that calls fragments *without* their state argument. Tracing it once
  records which fragment feeds which: the fragment graph a distribution policy maps onto actors;
* one :class:`Manifest`, bound to ``ALGORITHM``: its hyperparameters, role factories, iteration and
  evaluation. The runtime reads that and nothing else of the module; the fragments it runs are those
  the iteration and the evaluation call.

Called with its state, a fragment is an ordinary function (that is how it is unit-tested and how the
``single`` policy runs it). Called without, inside :func:`trace`, it records a :class:`Node`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Algorithm",
    "Edge",
    "Fragment",
    "FragmentGraph",
    "Manifest",
    "Node",
    "RoleDef",
    "evaluation",
    "fragment",
    "iteration",
    "load_algorithm",
    "role",
    "trace",
]

_tracing: contextvars.ContextVar[_Tracer | None] = contextvars.ContextVar("dagrl_trace", default=None)


class Fragment:
    """A training-loop function bound to the role that runs it.

    Examples
    --------
    >>> @fragment(role="learner")
    ... def publish(state):
    ...     return state.weights
    >>> publish.role
    'learner'
    """

    def __init__(self, fn: Callable[..., Any], role: str):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.role = role
        self.name = fn.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tracer = _tracing.get()
        if tracer is None:
            return self.fn(*args, **kwargs)
        if kwargs:
            raise TypeError(f"fragment {self.name}: pass inputs positionally while tracing")
        return tracer.record(self, args)

    def __repr__(self) -> str:
        return f"<fragment {self.name} role={self.role}>"


def fragment(*, role: str) -> Callable[[Callable[..., Any]], Fragment]:
    """Mark a function as a fragment run by ``role``; its first argument is that role's state."""

    def wrap(fn: Callable[..., Any]) -> Fragment:
        return Fragment(fn, role)

    return wrap


RECOVERY = ("replace", "rollback")


@dataclass(frozen=True)
class RoleDef:
    """How to build one instance of a role's state, whether the role may be replicated, and how a
    lost instance is recovered."""

    name: str
    factory: Callable[..., Any]
    many: bool = False
    recover: str = ""
    """``replace``: a new instance from the factory on a live worker, and the run goes on (samplers,
    evaluators, replay shards, whose factories reopen their stores); ``rollback``: a new instance and
    the whole run back to the last checkpoint (learners, whose state is the run). Default: ``replace``
    for a replicated role, ``rollback`` otherwise."""

    def __post_init__(self) -> None:
        if not self.recover:
            object.__setattr__(self, "recover", "replace" if self.many else "rollback")
        if self.recover not in RECOVERY:
            raise ValueError(f"role {self.name}: recover must be one of {', '.join(RECOVERY)}, got {self.recover!r}")


def role(name: str, *, many: bool = False, recover: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark ``factory(ctx, cfg) -> state`` as the state constructor of role ``name``.

    ``many=True`` declares that the role may run as several replicas (samplers); a value flowing from
    such a role into a single-instance role arrives there as a list, one item per replica. ``recover``
    says what happens when an instance is lost (:class:`RoleDef`); replication and recovery are
    separate, so a single-instance role that holds no run state (an evaluator) can be ``replace``.
    """
    definition = RoleDef(name, lambda *a: None, many, recover)  # checks recover where the algorithm says it

    def wrap(factory: Callable[..., Any]) -> Callable[..., Any]:
        factory.__dagrl_role__ = RoleDef(name, factory, many, definition.recover)  # type: ignore[attr-defined]
        return factory

    return wrap


def iteration(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Mark the function that calls fragments for one training iteration."""
    fn.__dagrl_iteration__ = True  # type: ignore[attr-defined]
    return fn


def evaluation(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Mark the function that calls fragments for one evaluation (run every ``evaluate.every``
    iterations of a graph); it returns a dict of ``eval/*`` metrics. Roles that only it uses (an
    ``evaluator``) are started only when the graph turns evaluation on."""
    fn.__dagrl_evaluation__ = True  # type: ignore[attr-defined]
    return fn


@dataclass(frozen=True)
class Node:
    """One fragment call in the traced iteration."""

    id: int
    fragment: Fragment
    inputs: tuple[Any, ...]  # Node or constant, positionally

    @property
    def role(self) -> str:
        return self.fragment.role

    @property
    def name(self) -> str:
        return self.fragment.name


@dataclass(frozen=True)
class Edge:
    src: Node
    dst: Node
    position: int


@dataclass
class FragmentGraph:
    """The fragment calls of one iteration, in call order (a topological order), and its output."""

    nodes: list[Node]
    output: Node | None

    @property
    def edges(self) -> list[Edge]:
        return [Edge(arg, node, i) for node in self.nodes for i, arg in enumerate(node.inputs) if isinstance(arg, Node)]

    def roles(self) -> list[str]:
        return list(dict.fromkeys(n.role for n in self.nodes))

    def consumers(self, node: Node) -> list[Node]:
        return [e.dst for e in self.edges if e.src is node]


class _Tracer:
    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def record(self, frag: Fragment, args: tuple[Any, ...]) -> Node:
        node = Node(len(self.nodes), frag, tuple(args))
        self.nodes.append(node)
        return node


def trace(fn: Callable[[], Any]) -> FragmentGraph:
    """Run ``fn`` once with fragments recording instead of executing.

    Examples
    --------
    >>> from dagrl.algos import ppo
    >>> graph = trace(ppo.train_iteration)
    >>> [n.name for n in graph.nodes]
    ['publish', 'collect', 'update']
    """
    tracer = _Tracer()
    token = _tracing.set(tracer)
    try:
        out = fn()
    finally:
        _tracing.reset(token)
    if out is not None and not isinstance(out, Node):
        raise TypeError(f"{fn.__name__} must return the output of a fragment call (or None)")
    return FragmentGraph(tracer.nodes, out)


@dataclass(frozen=True)
class Manifest:
    """What an algorithm module declares, as ``ALGORITHM = Manifest(...)``: all the runtime takes from it.

    Examples
    --------
    >>> from dagrl.algos import ppo
    >>> ppo.ALGORITHM.config.__name__, [f.__dagrl_role__.name for f in ppo.ALGORITHM.roles]
    ('Config', ['sampler', 'learner', 'evaluator', 'inference'])
    """

    config: type
    """The hyperparameter dataclass (a graph's ``hyperparameters`` are checked against it)."""
    roles: tuple[Callable[..., Any], ...]
    """The ``@role`` state factories, one per role its iteration and evaluation run on (and
    ``inference`` for central inference)."""
    iteration: Callable[[], Any]
    """The ``@iteration`` function: one training iteration."""
    evaluation: Callable[[], Any] | None = None
    """The ``@evaluation`` function, run every ``evaluate.every`` iterations; ``None``: none."""
    action_spaces: tuple[type, ...] = ()
    """The gymnasium space classes it acts in (empty: any), checked against the env before anything
    starts."""
    multi_agent: bool = False
    """It trains the agents of a PettingZoo game (``env.api: pettingzoo``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", tuple(self.roles))
        object.__setattr__(self, "action_spaces", tuple(self.action_spaces))
        if not dataclasses.is_dataclass(self.config):
            raise TypeError(f"Manifest: config must be a dataclass, got {self.config!r}")
        for factory in self.roles:
            if not hasattr(factory, "__dagrl_role__"):
                raise TypeError(f"Manifest: role {getattr(factory, '__name__', factory)!r} is not a @role factory")
        if not getattr(self.iteration, "__dagrl_iteration__", False):
            name = getattr(self.iteration, "__name__", self.iteration)
            raise TypeError(f"Manifest: iteration {name!r} is not @iteration")
        if self.evaluation is not None and not getattr(self.evaluation, "__dagrl_evaluation__", False):
            raise TypeError(f"Manifest: evaluation {self.evaluation.__name__!r} is not @evaluation")
        if not all(isinstance(t, type) for t in self.action_spaces):
            raise TypeError(f"Manifest: action_spaces must hold space classes, got {self.action_spaces!r}")


@dataclass
class Algorithm:
    """An algorithm module's :class:`Manifest`, traced: its roles by name, and the fragments its
    iteration and evaluation call."""

    name: str
    module: types.ModuleType
    manifest: Manifest
    roles: dict[str, RoleDef] = field(init=False)
    fragments: dict[str, Fragment] = field(init=False)
    graph: FragmentGraph = field(init=False)
    eval_graph: FragmentGraph | None = field(init=False)

    def __post_init__(self) -> None:
        self.roles = _in_order([factory.__dagrl_role__ for factory in self.manifest.roles])
        self.graph = trace(self.iteration)
        self.eval_graph = trace(self.evaluation) if self.evaluation is not None else None
        nodes = [*self.graph.nodes, *(self.eval_graph.nodes if self.eval_graph else [])]
        self.fragments = {node.name: node.fragment for node in nodes}
        for node in nodes:
            if node.role not in self.roles:
                raise TypeError(
                    f"algorithm {self.name}: fragment {node.name} runs on role {node.role!r}, "
                    f"which has no @role state factory in its manifest"
                )

    @property
    def config_cls(self) -> type:
        return self.manifest.config

    @property
    def iteration(self) -> Callable[[], Any]:
        return self.manifest.iteration

    @property
    def evaluation(self) -> Callable[[], Any] | None:
        return self.manifest.evaluation

    @property
    def action_spaces(self) -> tuple[type, ...]:
        return self.manifest.action_spaces

    @property
    def multi_agent(self) -> bool:
        return self.manifest.multi_agent

    @property
    def eval_only_roles(self) -> set[str]:
        """Roles used by the evaluation and not by training (started only when evaluation is on)."""
        if self.eval_graph is None:
            return set()
        return {n.role for n in self.eval_graph.nodes} - {n.role for n in self.graph.nodes}


ROLE_ORDER = ("sampler", "replay", "critic", "actor", "learner", "inference", "evaluator")
"""The usual roles in the order that gives each its seed (:func:`dagrl.runtime.hosts.role_seed`)."""


def _in_order(roles: list[RoleDef]) -> dict[str, RoleDef]:
    """Roles in :data:`ROLE_ORDER`, then an algorithm's roles of other names in the order its module binds
    them. Where a role factory comes from (its own module, a shared one, a function that makes it) does
    not change its place, so sharing code between algorithms never moves their seeds."""
    rank = {name: i for i, name in enumerate(ROLE_ORDER)}
    return {r.name: r for r in sorted(roles, key=lambda r: rank.get(r.name, len(ROLE_ORDER)))}


def load_algorithm(name: str) -> Algorithm:
    """Import an algorithm by short name (``ppo`` -> ``dagrl.algos.ppo``) or importable module path,
    and trace its :class:`Manifest`.

    Raises ``ModuleNotFoundError`` when no such module exists and ``TypeError`` when the module binds
    no ``ALGORITHM = Manifest(...)``, or its iteration calls a fragment of a role it does not list.
    """
    candidates = [name] if "." in name else [f"dagrl.algos.{name}", name]
    for modname in candidates:
        try:
            module = importlib.import_module(modname)
            break
        except ModuleNotFoundError as err:
            if err.name is None or not modname.startswith(err.name):
                raise  # the module exists but one of its own imports is missing
    else:
        raise ModuleNotFoundError(f"no algorithm module {' or '.join(map(repr, candidates))}")
    manifest = getattr(module, "ALGORITHM", None)
    if not isinstance(manifest, Manifest):
        raise TypeError(
            f"algorithm module {modname} declares no manifest: bind ALGORITHM = Manifest(config=Config, "
            f"roles=[...], iteration=train_iteration) (dagrl.Manifest)"
        )
    return Algorithm(name, module, manifest)
