"""Distribution policies: how one training iteration maps onto role hosts. None knows an algorithm.

Each is a configuration of one engine (:class:`~dagrl.runtime.executor.Executor`): ``single`` and
``sync`` submit the whole iteration at once (:mod:`.lockstep`), ``dp-learners`` too, with
data-parallel learner replicas (:mod:`.dataparallel`), and ``central-inference``, with one batched
``inference`` role acting for every sampler (:mod:`.inference`; streamed as ``async`` with
``asynchronous: true``), ``async``,
``apex`` and ``split-learner`` stream the samplers to the learner, which pulls what has arrived
(through replay under ``apex`` and ``split-learner``), without the driver (:mod:`.pull`).
Their names and options are data in :mod:`dagrl.core.distribution`.

Design notes
------------

* ``single``: module: ``policies/lockstep.py``; maps the iteration to: the executor in-process: every role here,
  calls in order; replicas stepped in turn; status: done
* ``sync``: module: ``policies/lockstep.py``; maps the iteration to: the whole iteration submitted as one Dask
  graph; each node on all replicas of its role; broadcast/gather by the edge rule; status: done
* ``async``: module: ``policies/pull.py``, ``runtime/watch.py``, ``runtime/stream.py``; maps the iteration to: split
  at the one replicated fragment (the *stream*): each sampler runs it in a loop (one long-running task on its
  worker) and pushes each rollout, worker to worker, to a *hub* (a Dask actor beside the learner); a learner
  loop there takes what has arrived (1 to ``rollouts_per_update``, ``auto``: one per sampler), runs ``update`` and
  ``publish``; samplers take the newest weights version between rollouts. No task and no driver decision per
  rollout: the driver polls the hub at most every 50 ms and grants the rounds it may run before a checkpoint,
  a blocking evaluation or a foreseeable stop. Rollback: a new hub; the old one refuses and redirects; status:
  done
* ``apex``: module: ``policies/pull.py``, ``runtime/watch.py``, ``runtime/stream.py``, ``runtime/loops.py``; maps the
  iteration to: the stream's loops with replay between them: each sampler loop calls ``add`` on its shard (i mod
  K) itself and hands the hub only the report and the shard's answer; the learner loop runs `sample -> update
  -> reprioritize`` (the shards' fragments by actor RPC on their workers) and ``publish`` every ``publish_every`
  rounds; the hub holds ``update_ratio`` rounds per insert both ways, from the end of the warm-up
  (``learning_starts`` env steps: samplers free, an iteration per round's worth of inserts, as Reverb's
  ``min_size_to_sample``). A shard a loop fails on is replaced and the loop restarted, the learner's on the same
  hub (no rollback). ``roles.learner.replicas: K`` (here and under ``async``): a data-parallel group sharing each
  round, ``runtime/groups.py``; status: done (DQN, R2D2, SAC, TD3)
* ``dp-learners``: module: ``policies/dataparallel.py``; maps the iteration to: as ``sync``, with the learner role
  at ``replicas: K``: K data-parallel replicas in one ``torch.distributed`` group, learner k updating on samplers
  i mod K, gradients averaged each step; status: done (PPO, DQN)
* ``central-inference``: module: ``policies/inference.py``; maps the iteration to: as ``sync``; a ``load`` task gives
  the ``inference`` role the weights the samplers' fragment receives, and the samplers' tasks wait for it;
  samplers act through ``ctx.acting``, one request per env step on the inference worker's socket, answered from
  one batched forward (``runtime/inference.py``); with ``asynchronous: true`` the samplers stream as under ``async``
  and a loop beside the inference role loads each published version; status: done (PPO, IMPALA, ``ppo_lstm``)
* ``split-learner``: module: ``policies/pull.py``; maps the iteration to: as ``apex``, on the streams; a *delayed
  edge* between two single-instance learner roles inside a round (SAC: ``update_critic -> update_actor``)
  carries the previous round's value, so both learner roles run each round concurrently; status: done (SAC)

How the planned policies fit without touching algorithm files:

* **apex** (built) runs any iteration of the shape ``update(sample(add(collect(publish()))))``, the shape
  ``dagrl/algos/dqn.py`` has with the shared replay fragments of ``dagrl/replay/role.py``. The same file runs
  under ``single`` and ``sync`` (identical numbers, replay shards included).
* **split-learner** (built): actor-critic files are written with two learner roles, ``critic`` and ``actor``
  (``dagrl/algos/sac.py``): ``update_critic(batch, actor_weights)`` and ``update_actor(batch, critic_out)``,
  exchanging weights once per update call (``gradient_steps``). Under ``single``/``apex`` the actor waits for this
  round's critic; under ``split-learner`` it takes last round's, and both run at once on their own
  hosts/devices. Same file everywhere.
* **dp-learners** (built): the graph gives a single-instance ``recover="rollback"`` role (the learner)
  ``replicas: K``; the routing rule treats such a role as replicated on its way in (learner k gets the sampler
  outputs i % K == k; the graph must give the samplers a multiple of K) and as single on its way out, replica
  r of the receiver getting replica r % K's value (the same weights, read from K workers; a DQN update result
  back to the replay shards m % K that learner drew from, priorities keyed by shard); the iteration's metrics
  are averaged over replicas, ``perf/frames`` summed. From the second iteration on (the first ends with the
  replicas' states compared) the next iteration is submitted while one runs, and the same-host mailbox carries
  the weights out and the rollouts in, as under ``sync``: sampler i waits for replica i % K's posting, replica k
  for its own samplers'. ``dagrl.runtime.collective`` forms the group: rendezvous at replica 0's host on a port
  found free there, every replica joins at once (an actor method), then replica 0's state is copied to the
  others. The group is each worker process's default one, so a replica's host leaves it when it closes
  (``RoleHost._leave``), and a host made where no live host is in a group leaves one that a run ended without
  closing: otherwise a later run's learner on that worker averaged its gradients with the gone replicas and
  waited out gloo's timeout. That group's traffic (torch's TCPStore rendezvous, then gloo or NCCL) is not
  encrypted, even on a TLS cluster: NCCL has no encryption, and the torch wheel tested here (2.13.0+cpu) has
  no gloo TLS transport (``GLOO_DEVICE_TRANSPORT=TCP_TLS`` gives "unsupported gloo device"), so on a shared
  network keep data-parallel learners on one node or a trusted fabric (gradients only, never the cluster's
  certificate or a token). The algorithm's one contract is ``ctx.average_gradients(parameters)`` between
  ``backward()`` and clipping (one all-reduce of all gradients in a flat buffer; a no-op with one learner), plus
  ``ctx.mean_over_replicas(x)`` for decisions all replicas must share (PPO's ``target_kl`` early stop), and
  ``ctx.sum_over_replicas(x)`` for counts every replica must agree on (the env steps that clock PPO's
  ``anneal_lr``). The policy checks the replicas' state digests after the first iteration and at every
  checkpoint (a checkpoint stores replica 0's state once, so a run resumes with another K); an algorithm that
  forgets to average is stopped with its name. A lost replica rolls every replica back: a survivor whose
  all-reduce failed with its peer is not blamed (the dead peer is found by heartbeat), the dead one is
  replaced, the group re-formed and all replicas loaded from the checkpoint.
* **central-inference** (built): the sampler's state factory asks ``ctx.acting(Acting(agent, gen))`` for what
  picks its actions; it gets its own ``Acting`` back under every other policy (so ``single`` and ``sync`` stay
  bit-identical), and under ``central-inference`` a client of the ``inference`` role
  (``runtime/inference.InferenceClient``). The algorithm declares that role with `@role("inference",
  recover="replace")``, whose state is an ``Acting`` too (``__call__(obs, *extra)`` for a batch, ``load(weights)`);
  no fragment runs on it and no other policy starts it. ``extra`` are further arrays along the observations'
  first axis, batched array by array: ``ppo_lstm``'s samplers send their envs' LSTM states and get the states
  after the step back, so the role keeps no per-env state (SEED RL keeps it on the server; a replaced
  inference role then loses nothing). Its host opens a TCP socket on its worker's address (``serve``, which
  returns that address to the policy, which hands it to the samplers); one thread reads every sampler's
  requests from it (``selectors``) and runs one forward (under the host's lock) when every sampler has asked or
  ``max_wait_ms`` after the first. A request is a 4-byte length and its arrays (the observations first) as
  dtype, shape and raw bytes (never a pickle); so is the answer; a connection opens with a random token that
  only the policy hands out, so nothing else that reaches the port is served. Where the cluster's own comms
  are TLS (a ``tls://`` worker address: ``clusters/slurm.yaml``'s ``tls: true``), the socket is TLS too, with the
  worker's own Dask certificates on both ends (``inference.worker_tls``; the endpoint carries the flag, so a
  sampler never speaks in the clear to a role expecting TLS; a handshake runs without blocking the server's
  thread; 0.24 against 0.20 ms per small request on loopback). This is dagrl's one data path outside Dask, and
  it is there for the per-step latency: as an actor call per env step (the sampler's thread handing it to its
  worker's event loop, Dask's messages both ways, the inference worker's loop) a step's round trip was 3.2-4.7
  ms on a 2-core machine, over a plain socket 1.8 ms under the same load (BENCHMARKS.md); neither worker's
  event loop sees a step now. Before the samplers' fragment, the policy submits a ``load`` task on the inference
  worker with the same weights future the samplers receive (fetched peer to peer) and makes the samplers'
  tasks wait for it (``Executor.run_nodes(after=...)``), so every action of an iteration comes from the
  published version (tested: PPO's ratio is exactly 1 before its one gradient step). Samplers still load the
  weights for the rare time-limit bootstrap value. A sampler that cannot reach the inference host fails its
  fragment; if the host does not answer a heartbeat either, the failure is blamed on the inference role, which
  is replaced in place, the samplers re-attached, the iteration redone. With `policy: {name:
  central-inference, asynchronous: true}` (SEED RL's own shape) the same inference role serves samplers that
  stream as under ``async`` (``policies/inference.py``: ``StreamingCentralInference``, the stream engine plus the
  inference role's socket). Each weights version is loaded into the inference role when it is published, not
  before the samplers' next call: an env step is acted on with whatever version the role holds (recorded with
  its log-probability, which PPO's ratio and IMPALA's V-trace use), and a rollout's version, which
  ``max_staleness`` judges, is the newest published when its collect was submitted. The first version is loaded
  before any sampler starts. Failures are judged per sampler thread, one at a time: a sampler that raised
  ``InferenceUnavailable`` while the role does not answer a heartbeat gets the role replaced, re-served,
  reloaded and every sampler re-attached; the samplers that were attached to the dead role are excused once
  (their own failures arrive after the replacement) and only re-attach; any other failure, or one against a
  role that answers, is the sampler's own (so a crash loop still stops the run). IMPALA in this shape:
  ``graphs/impala-cartpole-seed.yaml``.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

from dagrl.core.graph import Graph
from dagrl.policies.base import Policy, StepResult
from dagrl.policies.dataparallel import DataParallel
from dagrl.policies.inference import CentralInference, StreamingCentralInference
from dagrl.policies.pull import Apex, Async, SplitLearner
from dagrl.policies.single import Single
from dagrl.policies.sync import Sync
from dagrl.runtime.executor import Executor
from dagrl.runtime.hosts import Start, start_actors, start_local, start_one
from dagrl.runtime.supervisor import Supervisor

POLICIES: dict[str, type[Policy]] = {
    "single": Single,
    "sync": Sync,
    "async": Async,
    "apex": Apex,
    "split-learner": SplitLearner,
    "dp-learners": DataParallel,
    "central-inference": CentralInference,
}

__all__ = ["POLICIES", "Policy", "StepResult", "build_policy"]


def sweep_stale(client: Any = None) -> None:
    """Remove the shared-memory segments and mailbox files that runs killed before their close left on
    this machine and, given a ``client``, on its workers' (their makers' processes are gone)."""
    from dagrl.runtime import mailbox, shm

    for sweep in (shm.sweep, mailbox.sweep):
        sweep()
        if client is not None:
            with contextlib.suppress(Exception):  # a worker going away is the supervisor's to see
                client.run(sweep)


def build_policy(
    graph: Graph, client: Any = None, seed_offset: int = 0, run_dir: Any = None, env_steps: int = 0
) -> Policy:
    """Start the role hosts a graph asks for and wrap them in its policy.

    ``client`` is a ``distributed.Client`` for every policy but ``single``; ``run_dir`` is where
    roles without their own ``path`` keep on-disk data; ``env_steps``: the run's so far (a resume).
    """
    begin = Start(seed_offset, None if run_dir is None else str(run_dir), env_steps)
    sweep_stale(client)
    cls = POLICIES[graph.spec.policy]
    if cls is CentralInference and graph.policy_options.asynchronous:
        cls = StreamingCentralInference
    if not graph.traits.distributed:
        return cls(graph, start_local(graph, begin))
    if client is None:
        raise ValueError(f"policy {cls.name} needs a Dask client")
    hosts = start_actors(client, graph, begin)

    def start(role: str, index: int, address: str, offset: int, steps: int) -> Any:
        return start_one(client, graph, role, index, address, replace(begin, seed_offset=offset, env_steps=steps))

    supervisor = Supervisor(client, graph, hosts, start, seed_offset)
    supervisor.env_steps = env_steps
    return cls(graph, hosts, Executor(client, supervisor))
