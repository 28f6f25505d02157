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
