"""``single``: every role in this process, no Dask; the reference behaviour for every other policy."""

from __future__ import annotations

from dagrl.policies.lockstep import Lockstep


class Single(Lockstep):
    """Runs each role replica as an in-process host, fragment calls one after another.

    Replicas are kept (two samplers are two sampler states stepped in turn), so ``single`` and
    ``sync`` with the same graph and seed compute the same numbers.
    """

    name = "single"
