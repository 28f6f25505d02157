"""Text and Graphviz views of a graph: roles, replicas, fragments and how data moves between them."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym

from dagrl.core.distribution import INFERENCE_ROLE
from dagrl.core.fragment import Edge
from dagrl.core.graph import Graph


def edge_kind(graph: Graph, edge: Edge) -> str:
    """How the policy moves this edge's data: local, broadcast, gather or stream."""
    roles = graph.algorithm.roles
    src_many, dst_many = roles[edge.src.role].many, roles[edge.dst.role].many
    if edge.src.role == edge.dst.role:
        kind = "local"
    elif dst_many and src_many:
        kind = "shard"
    elif dst_many:
        kind = "broadcast"
    elif src_many:
        kind = "gather"
    else:
        kind = "direct"
    if graph.traits.split:
        from dagrl.core.distribution import delayed_edges

        if (edge.src.id, edge.dst.id) in delayed_edges(graph.algorithm):
            kind = "direct, one round late"
    if graph.traits.cost == "stream" and (src_many or dst_many):
        options = graph.policy_options
        kind = (
            f"stream, {kind}, staleness <= {options.max_staleness}"
            if dst_many
            else f"stream, {options.rollouts_per_update} per update"
        )
        learners = graph.spec.roles[edge.dst.role].replicas
        if src_many and not dst_many and learners > 1:  # a learner group shares each round
            kind += f", shared by {learners} learners"
    return kind


def describe(graph: Graph) -> str:
    """A plain-text summary, as printed by ``dagrl graph``."""
    spec, algo = graph.spec, graph.algorithm
    lines = [
        f"graph {graph.name}: algorithm {spec.algorithm}, env {spec.env.id}, policy {spec.policy}, seed {spec.seed}"
    ]
    lines.append(f"observations: {observations(graph.observation_space, graph.env_observation_space)}")
    lines.append(f"actions: {graph.action_space}")
    lines.append("roles:")
    active = graph.active_roles
    for name, rdef in algo.roles.items():
        r = spec.roles[name]
        frags = ", ".join(f.name for f in algo.fragments.values() if f.role == name)
        if name == INFERENCE_ROLE:
            frags = "(acts for every sampler, batched)"
        if name not in active:
            frags += "  [not started: " + ("evaluate.every is off]" if name in algo.eval_only_roles else "policy]")
        res = ", ".join(f"{k}={v:g}" for k, v in r.resources.items()) or "-"
        envs = f"envs {r.envs:<3}" if rdef.many else " " * 8
        if r.vector != "auto":  # how those envs are stepped, when the graph chose
            n = r.vector_threads
            threads = f", {n} thread{'s' if n > 1 else ''}" if n else ""
            frags += f"  [vector {r.vector}{threads}]"
        lines.append(f"  {name:<10} x{r.replicas:<3} {envs} resources {res:<12} fragments: {frags}")
    lines.append("one iteration:")
    edges = algo.graph.edges
    for node in algo.graph.nodes:
        ins = [f"{e.src.name} ({edge_kind(graph, e)})" for e in edges if e.dst is node]
        arrow = f" <- {', '.join(ins)}" if ins else ""
        out = "   => metrics" if node is algo.graph.output else ""
        lines.append(f"  {node.name:<10} @{node.role:<10}{arrow}{out}")
    lines.append("hyperparameters (* as the graph sets them, the others the algorithm's defaults):")
    given = set(spec.hyperparameters)
    for f in dataclasses.fields(graph.config):
        lines.append(f"  {'*' if f.name in given else ' '} {f.name} = {getattr(graph.config, f.name)!r}")
    return "\n".join(lines)


def observations(space: Any, env_space: Any = None) -> str:
    """What the networks take, what the built-in algorithms' encoder (:func:`dagrl.nn.encoders.encoder`) makes
    of it, and what the env gave where that differs.

    >>> import numpy as np
    >>> stacked = gym.spaces.Box(0, 255, (4, 96, 96, 3), np.uint8)  # 4 RGB frames, channels last
    >>> observations(gym.spaces.Box(0, 255, (12, 96, 96), np.uint8), stacked)
    'uint8 image (12, 96, 96); networks.encoder: a Nature CNN; the env gives Box(0, 255, (4, 96, 96, 3), uint8)'
    """
    from dagrl.spaces.images import is_image
    from dagrl.spaces.mixed import MixedBox

    if isinstance(space, MixedBox):
        parts = ", ".join(f"{p.key} image {p.image}" if p.image else f"{p.key} {p.size} float32" for p in space.parts)
        shown = f"uint8 vector of {space.shape[0]} bytes ({parts}); networks.encoder: a Nature CNN per image"
        env_space = space.source
    elif is_image(space):
        shown = f"uint8 image {space.shape}; networks.encoder: a Nature CNN"
    elif isinstance(space, gym.spaces.Box):
        shown = f"{space.dtype} {space.shape}; networks.encoder: an MLP"
    else:
        shown = str(space)
    if env_space is not None and env_space != space:
        shown += f"; the env gives {env_space}"
    return shown


def to_dot(graph: Graph) -> str:
    """The fragment graph as Graphviz DOT, one cluster per role."""
    algo = graph.algorithm
    out = [f'digraph "{graph.name}" {{', "  rankdir=LR;", "  node [shape=box, style=rounded];"]
    for name in algo.roles:
        r = graph.spec.roles[name]
        out.append(f'  subgraph "cluster_{name}" {{ label="{name} x{r.replicas}";')
        out += [f'    n{n.id} [label="{n.name}"];' for n in algo.graph.nodes if n.role == name]
        out.append("  }")
    out += [f'  n{e.src.id} -> n{e.dst.id} [label="{edge_kind(graph, e)}"];' for e in algo.graph.edges]
    out.append("}")
    return "\n".join(out) + "\n"


def to_task_dot(graph: Graph) -> str:
    """One iteration as the Dask tasks a lockstep policy submits: a node per fragment call per replica,
    named like the task keys (``collect-sampler-0``), edges routed by the one rule, per worker."""
    from dagrl.core.fragment import Node
    from dagrl.runtime.executor import route

    algo, roles = graph.algorithm, graph.algorithm.roles
    names = {
        n.id: [f"{n.name}-{n.role}-{r}" for r in range(graph.spec.roles[n.role].replicas)] for n in algo.graph.nodes
    }
    out = [f'digraph "{graph.name} tasks" {{', "  rankdir=LR;", "  node [shape=box, style=rounded];"]
    for role, rspec in graph.spec.roles.items():
        for r in range(rspec.replicas if role in graph.active_roles else 0):
            tasks = [names[n.id][r] for n in algo.graph.nodes if n.role == role]
            if tasks:
                out.append(f'  subgraph "cluster_{role}_{r}" {{ label="worker of {role}[{r}]";')
                out += [f'    "{t}";' for t in tasks]
                out.append("  }")
    for node in algo.graph.nodes:
        for r, dst in enumerate(names[node.id]):
            for a in node.inputs:
                if isinstance(a, Node):
                    srcs = route(names[a.id], a.role, node.role, roles, r, len(names[node.id]))
                    for src in srcs if isinstance(srcs, list) else [srcs]:
                        out.append(f'  "{src}" -> "{dst}";')
    out.append("}")
    return "\n".join(out) + "\n"
