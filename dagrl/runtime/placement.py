"""Choosing a worker for every role replica (Dask holds no resources for actors, so dagrl does).

Devices and resources: design notes
-----------------------------------

A role with ``resources: {GPU: 1}`` is placed on a worker advertising ``GPU`` and its state factory gets
``ctx.device == "cuda"`` when that worker has CUDA. Without one, the host falls back to CPU and the driver logs
one line; ``gpu_fallback: false`` turns that into an error before any cluster starts (local clusters) or at
actor start (remote clusters). Weights cross processes as CPU numpy arrays.

A learner on a GPU whose networks are small spends its time launching kernels, not running them. SAC, TD3 and
DQN take ``cuda_graphs: true``: their learner roles wrap one gradient step in
``dagrl.nn.cuda_graphs.CapturedStep``, which runs the first three calls eagerly on a side stream (lazy
initialisation), then captures the step once and replays it: each call copies its batch into the graph's input
tensors and replays one launch. That holds because a step's other tensors keep their storage (weights arriving
from the other role are copied into the parameters in place, Adam runs with ``capturable=True`` so its state
lives on the device, and the noise comes from a generator registered with the graph, so each replay draws new
numbers). Loading a checkpoint replaces the optimizer's state, so the load drops the graph and the next calls
capture again; it also sets ``capturable`` to what the device wants, so a checkpoint written by a capturing GPU
learner resumes on a CPU. TD3's critic has two captured steps, with and without the delayed Polyak update; DQN
copies its target network between replays, in place. Data-parallel DQN learners step as written: their
gradient all-reduce is not captured. Capture uses CUDA's thread-local mode, because two roles sharing a GPU
worker run their fragments on two threads at once. This is compute inside a role and knows nothing of Dask; on
the CPU the option changes nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from dagrl.core.graph import RoleSpec


class PlacementError(RuntimeError):
    pass


def place(
    roles: Mapping[str, RoleSpec],
    workers: Mapping[str, Mapping[str, Any]],
    *,
    gpu_fallback: bool = True,
    near: Collection[str] = (),
) -> dict[tuple[str, int], str]:
    """Map each ``(role, replica)`` to a worker address, one role actor per worker where possible.

    ``workers`` is :func:`dagrl.runtime.workers.workers`: address -> info with ``resources``.
    Roles asking for a GPU go first, onto workers advertising ``GPU``, then the roles in ``near``
    (the learners); the rest spread over the least-loaded workers, preferring, among those, the hosts
    of the ``near`` roles' replicas, evenly over them (rollouts travel the shortest way to a learner).
    A worker *named* ``<role>-<i>`` (SLURM's per-role jobs) takes replica i of that role. ``CPU`` is
    checked against a worker's threads; any other resource must be advertised by the worker
    (``dask worker --resources "SSD=1"``).

    Examples
    --------
    >>> from dagrl.core.graph import RoleSpec
    >>> w = {"tcp://a": {"resources": {"GPU": 1}}, "tcp://b": {"resources": {}}}
    >>> place({"sampler": RoleSpec(replicas=1), "learner": RoleSpec(resources={"GPU": 1})}, w)
    {('learner', 0): 'tcp://a', ('sampler', 0): 'tcp://b'}
    >>> w = {f"tcp://{h}:{p}": {"host": h} for h in ("n1", "n2") for p in (1, 2, 3)}
    >>> out = place({"learner": RoleSpec(replicas=1), "sampler": RoleSpec(replicas=2)}, w, near=["learner"])
    >>> sorted(host_of(w, a) for a in out.values())
    ['n1', 'n1', 'n1']
    """
    if not workers:
        raise PlacementError("the cluster has no workers")
    load = {addr: 0 for addr in sorted(workers)}
    free_gpu = {addr: float(info.get("resources", {}).get("GPU", 0)) for addr, info in workers.items()}
    out: dict[tuple[str, int], str] = {}
    taken: set[tuple[str, str]] = set()
    order = sorted(roles.items(), key=lambda kv: (-kv[1].gpus, kv[0] not in near))
    drawn: dict[str, int] = {}  # per host of a near role's replica: the other replicas placed on it
    for name, spec in order:
        for i in range(spec.replicas):
            candidates = [a for a in load if _fits(spec, workers[a])]
            if not candidates:
                raise PlacementError(f"role {name} needs {spec.resources} and no worker offers it")
            if spec.gpus > 0:
                gpu_ok = [a for a in candidates if free_gpu[a] >= spec.gpus]
                if gpu_ok:
                    candidates = gpu_ok
                elif not gpu_fallback:
                    raise PlacementError(f"role {name} needs GPU={spec.gpus:g} and no worker has it free")
            named = [a for a in candidates if workers[a].get("name") == f"{name}-{i}" and load[a] == 0]
            if named:  # a worker started for this replica (SLURM's per-role jobs)
                candidates = named
            addr = min(  # least loaded; among equals, one without this role (data-parallel replicas),
                candidates,  # then the learners' hosts, the least drawn first
                key=lambda a: (
                    load[a],
                    (name, a) in taken,
                    drawn.get(host_of(workers, a), len(out) + 1),
                    -free_gpu[a] if spec.gpus else free_gpu[a],
                ),
            )
            if name in near:
                drawn.setdefault(host_of(workers, addr), 0)
            elif host_of(workers, addr) in drawn:
                drawn[host_of(workers, addr)] += 1
            if spec.gpus > 0 and free_gpu[addr] >= spec.gpus:
                free_gpu[addr] -= spec.gpus
            load[addr] += 1
            taken.add((name, addr))
            out[(name, i)] = addr
    return out


def host_of(workers: Mapping[str, Mapping[str, Any]], address: str) -> str:
    """The host of worker ``address``: the scheduler's ``host``, else the address's own."""
    host = workers.get(address, {}).get("host")
    if host:
        return str(host)
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def _fits(spec: RoleSpec, info: Mapping[str, Any]) -> bool:
    """Whether a worker can host the role at all (GPU is judged apart, with its CPU fallback)."""
    offered = info.get("resources", {}) or {}
    for key, amount in spec.resources.items():
        if key == "GPU":
            continue
        have = info.get("nthreads", 1) if key == "CPU" else offered.get(key, 0)
        if have < amount:
            return False
    return True


def place_one(
    name: str,
    spec: RoleSpec,
    workers: Mapping[str, Mapping[str, Any]],
    load: Mapping[str, int],
    gpu_fallback: bool,
    avoid: frozenset[str] = frozenset(),
    near: frozenset[str] = frozenset(),
) -> str | None:
    """The least-loaded live worker that fits one replica of ``name`` (a replacement), or ``None``.

    GPU roles prefer workers advertising ``GPU``; CPU roles prefer workers without one; among equals, a
    worker on one of the hosts ``near`` (the learners'). Workers in ``avoid`` (those of the role's other
    data-parallel replicas, one process each) are never chosen.
    """
    candidates = [a for a in sorted(workers) if _fits(spec, workers[a]) and a not in avoid]
    has_gpu = {a: float(workers[a].get("resources", {}).get("GPU", 0)) >= max(spec.gpus, 1e-9) for a in candidates}
    if spec.gpus > 0:
        gpu_ok = [a for a in candidates if has_gpu[a]]
        if gpu_ok or not gpu_fallback:
            candidates = gpu_ok
    if not candidates:
        return None
    return min(
        candidates, key=lambda a: (load.get(a, 0), has_gpu[a] != (spec.gpus > 0), host_of(workers, a) not in near)
    )
