"""What the loss of a role instance means is decided in one place (``dagrl.runtime.recovery``), from what
each role declares and what the graph says, for every policy alike."""

from __future__ import annotations

import pytest

from dagrl.app.graphs import load_graph
from dagrl.runtime.hosts import Handle
from dagrl.runtime.recovery import Action, Recovery
from dagrl.runtime.supervisor import RoleFailure

ON_A_CLUSTER = object()
"""Where a supervisor would be: :meth:`Recovery.action` only asks whether there is one."""


def _hosts(graph) -> dict[str, list[Handle]]:
    return {
        role: [Handle(role, i, None, f"tcp://10.0.0.{i}:1") for i in range(spec.replicas)]
        for role, spec in graph.active_roles.items()
    }


def _failure(hosts, role: str, kind: str = "lost", index: int = 0) -> RoleFailure:
    return RoleFailure(hosts[role][index], kind, OSError("worker gone"))


@pytest.mark.parametrize(
    ("graph", "role", "action"),
    [
        ("ppo-cartpole-sync", "sampler", Action.REPLACE),
        ("ppo-cartpole-sync", "learner", Action.ROLLBACK),
        ("ppo-cartpole-sync", "evaluator", Action.REPLACE),  # single-instance, but holds no run state
        ("dqn-cartpole-apex", "replay", Action.REPLACE),  # its factory reopens the store
        ("dqn-cartpole-apex", "learner", Action.ROLLBACK),
    ],
)
def test_each_role_is_recovered_as_it_declares(graphs_dir, graph, role, action):
    g = load_graph(f"{graphs_dir}/{graph}.yaml", ["evaluate.every=5"])
    hosts = _hosts(g)
    assert Recovery(g, hosts, ON_A_CLUSTER).action(_failure(hosts, role)) is action
    assert Recovery(g, hosts, None).action(_failure(hosts, role)) is Action.ROLLBACK  # nothing to start one on


def test_a_growing_role_drops_a_replica_lost_above_its_start_and_replaces_one_that_raised(graphs_dir):
    g = load_graph(
        f"{graphs_dir}/ppo-cartpole-async.yaml", ["roles.sampler.replicas=2", "roles.sampler.max_replicas=4"]
    )
    hosts = _hosts(g)
    recovery = Recovery(g, hosts, ON_A_CLUSTER)
    assert recovery.action(_failure(hosts, "sampler")) is Action.REPLACE  # at its floor: replaced
    hosts["sampler"].append(Handle("sampler", 2, None, "tcp://10.0.0.9:1"))  # a worker joined
    assert recovery.action(_failure(hosts, "sampler", index=2)) is Action.DROP
    assert recovery.action(_failure(hosts, "sampler", "raised", index=2)) is Action.REPLACE  # its worker lives
    recovery.gone["sampler"].add(2)
    assert recovery.dropped(hosts["sampler"][2]) and recovery.active("sampler") == 2
    assert recovery.action(_failure(hosts, "sampler")) is Action.REPLACE  # back at its floor


def test_a_data_parallel_replica_rolls_the_group_back_and_a_rollback_is_raised_for_the_driver(graphs_dir):
    g = load_graph(f"{graphs_dir}/ppo-cartpole-dp.yaml")
    hosts = _hosts(g)
    recovery = Recovery(g, hosts, ON_A_CLUSTER)
    recovery.groups = frozenset({"learner"})
    failure = _failure(hosts, "learner", index=1)
    assert recovery.action(failure) is Action.ROLLBACK
    with pytest.raises(RoleFailure) as raised:
        recovery.recover(failure)
    assert raised.value is failure
