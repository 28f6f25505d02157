"""``sync``: N sampler actors in lockstep, rollouts gathered to one learner actor, weights broadcast."""

from __future__ import annotations

from dagrl.policies.lockstep import Lockstep


class Sync(Lockstep):
    """Each iteration: weights to every sampler, all samplers collect in parallel, the learner updates
    on the gathered rollouts (A2C/PPO-style synchronous data parallelism, MSRL's AllGather policy).
    The iteration is one Dask graph: ``publish`` on the learner's worker, ``collect`` on each
    sampler's, ``update`` back on the learner's, data fetched worker to worker."""

    name = "sync"
    runs_ahead = True
