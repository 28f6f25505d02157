"""More samplers than cores on dagrl's own LocalCluster: as many as the cores, stepping the envs asked for."""

from __future__ import annotations

import logging
import math

from dagrl.app.graphs import resolve_graph
from dagrl.core.graph import MAX_ENVS, Graph

log = logging.getLogger("dagrl")


PACK_NOTE = """Why samplers are merged, not co-located: on the 2-core reference machine, a CPU-bound env (0.2 ms
of CPU a step) under ``async`` made 3,747 env steps/s as 8 samplers of 4 envs on 9 worker processes, 3,659 with
those 8 samplers sharing 3 processes, and 5,323 as 2 samplers of 16 envs: what pays is one batched forward over
16 envs instead of 4 over 4 each, and fewer processes taking turns on the cores, not fewer processes alone."""

ROLLOUT_KEYS = ("rollouts_per_update", "min_rollouts_per_update")
"""Policy options counted in rollouts: merged samplers' rollouts are larger, so they shrink with the count."""


def packed_samplers(graph: Graph, cores: int) -> Graph:
    """``graph`` as dagrl's own LocalCluster runs it on ``cores`` cores (``pack_samplers``): where more sampler
    replicas than cores are asked for, as few as the cores allow (the largest divisor of ``replicas`` not
    above ``cores``, so every one steps as many envs), together stepping the envs asked for: 8 samplers of 4
    envs on 2 cores run as 2 of 16 (:data:`PACK_NOTE`). Options counted in rollouts (``rollouts_per_update``)
    shrink with the count and ``update_ratio`` (learner rounds per collect) grows with each collect, so an
    update learns from as many env steps as written. ``graph`` itself when nothing changes: samplers
    within the cores, or elastic ones (``max_replicas``)."""
    role = graph.spec.roles.get("sampler")
    if role is None or role.max_replicas is not None or role.replicas <= cores or "sampler" not in graph.active_roles:
        return graph
    total = role.replicas * role.envs
    fits = [k for k in range(1, role.replicas + 1) if role.replicas % k == 0 and total // k <= MAX_ENVS[role.vector]]
    count = max([k for k in fits if k <= cores] or fits[:1])
    if count == role.replicas:
        return graph
    data, factor = graph.to_dict(), role.replicas // count
    data["roles"]["sampler"].update(replicas=count, envs=role.envs * factor)
    options = data["policy"] if isinstance(data["policy"], dict) else {}
    for key in ROLLOUT_KEYS:
        if isinstance(options.get(key), int):
            options[key] = max(1, math.ceil(options[key] / factor))
    if options.get("update_ratio") is not None:
        options["update_ratio"] *= factor
    log.info(
        "sampler: %d replicas of %d envs on %d cores run as %d of %d (the local cluster's pack_samplers; "
        "false keeps them as written)", role.replicas, role.envs, cores, count, role.envs * factor,
    )  # fmt: skip
    return resolve_graph(data, graph.path)
