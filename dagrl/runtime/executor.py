"""One engine for every distribution policy: each fragment call is a Dask task on its role's worker.

A role replica's *state* lives in a persistent actor (a :class:`~dagrl.runtime.host.RoleHost`) on
one worker. A fragment *call* is a task pinned to that worker (:func:`~dagrl.runtime.host.run_fragment`)
that runs against the state; its output stays on the worker as a Dask future. A consumer task on
another worker names that future among its arguments, so Dask fetches the value peer to peer; the
driver only ever gathers small things (a sampler output's :class:`Report`, an update's metrics).
Everything a policy does is built from :meth:`Executor.submit` and :meth:`Executor.wait`:

* ``submit`` never blocks: a policy submits a whole iteration (or keeps a stream of calls in
  flight), and Dask starts each task as soon as its inputs exist. Of the tasks ready on one worker,
  the one submitted first runs first: each call gets a falling Dask ``priority`` (Dask's own ties
  calls submitted within 100 ms and breaks the tie by their random keys, so a sampler's two queued
  ``collect`` calls swapped, and a replay shard stored that sampler's rollouts out of order). Tasks
  waiting for the *same* input from another worker still start in any order once it arrives;
* ``wait`` turns what can go wrong into :class:`~dagrl.runtime.supervisor.RoleFailure`: a fragment
  that raised (blamed on the call that raised, not on its consumers), a worker that died while a
  call of the iteration was pending or held its output, a call running past ``hang_timeout_s``.

The ``single`` policy uses the same executor without Dask: ``submit`` runs the fragment at once in
this process, so ``single`` and ``sync`` compute the same numbers through the same code.

Routing between roles follows one rule (:func:`route`), in-process or remote.

Design notes
------------

```
 driver: submit the iteration, then wait for the small things only
   |
   |  publish-learner-0 ─────────────┬─────────────────────┐        (weights: future on the learner's worker)
   |                                 v                     v
   |                   collect-sampler-0       collect-sampler-1       (fetch the weights peer to peer,
   |                                                                    or take them from the mailbox)
   |                        |      \\                |      \\
   |                        |   (report event)      |   (report event)  ──> driver: env steps, episodes
   |                        v                        v
   |                    update-learner-0  <── rollouts fetched worker to worker
   |                        └─────────────────────────────────────────> driver: metrics
```

Each fragment call is a task (``dagrl.runtime.host.run_fragment``) restricted to the worker that hosts the role
replica's actor (``workers=[address]``, ``allow_other_workers=False``); it finds the host there by id in a
per-process registry and runs the fragment on its state. Its output stays on that worker as a future; a
consumer task names the future among its arguments, so the consuming worker fetches it directly. The driver
gathers only reports (env steps and finished episodes of a sampler output) and the iteration's output
(metrics), so a rollout never crosses the driver (tested from the workers' transfer logs,
``tests/test_dask_native.py``). Where every sampler output goes to the one output call (``sync`` PPO's ``update``)
and nothing else reads that output, the output's own task reports the rollouts it consumed and returns them
with the metrics (``host.Reported``), saving a task per sampler per iteration (driver CPU 29.6 -> 22.2 ms per
iteration, 111.5 -> 106.3 ms per iteration, medians of 6 alternated runs of 25 iterations on 2 cores).
Everywhere else (the stream of ``split-learner`` and central inference's asynchronous form, ``sync`` graphs whose
output is read further) the sampler's own task logs its output's report as a Dask event (``Worker.log_event`` on
a topic of the run's executor; the driver subscribes with ``Client.subscribe_topic``): one message from the
worker through the scheduler to the driver instead of a ``report-*`` task per rollout with its own scheduling
and fetch. A worker's messages reach the scheduler in order and the scheduler's reach the client in order, so
the event is in hand by the time the call's future reads finished; should one ever be missing five seconds
after that, a ``report-*`` task computes it (``executor.Announced``). Nothing else changes for supervision: the
call's own future is what the driver waits on. Task keys are ``<fragment>-<role>-<replica>-<uuid>``, so the
dashboard's Task Stream groups them as ``collect-sampler-0``, ``update-learner-0`` (the browser test checks that
Dask's own ``/individual-task-stream`` page shows them during a run: ``docs/task-stream.png``).

Measured before choosing this shape (2-core machine): a task round trip from the driver is ~12 ms against ~1
ms for an actor call (Dask batches client, scheduler and worker messages every 10, 5 and 2 ms), a three-task
chain ~26 ms. So nothing waits on one task at a time: ``sync`` submits a whole iteration at once, streams keep
``in_flight`` (2) ``collect`` tasks queued on each sampler's worker, and a learner round is submitted as one
graph.

``sync`` also *runs ahead*: when the driver knows it will ask for iteration k+1 right after k, with nothing in
between (no checkpoint or blocking evaluation due, no ``iterations``/``env_steps`` stop it can foresee), it
submits k+1 together with k. Each call of k+1 also waits for the last call of k on its role (an ``after`` edge),
so ``publish`` k+1 starts on the learner's worker as soon as ``update`` k ends, without the round trip through the
driver, and every role state still sees the iterations in order: the numbers, and the learner in every
checkpoint, are ``single``'s (tested). A stop the driver cannot foresee (``mean_return``, ``wall_time_s``, Ctrl-C)
lets the iteration already submitted finish and counts it, so such a run ends one iteration past the one that
met the condition. ``summary.json``'s totals (and its ``mean_return`` window) include that iteration; its
``stopped_at`` holds the counters, the window and the evaluation return of the iteration that met the condition.
A failure cancels the iteration ahead with the failed one. Measured: 73 -> 64 ms per iteration with 1 update
epoch, 117 -> 109 ms with PPO's 20 (medians of 4 interleaved runs of 40 and 20 iterations, 2-core machine).

On the learner's host, ``sync``'s samplers take the weights from a *mailbox*, and the learner the rollouts
(``dagrl.runtime.mailbox``, ``policy: {name: sync, mailbox: true}``, the default). Running ahead removed the
driver from the iteration's boundaries but not the scheduler: ``publish`` k+1 ended, the scheduler learnt it,
sent each ``collect`` k+1 to its worker, and that worker fetched the weights from the learner's (14-19 ms of a
127-159 ms CartPole iteration on 2 cores); the last ``collect`` ended, and the same again before ``update`` (7-10
ms). With the mailbox, ``collect`` k+1 names a ticket (box, sequence number) instead of ``publish``'s future, so
it depends on nothing of iteration k+1: it starts as soon as ``collect`` k ends and waits on its worker;
``update`` k starts after its own ``publish`` k and waits there for every sampler's rollout. A producer writes its
output into the box (a file on ``/dev/shm``: the pickle, then each array's bytes, out of band) and wakes the
waiting tasks through a FIFO per waiting thread (~0.5 ms); a consumer maps the file and gets arrays that are
views of it, so a rollout costs one copy, the writer's. Used only where it cannot block anything
(``distribution.mail_edges``): weights from a single-instance role to a role with no other fragment in the
iteration and none the producer depends on (``publish -> collect``), rollouts from a replicated role into a
single-instance one, the consumer then also waiting for the fragments of its role that the producer needs
(``update`` after ``publish``); not a replay shard's ``reprioritize``, whose ``add`` and ``sample`` the ``update`` it
waits for needs. The consumer replica must be on the producer's host, on a worker hosting nothing else
(``executor.mail_readers``), and ``shared_memory`` on; elsewhere values go through Dask as before, and a posting
that finds no room on ``/dev/shm`` says so, its consumer then fetching the producer's output through Dask. A
failure cancels the iteration as before and aborts its postings, so no task waits on for values that will not
come: the driver writes the abort into the box itself where it shares the host, else the waiting workers do
(``Client.run``, from a thread of the driver's: a reader that just died, such as a killed learner, holds the
scheduler's broadcast for the 30 s connect timeout, which recovery must not wait out); a producer that raised
posts its error, and a consumer that hears it first is not blamed (the executor blames the producer). A
producer's next posting removes its own previous one (every consumer of it has ended by then; keyed by role
replica and fragment, since one worker may hold a learner replica and a sampler whose postings are read at
different times); the box goes at the run's end, and those of killed processes with the next sweep.
``dp-learners`` uses it the same way (each learner replica posts its weights and gathers its own samplers'
rollouts). A replica's ``update`` all-reduces its gradients, which holds its worker's thread until every peer
has joined, so it also waits for the iteration's earlier calls on its own worker: a sampler there whose
rollout a peer waits for has run first (without that edge, both waited for gloo's 120 s timeout in 4 of 10
runs on 2 cores). The numbers stay ``single``'s (tested, with and without the mailbox); ``sync`` PPO on CartPole
ran 6-13 % faster with it, and as fast as before the redesign (BENCHMARKS.md). A task that waits in the
mailbox is a running task to Dask, so its bar in the Task Stream spans the wait (a ``collect`` bar then covers
most of the ``update`` before it). The wait and the read are metered apart through Dask's fine performance
metrics (``distributed.metrics.context_meter``): the dashboard's *Fine Performance Metrics* page shows
``mailbox-wait`` and ``mailbox-read`` for ``collect-sampler`` and ``update-learner``, and they leave those tasks'
``thread-noncpu`` and ``thread-cpu`` (tested).

**Streams** (``async``, ``apex``, ``split-learner``, asynchronous ``central-inference``; the hub and its messages in
``runtime/stream.py``, the loops in ``runtime/loops.py``, the driver's side in ``runtime/watch.py``, what each
policy chooses in ``policies/pull.py``). The engine before the streams (removed after ``0e27a49``; BENCHMARKS.md
keeps its figures) put the driver and the scheduler in each rollout's path: a collect was issued, finished and
reported before the next went out, one scheduler round trip each way, ~100 ms per iteration under load on 2
cores; with 8 samplers ``async`` ran at 0.22 of 8 x one sampler, and with a 10 ms env it was flat at ~190
steps/s from 4 to 64 samplers. Now each sampler runs its fragment in a loop, one long-running task on its
worker (it secedes from the worker's pool), and hands each rollout to a hub, a Dask actor beside the learner
whose sampler-facing methods are ``async`` (a waiting sampler holds no thread), by Dask's actor RPC worker to
worker; under ``apex`` it stores the rollout in its replay shard itself and the hub gets the report. The learner
loops beside the hub: take, update, publish a new weights version, which each sampler fetches between rollouts
when the reply to its last put says there is a newer one. Backpressure is the hub's: a put that fills it is
answered once the learner has taken some, so a sampler waits before its next collect, not with a rollout that
ages. The driver polls the hub at most 20 times a second, receives the finished rounds (one iteration each)
and grants the rounds the learner may run before it must act itself (a checkpoint, a blocking evaluation, a
foreseeable stop: ``Trainer.horizon``), so checkpoints hold exactly what the counters say. The loops call other
workers' actors by Dask's RPC directly rather than through ``distributed.Actor``: the proxy holds every call to
an actor whose worker died until the actor comes back, which a pinned one never does (a killed learner's
samplers hung on it). A learner rollback opens a new hub; the old one, if it answers, refuses every later put
and redirects its sampler there. Measured (BENCHMARKS.md): 0.86-0.91 of 8 x one sampler at 1 ms/step,
0.95-1.01 from 4 to 32 samplers at 10 ms (0.60-0.80 at 64, where the 2 cores are busy), the driver's CPU per
env step falling as samplers grow.

What dagrl still places itself, and why: Dask's ``resources=`` are held only while a task runs, so an actor
releases its slot right after its constructor and Dask would stack every actor on one worker.
``dagrl.runtime.placement`` therefore chooses a worker per role replica (GPU roles on workers advertising ``GPU``,
custom resources, ``CPU`` against threads, one actor per worker where possible) and pins the actor there;
fragment tasks then follow their actor with a ``workers=`` restriction, which is Dask's own machinery.
Supervision watches the futures: a fragment that raised is blamed on the call that raised (not its consumers),
a worker that left while any call of the iteration was pending or held an output is ``lost``, a call pending
past ``hang_timeout_s`` is ``hung``.

Weights reach samplers once per version: ``publish`` is a future on the learner's worker that every ``collect`` of
that version names; a sampler worker keeps its copy while it has queued collects. Dask's ``sizeof`` is taught to
count dataclass outputs (a ``Rollout``), so its memory accounting, spilling and transfer logs see their real
size.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dagrl.core.fragment import Node
from dagrl.runtime import mailbox
from dagrl.runtime.announce import Announced, Announcements, dask_future, when_done
from dagrl.runtime.host import Done, HostGone, run_fragment
from dagrl.runtime.report import report
from dagrl.runtime.supervisor import RoleFailure

__all__ = ["Call", "Executor", "Mail", "Sending", "Transport", "mail_readers", "route"]


@dataclass(frozen=True)
class Mail:
    """A call's output posted to a same-host mailbox (:mod:`dagrl.runtime.mailbox`): box, sequence
    number, and the workers whose tasks wait for it there (the ones :meth:`Executor.cancel` aborts)."""

    box: str
    seq: int
    readers: frozenset[str]


@dataclass(frozen=True)
class Sending:
    """How one call carries its output and reports beyond a plain task whose output a consumer fetches
    (remote only; :class:`Transport` says it for a whole graph)."""

    reports: tuple[int, ...] = ()
    """Positions of the call's args holding sampler outputs whose :class:`Report` its task computes
    itself, returning :class:`~dagrl.runtime.host.Reported` (for an output only the driver reads)."""
    announce: bool = False
    """The task logs its output's :class:`Report` as an event, which :meth:`Executor.report` then
    returns without a task of its own (for an output other tasks consume)."""
    mail: Mail | None = None
    """The output is also posted to that mailbox (:meth:`Executor.run_nodes` decides)."""


PLAIN = Sending()


@dataclass(frozen=True)
class Transport:
    """The transport choices of one fragment graph, by node and edge: what a policy decides
    (:meth:`~dagrl.runtime.iteration.GraphRun.submit`) and :meth:`Executor.run_nodes` applies. A new
    trick is a field here, not one more parameter through the executor. Default: plain tasks."""

    reports: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Node id -> positions of its inputs whose reports its own task computes (:attr:`Sending.reports`)."""
    announce: frozenset[int] = frozenset()
    """Nodes whose tasks log their output's report as an event (:attr:`Sending.announce`)."""
    mail: frozenset[tuple[int, int]] = frozenset()
    """Edges (producer id, consumer id) whose value may go through a same-host mailbox
    (:mod:`dagrl.runtime.mailbox`; :func:`~dagrl.core.distribution.mail_edges` says which are safe): a
    consumer replica on the producer's host, on a worker hosting nothing else (:func:`mail_readers`),
    then gets a ticket instead of the future, so its task does not wait for the scheduler to learn
    that the producer ended."""
    collective: frozenset[int] = frozenset()
    """Nodes whose replicas wait for each other inside the call (a data-parallel update's all-reduce,
    which holds its worker's thread until every peer joins): each replica then also waits for the calls
    submitted before it on its own worker. Otherwise a replica could hold the only thread of a worker
    whose other call (a sampler's ``collect``) a peer still waits for, and both would wait until the
    group's timeout."""


@dataclass(eq=False)
class Call:
    """One fragment call on one role replica: a Dask future (remote) or its value (in-process)."""

    handle: Any
    fragment: str
    future: Any
    started: float
    done_at: float | None = None
    """When the driver learnt the call finished (perf counter); ``None`` while pending."""
    announced: bool = False
    """Whether its task logs its output's :class:`Report` as an event (:class:`Announcements`)."""
    mail: Mail | None = None
    """Where its output is also posted for consumers waiting on its host (:meth:`Executor.run_nodes`)."""
    inputs: Any = None
    """The futures this call consumes, held as long as the call is: a dependency whose last client
    reference goes while the scheduler still digests the task that names it would be forgotten,
    leaving that task waiting forever (seen with a replay ``add`` superseded during a round)."""

    @property
    def value(self) -> Any:
        """What a consumer receives: the future itself (Dask resolves it on the consumer's worker)."""
        return self.future.value if isinstance(self.future, Done) else self.future

    def _stamp(self, _future: Any = None) -> None:
        self.done_at = time.perf_counter()


def mail_readers(producer: Any, consumers: list[Any], hosts: dict[str, list[Any]]) -> frozenset[str]:
    """The workers of ``consumers`` whose tasks may wait for ``producer``'s output in a mailbox: on its
    host (TCP addresses, the same host), not its worker, and hosting no other role replica: a task
    waiting there holds the worker's thread, and another replica's task could be one the producer
    waits for."""
    from distributed.comm.addressing import get_address_host, parse_address

    def host(address: str | None) -> str | None:
        try:
            return get_address_host(address) if address and parse_address(address)[0] == "tcp" else None
        except ValueError:
            return None

    home = host(producer.address)
    if home is None:
        return frozenset()
    hosted = collections.Counter(h.address for hs in hosts.values() for h in hs)
    return frozenset(
        h.address
        for h in consumers
        if h.address != producer.address and host(h.address) == home and hosted[h.address] == 1
    )


def _ticketed(arg: Any, handle: Any, executor: Executor) -> Any:
    """``arg`` (a routed input: a call or a list of them) with every call that ``handle`` may read
    from a mailbox replaced by its ticket."""
    if isinstance(arg, Call) and arg.mail is not None and handle.address in arg.mail.readers:
        return executor.ticket(arg)
    if isinstance(arg, list):
        return [_ticketed(a, handle, executor) for a in arg]
    return arg


OWN_ERROR_WAIT_S = 5.0
"""How long the driver waits for a producer's own error after a consumer reported it (:class:`mailbox.Upstream`)."""

GONE_CHECK_S = 0.1
"""How often a waiting driver looks at the workers the scheduler has removed. A task pinned to a dead
worker never fails (Dask waits for that worker to return); the removal reaches the driver as an event
(:class:`~dagrl.runtime.workers.Departures`), so this look costs no round trip, unlike the full check
every ``poll_s``."""


async def _abort_on_worker(box: str, seq: int) -> None:
    """:func:`mailbox.abort` on a worker's event loop: ``Client.run(..., wait=False)`` takes coroutine
    functions only (a plain one fails there, "Combination not supported"), and the driver need not wait."""
    mailbox.abort(box, seq)


def _key(call: Call) -> str:
    return dask_future(call.future).key


def route(outs: list[Any], src: str, dst: str, roles: Any, replica: int, shards: int) -> Any:
    """What replica ``replica`` (of ``shards``) of role ``dst`` receives of role ``src``'s outputs.

    * into the same role: replica ``r`` gets replica ``r``'s value;
    * single-instance into anything: broadcast (every replica gets the same value);
    * replicated into single-instance: gathered, a list with one item per replica;
    * replicated (N) into replicated (K): replica ``k`` gets the outputs of replicas ``i % K == k``.

    A single-instance role run as K > 1 data-parallel replicas (``dp-learners``) keeps identical
    state on every replica: replica ``r`` of the receiver gets replica ``r % K``'s value (the same
    weights, read from K places; an update result back to the shards it sampled); what it receives
    is sharded like a replicated role's.
    """
    if src == dst:  # a data-parallel group's publish runs on replica 0 only (the others hold the same)
        return outs[replica % len(outs)]
    if not roles[src].many:  # data-parallel replicas: replica r % K's, so replay shard m gets the
        return outs[replica % len(outs)]  # result of the learner that drew its rows (shards m % K)
    if roles[dst].many or shards > 1:
        return outs[replica::shards]
    return list(outs)


def replica_args(node: Node, rows: Callable[[Node], list[Any]], roles: Any, replica: int, replicas: int) -> list[Any]:
    """``node``'s arguments on replica ``replica`` of ``replicas``: each input node's row (``rows(input)``, one
    value per replica of its role) routed by :func:`route`, constants as they are. Both runners of
    fragment calls build a call this way: :meth:`Executor.run_nodes` (a Dask task per call) and the
    learner loop's :class:`~dagrl.runtime.loops.Caller` (a direct call, no task per round)."""
    return [
        route(rows(a), a.role, node.role, roles, replica, replicas) if isinstance(a, Node) else a for a in node.inputs
    ]


def _values(arg: Any) -> Any:
    """Replace :class:`Call` objects (also inside lists) by what the callee receives."""
    if isinstance(arg, Call):
        return arg.value
    if isinstance(arg, list):
        return [_values(a) for a in arg]
    return arg


class Executor:
    """Submits fragment calls to role hosts and waits for them, in-process or on a Dask cluster.

    ``client`` is ``None`` for in-process hosts (``single``). Remote calls are watched by
    ``supervisor`` (liveness every ``poll_s``, hangs past ``hang_timeout_s``).

    Examples
    --------
    >>> from dagrl.app.graphs import load_graph
    >>> from dagrl.runtime.hosts import start_local
    >>> g = load_graph("graphs/ppo-cartpole-single.yaml", ["roles.sampler.replicas=2"])
    >>> ex = Executor()
    >>> calls = ex.run_nodes(g.algorithm.graph.nodes, start_local(g), g.algorithm.roles)
    >>> [len(calls[n.id]) for n in g.algorithm.graph.nodes]  # publish, collect on 2 samplers, update
    [1, 2, 1]
    >>> sorted(ex.wait(calls[2])[0])[:2]
    ['losses/approx_kl', 'losses/clipfrac']
    """

    report_events: bool = True
    """Whether an announced call's report comes as an event (``False``: a report task each, as
    before events; ``dagrl bench scaling --policies async-report-tasks`` compares the two)."""

    def __init__(self, client: Any = None, supervisor: Any = None):
        self.client, self.supervisor = client, supervisor
        self._order = itertools.count()
        self._announcements: Announcements | None = None
        self._lock = threading.Lock()
        self._box: str | None = None
        """This executor's mailbox (:meth:`run_nodes`), named when first used."""
        self._mail_seq = itertools.count(1)

    def announcements(self) -> Announcements:
        with self._lock:  # the stream's threads submit at once: one topic for all of them
            if self._announcements is None:
                self._announcements = Announcements(self.client)
            return self._announcements

    def close(self) -> None:
        """Stop receiving reports (the client stays the caller's)."""
        if self._announcements is not None:
            self._announcements.close()
            self._announcements = None

    @property
    def remote(self) -> bool:
        return self.client is not None

    # -- submitting --------------------------------------------------------------------------------

    def submit(
        self,
        handle: Any,
        fragment: str,
        args: Iterable[Any] = (),
        after: Iterable[Call] = (),
        task: Any = None,
        send: Sending = PLAIN,
        stamp: bool = True,
    ) -> Call:
        """``fragment(state, *args)`` on ``handle``'s host; ``args`` may hold calls (or lists of them).

        ``after``: calls that must finish before this one starts (an ordering edge of the task graph).
        ``task``: another task function of :mod:`dagrl.runtime.host` than ``run_fragment``, called as
        ``task(host_id, *args)`` (remote only; ``fragment`` then only names the task).
        ``send``: how it carries its output and reports (:class:`Sending`; remote only).
        ``stamp``: set :attr:`Call.done_at` when the task finishes, through a coroutine on the client's
        loop per call (:func:`when_done`); ``False``
        for a caller that waits for the call itself and stamps it then (a stream).
        """
        args = [_values(a) for a in args]
        after = [c.future for c in after]
        if not self.remote:
            if task is not None:
                raise ValueError(f"{fragment}: a host task runs on a cluster only")
            t0 = time.perf_counter()
            call = Call(handle, fragment, Done(handle.target.call(fragment, *args)), t0)
            call._stamp()
            return call
        key = f"{fragment}-{handle.role}-{handle.index}-{uuid.uuid4().hex}"  # task stream: "collect-sampler"
        head = (handle.host_id,) if task is not None else (handle.host_id, fragment)
        reports, mail = send.reports, send.mail
        announce = send.announce and task is None and self.report_events
        future = self.client.submit(
            task or run_fragment,
            *head,
            *args,
            after=after or None,
            **({"reports": tuple(reports)} if reports else {}),
            **({"announce": self.announcements().topic} if announce else {}),
            **({"mail": (mail.box, mail.seq)} if mail is not None else {}),
            workers=[handle.address],
            allow_other_workers=False,
            pure=False,
            key=key,
            priority=-next(self._order),  # first submitted, first run (module docstring)
        )
        call = Call(
            handle, fragment, future, time.perf_counter(), announced=announce, mail=mail, inputs=[*args, *after]
        )
        if stamp:
            when_done(future, call._stamp)
        return call

    def report(self, call: Call, stamp: bool = True) -> Call:
        """A small :class:`Report` of ``call``'s output, computed where the output lives: the event
        an announced call's task logged, else a task of its own on the output's worker."""
        if not self.remote:
            out = Call(call.handle, "report", Done(report(call.future.value)), call.started)
            out.done_at = call.done_at
            return out
        if call.announced:
            future: Any = Announced(
                call.future, self.announcements(), functools.partial(self._report_task, call.handle)
            )
        else:
            future = self._report_task(call.handle, call.future)
        out = Call(call.handle, "report", future, time.perf_counter(), inputs=call)
        if stamp:
            when_done(future, out._stamp)
        return out

    def _report_task(self, handle: Any, future: Any) -> Any:
        """:func:`report` of ``future``, held on ``handle``'s worker, as a task there."""
        return self.client.submit(
            report,
            future,
            workers=[handle.address],
            allow_other_workers=False,
            pure=False,
            key=f"report-{future.key}",
            priority=-next(self._order),  # first submitted, first run (module docstring)
        )

    def run_nodes(
        self,
        nodes: Iterable[Node],
        hosts: dict[str, list[Any]],
        roles: Any,
        calls: dict[int, list[Call]] | None = None,
        after: Any = None,
        transport: Transport = Transport(),
    ) -> dict[int, list[Call]]:
        """Submit every node on every replica of its role, in order, inputs routed by :func:`route`.

        ``calls`` holds calls already made (node id -> one per replica); ``after(node, calls)``, if
        given, the calls ``node`` must wait for besides its inputs;
        ``transport``, the graph's transport choices (:class:`Transport`).
        """
        calls = {} if calls is None else calls
        mail = transport.mail
        for node in nodes:
            handles = hosts[node.role]
            first = after(node, calls) if after is not None else []
            consumers = [n for n in nodes if (node.id, n.id) in mail] if self.remote else []
            row = []
            for r, h in enumerate(handles):
                args = replica_args(node, lambda a: calls[a.id], roles, r, len(handles))
                args = [
                    _ticketed(v, h, self) if isinstance(a, Node) and (a.id, node.id) in mail else v
                    for a, v in zip(node.inputs, args, strict=True)
                ]
                send = Sending(
                    transport.reports.get(node.id, ()),
                    node.id in transport.announce,
                    self._mail(h, consumers, hosts) if consumers else None,
                )
                wait = first
                if node.id in transport.collective and self.remote:
                    wait = [*first, *(c for row in calls.values() for c in row if c.handle.address == h.address)]
                row.append(self.submit(h, node.name, args, after=wait, send=send))
            calls[node.id] = row
        return calls

    def _mail(self, handle: Any, consumers: list[Node], hosts: dict[str, list[Any]]) -> Mail | None:
        """A mailbox posting for a call on ``handle``, if a replica of ``consumers`` may wait for it there."""
        waiting = [h for n in consumers for h in hosts[n.role] if n.role != handle.role]
        readers = mail_readers(handle, waiting, hosts)
        if not readers:
            return None
        if self._box is None:
            self._box = f"{mailbox.PREFIX}{uuid.uuid4().hex[:16]}"
        return Mail(self._box, next(self._mail_seq), readers)

    def ticket(self, call: Call) -> mailbox.Ticket:
        assert call.mail is not None
        timeout = self.supervisor.spec.hang_timeout_s if self.supervisor is not None else 600.0
        return mailbox.Ticket(call.mail.box, call.mail.seq, _key(call), timeout)

    # -- waiting -----------------------------------------------------------------------------------

    def wait(self, calls: list[Call], watch: Iterable[Call] = ()) -> list[Any]:
        """The values of ``calls``, once all are done.

        ``watch`` are the other calls they depend on (the iteration so far): a failure there is
        blamed on the call where it happened. Raises :class:`RoleFailure`.
        """
        if not self.remote:
            return [c.future.value for c in calls]
        from distributed import wait

        watched = list(dict.fromkeys([*watch, *calls]))  # submission order, for blame
        poll = self.supervisor.spec.poll_s if self.supervisor is not None else 1.0
        # Announced reports need no trip through the client's event loop (distributed.wait): their
        # event wakes this thread (Announcements), and their result() sees an erred or cancelled call.
        if not all(isinstance(c.future, Announced) for c in calls):
            futures = list(dict.fromkeys(dask_future(c.future) for c in calls))
            checked = time.monotonic()
            while True:
                try:
                    with self.client.as_current():  # distributed.wait uses the thread's default client
                        wait(futures, timeout=min(poll, GONE_CHECK_S))
                    break
                except TimeoutError:
                    checked = self._looked(watched, checked, poll)
            self._raise_errors(watched)
        values = []
        for call in calls:  # not client.gather: a value lost with its worker is never handed over, and
            checked = time.monotonic()
            while True:  # Dask can only recompute it on that (pinned) worker, so gather would wait forever
                try:
                    values.append(call.future.result(timeout=min(poll, GONE_CHECK_S)))
                    break
                except TimeoutError:
                    checked = self._looked(watched, checked, poll)
                except Exception as err:  # a worker died between finishing and handing the value over
                    self._check(watched)
                    raise RoleFailure(call.handle, "lost", err) from None
        return values

    def _raise_errors(self, watched: list[Call]) -> None:
        for call in watched:  # the first erred call in submission order raised; its consumers only inherit
            if call.future.status == "error":
                err = call.future.exception()
                if isinstance(err, mailbox.Upstream):  # told by the mailbox before Dask told us
                    call = next((c for c in watched if c.mail is not None and _key(c) == err.producer), call)
                    err = self._own_error(call, err)
                elif isinstance(err, mailbox.Late):  # waited out hang_timeout_s for a producer
                    self._hung(watched, "a consumer waited out hang_timeout_s for it")
                kind = "lost" if isinstance(err, HostGone) else "raised"
                if kind == "raised" and self.supervisor is not None and self._worker_lost(call):
                    kind = "lost"
                raise RoleFailure(call.handle, kind, err)

    @staticmethod
    def _own_error(producer: Call, told: BaseException) -> BaseException:
        """The producer's own exception (its frames, for the restart event), which Dask reports moments
        after the consumer that heard of it through the mailbox; ``told`` if it does not come."""
        from distributed import wait

        with contextlib.suppress(Exception):
            wait([dask_future(producer.future)], timeout=OWN_ERROR_WAIT_S)
        if producer.future.status == "error":
            return producer.future.exception()
        return told

    def _worker_lost(self, call: Call) -> bool:
        from distributed.comm.core import CommClosedError

        err = call.future.exception()
        if isinstance(err, CommClosedError):
            return True
        return isinstance(err, OSError) and not self.supervisor.alive(call.handle.address, fresh=True)

    def _looked(self, watched: list[Call], checked: float, poll: float) -> float:
        """A wait's look between slices: a watched call on a worker the scheduler removed fails now;
        the full :meth:`_check` runs once per ``poll``. When the last full check ran."""
        sup = self.supervisor
        if sup is not None:
            gone = next((c for c in watched if sup.removed(c.handle.address)), None)
            if gone is not None:
                raise RoleFailure(gone.handle, "lost", OSError("worker removed from the scheduler"))
        if time.monotonic() - checked < poll:
            return checked
        self._check(watched)
        return time.monotonic()

    def _check(self, watched: list[Call]) -> None:
        """While waiting: a watched call whose worker is gone, or one running past the hang timeout."""
        self._raise_errors(watched)
        sup = self.supervisor
        if sup is None:
            return
        for call in watched:  # a lost worker also loses the outputs it held for consumers
            if not sup.alive(call.handle.address):
                raise RoleFailure(call.handle, "lost", OSError("worker gone"))
        self._hung(watched, f"hang_timeout_s {sup.spec.hang_timeout_s:g}", sup.spec.hang_timeout_s)

    @staticmethod
    def _hung(watched: list[Call], why: str, after_s: float = 0.0) -> None:
        """Raise the first pending call of the iteration (the others wait on it) as hung, if it has run
        longer than ``after_s``."""
        pending = [c for c in watched if c.future.status == "pending"]
        if pending:
            first = pending[0]
            waited = time.perf_counter() - first.started
            if waited > after_s:
                raise RoleFailure(first.handle, "hung", TimeoutError(f"no answer for {waited:.0f} s ({why})"))

    def _abort(self, mails: list[Mail]) -> None:
        """Tell the tasks waiting for these postings, on their workers, that no value will come.

        A box this process sees (the driver on the workers' host) is aborted here: a file written and
        the waiters' FIFOs poked. Otherwise the readers' workers do it (``Client.run``), from a thread
        of its own: the client waits for the scheduler's broadcast, and a reader that just died
        (a killed learner, reader of the rollouts) holds that for the comm's connect timeout, 30 s."""
        last: dict[tuple[str, frozenset[str]], int] = {}
        for m in mails:
            last[m.box, m.readers] = max(m.seq, last.get((m.box, m.readers), 0))
        remote = []
        for (box, readers), seq in last.items():
            if mailbox.exists(box):
                mailbox.abort(box, seq)
            else:
                remote.append((box, sorted(readers), seq))
        if remote:
            threading.Thread(target=self._abort_remote, args=(remote,), name="dagrl-abort", daemon=True).start()

    def _abort_remote(self, remote: list[tuple[str, list[str], int]]) -> None:
        for box, readers, seq in remote:
            with contextlib.suppress(Exception):  # a reader's worker may be gone (nothing waits there)
                self.client.run(_abort_on_worker, box, seq, workers=readers, wait=False)

    def cancel(self, calls: Iterable[Call]) -> None:
        """Forget calls of an abandoned iteration (a failed one is redone); their tasks are cancelled."""
        if self.remote:
            calls = list(calls)
            announced = [c.future.key for c in calls if isinstance(c.future, Announced)]
            if announced and self._announcements is not None:
                self._announcements.forget(announced)
            futures = [dask_future(c.future) for c in calls if c.future.status != "finished"]
            if futures:
                with contextlib.suppress(Exception):  # the client may be closing
                    self.client.cancel(futures)
            self._abort([c.mail for c in calls if c.mail is not None])
