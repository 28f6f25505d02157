"""Fragments, role states and the tracing that turns a training iteration into a graph.

An algorithm is written as plain functions:

* role-state factories, ``@role("sampler", many=True)``: build the state one role instance keeps
  (envs, networks, optimiser) from a :class:`~dagrl.core.context.RoleContext` and the hyperparameters;
* fragments, ``@fragment(role="sampler")``: take that state explicitly as their first argument and
  return new data;
* one ``@iteration`` function that calls fragments *without* their state argument. Tracing it once
  records which fragment feeds which: the fragment graph a distribution policy maps onto actors.

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


@dataclass
class Algorithm:
    """Everything the runtime needs from an algorithm module, found by its decorators."""

    name: str
    module: types.ModuleType
    config_cls: type
    roles: dict[str, RoleDef]
    fragments: dict[str, Fragment]
    iteration: Callable[[], Any]
    evaluation: Callable[[], Any] | None = None
    action_spaces: tuple[type, ...] = ()
    """The gymnasium space classes it acts in (the module's ``ACTION_SPACES``; empty: any), checked
    against the env before anything starts."""
    graph: FragmentGraph = field(init=False)
    eval_graph: FragmentGraph | None = field(init=False)

    def __post_init__(self) -> None:
        self.graph = trace(self.iteration)
        self.eval_graph = trace(self.evaluation) if self.evaluation is not None else None
        for node in [*self.graph.nodes, *(self.eval_graph.nodes if self.eval_graph else [])]:
            if node.role not in self.roles:
                raise TypeError(
                    f"algorithm {self.name}: fragment {node.name} runs on role {node.role!r}, "
                    f"which has no @role state factory"
                )

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
    """Import an algorithm by short name (``ppo`` -> ``dagrl.algos.ppo``) or importable module path.

    Raises ``ModuleNotFoundError`` when no such module exists and ``TypeError`` when the module does
    not define a ``Config`` dataclass, role factories, fragments and one ``@iteration`` function.
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
    roles: dict[str, RoleDef] = {}
    fragments: dict[str, Fragment] = {}
    iterations, evaluations = [], []
    for value in vars(module).values():
        if isinstance(value, Fragment):
            fragments[value.name] = value
        elif hasattr(value, "__dagrl_role__"):
            roles[value.__dagrl_role__.name] = value.__dagrl_role__
        elif getattr(value, "__dagrl_iteration__", False):
            iterations.append(value)
        elif getattr(value, "__dagrl_evaluation__", False):
            evaluations.append(value)
    roles = _in_order(list(roles.values()))
    config_cls = getattr(module, "Config", None)
    if config_cls is None or not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"algorithm module {modname} defines no Config dataclass")
    if len(iterations) != 1:
        raise TypeError(f"algorithm module {modname} must define exactly one @iteration function")
    if len(evaluations) > 1:
        raise TypeError(f"algorithm module {modname} defines more than one @evaluation function")
    action_spaces = tuple(getattr(module, "ACTION_SPACES", ()))
    if not all(isinstance(t, type) for t in action_spaces):
        raise TypeError(f"algorithm module {modname}: ACTION_SPACES must hold space classes, got {action_spaces!r}")
    evaluation_fn = (evaluations or [None])[0]
    return Algorithm(name, module, config_cls, roles, fragments, iterations[0], evaluation_fn, action_spaces)
