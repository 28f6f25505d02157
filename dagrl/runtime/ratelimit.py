"""A rate limiter tying learner rounds to sampler inserts, both ways (as Reverb's ``SampleToInsertRatio``).

Producers (sampler streams) *start* inserts; the consumer (the learner) runs *rounds*. With a
``ratio`` of rounds per insert:

* the consumer may start round ``n + 1`` once ``ratio * inserts_done >= n + 1``;
* a producer may start an insert while ``inserts_started < ceil((rounds + 1) / ratio) + max_lead``:
  always enough for the consumer's next round (so the two can never wait on each other), plus
  ``max_lead`` more. ``max_lead`` bounds the work in flight: the backpressure that keeps samplers
  from taking a small machine's cores to make data that would only go stale.

``limited=False`` lets both sides run free.

A limiter made with ``warmup=True`` starts in warm-up: inserts run free and no round is owed, until
:meth:`end_warmup` (the replay holds what the learner needs to start). From then on the ratio counts
the inserts done after that point only, as Reverb's ``min_size_to_sample``: the warm-up's inserts
owe no rounds.

No Dask here: it is plain threading, unit-tested on its own.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """Counts inserts and rounds and makes either side wait for the other.

    Examples
    --------
    >>> limiter = RateLimiter(ratio=0.5, max_lead=1)  # one round per two inserts
    >>> [limiter.try_start_insert() for _ in range(4)]  # 2 for the first round + 1 of lead
    [True, True, True, False]
    >>> limiter.insert_done(); limiter.insert_done()
    >>> limiter.start_round(timeout=0)
    True
    >>> limiter.round_done(); limiter.try_start_insert()  # the next round's inserts may start
    True
    """

    def __init__(self, ratio: float, max_lead: int, limited: bool = True, warmup: bool = False):
        if ratio <= 0:
            raise ValueError(f"ratio must be > 0, got {ratio}")
        if max_lead < 0:
            raise ValueError(f"max_lead must be >= 0, got {max_lead}")
        self.ratio, self.max_lead, self.limited, self.warming = ratio, max_lead, limited, warmup
        self.cond = threading.Condition()
        self.started = self.done = self.rounds = 0
        self.offset = 0
        """Inserts done during the warm-up (they owe no rounds)."""

    def end_warmup(self) -> None:
        """Start holding both sides to the ratio, counting inserts from the ones done now."""
        with self.cond:
            if self.warming:
                self.warming, self.offset = False, self.done
                self.cond.notify_all()

    # -- producers ---------------------------------------------------------------------------------

    def _insert_allowed(self) -> bool:
        if not self.limited or self.warming:
            return True
        return self.started - self.offset < math.ceil((self.rounds + 1) / self.ratio - 1e-9) + self.max_lead

    def try_start_insert(self) -> bool:
        """Start an insert if the limiter allows one now."""
        with self.cond:
            if not self._insert_allowed():
                return False
            self.started += 1
            return True

    def start_insert(self, stop: Callable[[], bool], timeout: float = 0.2) -> bool:
        """Wait until an insert may start (``True``), or until ``stop()`` holds (``False``)."""
        with self.cond:
            while not self._insert_allowed():
                if stop():
                    return False
                self.cond.wait(timeout)
            self.started += 1
            return True

    def insert_done(self, n: int = 1) -> None:
        with self.cond:
            self.done += n
            self.cond.notify_all()

    def insert_cancelled(self, n: int = 1) -> None:
        """Inserts that were started but will never be done (a sampler died with them in flight)."""
        with self.cond:
            self.started -= n
            self.cond.notify_all()

    def insert_discarded(self, n: int = 1) -> None:
        """Done inserts the consumer threw away (too stale): they count for nothing, more may start."""
        with self.cond:
            self.started -= n
            self.done -= n
            self.cond.notify_all()

    # -- the consumer ------------------------------------------------------------------------------

    def _round_allowed(self) -> bool:
        if self.warming:
            return False
        if not self.limited:
            return True
        return self.ratio * (self.done - self.offset) >= self.rounds + 1 - 1e-9

    def start_round(self, timeout: float | None = None, stop: Callable[[], bool] | None = None) -> bool:
        """Wait up to ``timeout`` seconds until the next round may start; ``False`` if it may not yet.
        ``stop``: stop waiting once it holds (checked whenever the limiter is woken, :meth:`wake`)."""
        with self.cond:
            self.cond.wait_for(lambda: self._round_allowed() or (stop is not None and stop()), timeout)
            return self._round_allowed()

    def round_done(self) -> None:
        with self.cond:
            self.rounds += 1
            self.cond.notify_all()

    def round_cancelled(self) -> None:
        """A round counted by :meth:`round_done` that will not run after all (it failed and is redone)."""
        with self.cond:
            self.rounds -= 1
            self.cond.notify_all()

    def wake(self) -> None:
        """Wake every waiting side (to let it notice a stop or an error)."""
        with self.cond:
            self.cond.notify_all()
