"""The rate limiter on its own: plain threads, no Dask."""

from __future__ import annotations

import math
import threading
import time

import pytest

from dagrl.runtime.ratelimit import RateLimiter


def run(limiter: RateLimiter, producers: int, rounds: int, work_s: float = 0.0) -> list[tuple[int, int]]:
    """Producers insert until ``rounds`` consumer rounds ran; returns (rounds, inserts started) seen by inserts."""
    stop = threading.Event()
    seen: list[tuple[int, int]] = []

    def produce() -> None:
        while limiter.start_insert(stop.is_set, timeout=0.01):
            with limiter.cond:
                seen.append((limiter.rounds, limiter.started))
            time.sleep(work_s)
            limiter.insert_done()

    threads = [threading.Thread(target=produce) for _ in range(producers)]
    for t in threads:
        t.start()
    for _ in range(rounds):
        assert limiter.start_round(timeout=10), "consumer starved: deadlock"
        limiter.round_done()
    stop.set()
    limiter.wake()
    for t in threads:
        t.join(5)
        assert not t.is_alive()
    return seen


@pytest.mark.parametrize(("ratio", "max_lead"), [(0.25, 3), (0.5, 0), (2.0, 1), (1 / 3, 0)])
def test_producers_never_run_ahead_of_the_ratio_plus_lead(ratio, max_lead):
    limiter = RateLimiter(ratio, max_lead)
    seen = run(limiter, producers=4, rounds=40)
    assert seen and all(started <= math.ceil((rounds + 1) / ratio) + max_lead for rounds, started in seen)
    # and the consumer never ran ahead: rounds <= ratio * done
    assert limiter.rounds <= limiter.ratio * limiter.done + 1e-9


def test_no_deadlock_when_the_lead_is_below_one_round():
    run(RateLimiter(0.1, 0), producers=2, rounds=20)  # a round needs 10 inserts, lead 0: still progresses


def test_discarded_inserts_must_be_made_again():
    limiter = RateLimiter(0.5, 0)
    assert limiter.try_start_insert() and limiter.try_start_insert() and not limiter.try_start_insert()
    limiter.insert_done(2)
    limiter.insert_discarded(1)  # one was too stale to use
    assert not limiter.start_round(timeout=0)
    assert limiter.try_start_insert()
    limiter.insert_done()
    assert limiter.start_round(timeout=0)


def test_cancelled_inserts_free_their_slot():
    limiter = RateLimiter(1.0, 0)
    assert limiter.try_start_insert() and not limiter.try_start_insert()
    limiter.insert_cancelled()  # its sampler died with it in flight
    assert limiter.try_start_insert()


def test_a_wait_for_the_next_round_ends_when_told_to_and_a_cancelled_round_is_owed_again():
    """The learner waits for its next round *or* for the round in flight to end (``stop``, checked when
    woken); a round counted and then cancelled is owed again and frees no insert."""
    limiter = RateLimiter(ratio=1.0, max_lead=0)
    ended = threading.Event()
    threading.Timer(0.05, lambda: (ended.set(), limiter.wake())).start()
    t0 = time.monotonic()
    assert not limiter.start_round(timeout=5, stop=ended.is_set)  # woken by the end, not the timeout
    assert time.monotonic() - t0 < 2
    assert limiter.try_start_insert() and not limiter.try_start_insert()
    limiter.insert_done()
    assert limiter.start_round(timeout=0, stop=ended.is_set)
    limiter.round_done()
    assert limiter.try_start_insert() and not limiter.start_round(timeout=0)  # round 2 owes an insert
    limiter.round_cancelled()  # round 1 failed: it is owed again, on the insert already done
    assert limiter.start_round(timeout=0) and not limiter.try_start_insert()


def test_unlimited_runs_free():
    limiter = RateLimiter(0.01, 0, limited=False)
    assert all(limiter.try_start_insert() for _ in range(1000))
    assert limiter.start_round(timeout=0)


def test_warmup_runs_free_and_its_inserts_owe_no_rounds():
    limiter = RateLimiter(0.5, 0, warmup=True)
    assert all(limiter.try_start_insert() for _ in range(10))  # free, whatever the ratio and lead
    limiter.insert_done(10)
    assert not limiter.start_round(timeout=0)  # nothing to learn from yet
    limiter.end_warmup()
    assert not limiter.start_round(timeout=0)  # the warm-up's inserts owe no round
    assert limiter.try_start_insert() and limiter.try_start_insert() and not limiter.try_start_insert()
    limiter.insert_done(2)
    assert limiter.start_round(timeout=0)
    limiter.round_done()
    assert not limiter.start_round(timeout=0)  # one round per two inserts after the warm-up


def test_bad_arguments():
    with pytest.raises(ValueError, match="ratio"):
        RateLimiter(0, 1)
    with pytest.raises(ValueError, match="max_lead"):
        RateLimiter(1, -1)
