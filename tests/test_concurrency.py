"""Exactly-once under concurrency: producers on several threads, cancels
from other threads and from tasks, and stop() racing with all of it.

Every scheduled timeout ends exactly one way: its task ran once, or a
cancel() of it returned True, or stop() handed it back.  Nothing runs after
stop() returns, and the pending count ends at 0.
"""

from __future__ import annotations

import collections
import functools
import random
import threading
import time

import pytest
from conftest import DEADLINE, wait_for

from hwtimer import Timeout


class Ledger:
    """Per-index outcome counts for a fixed number of timeouts."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.fired = bytearray(n)  # tasks run one at a time: no lock needed
        self.cancelled = bytearray(n)
        self.scheduled = bytearray(n)
        self.returned = bytearray(n)
        self.late = 0  # tasks that started after stop() returned
        self.stopped = False

    def fire(self, index: int, timeout: Timeout) -> None:
        if self.stopped:
            self.late += 1
        self.fired[index] += 1

    def check(self) -> None:
        assert self.late == 0, "tasks ran after stop() returned"
        bad = []
        for i in range(self.n):
            outcomes = self.fired[i] + self.cancelled[i] + self.returned[i]
            if self.scheduled[i] and outcomes != 1:
                bad.append((i, self.fired[i], self.cancelled[i], self.returned[i]))
            if not self.scheduled[i] and outcomes:
                bad.append((i, "not scheduled", self.fired[i], self.cancelled[i]))
            if len(bad) > 10:
                break
        assert not bad, f"(index, fired, cancelled, returned) not exactly once: {bad}"


def test_exactly_once_with_four_producers_and_random_cancels(make_timer) -> None:
    timer = make_timer(0.002, 256)
    producers, per_producer = 4, 20000
    ledger = Ledger(producers * per_producer)
    errors = []

    def produce(p: int) -> None:
        try:
            rng = random.Random(p)
            mine = []
            for j in range(per_producer):
                i = p * per_producer + j
                delay = rng.choice((0, rng.uniform(0, 0.2), rng.uniform(0, 0.02)))
                mine.append((i, timer.new_timeout(functools.partial(ledger.fire, i), delay)))
                ledger.scheduled[i] = 1
                if rng.random() < 0.3:
                    k, victim = mine[rng.randrange(len(mine))]
                    if victim.cancel():
                        ledger.cancelled[k] += 1
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert wait_for(lambda: timer.pending_timeouts() == 0, timeout=30)
    scheduled = sum(ledger.scheduled)
    assert wait_for(lambda: sum(ledger.fired) + sum(ledger.cancelled) == scheduled, timeout=30)
    time.sleep(0.1)
    ledger.check()
    stats = timer.stats()
    assert stats["scheduled"] == scheduled
    assert stats["expired"] == sum(ledger.fired)
    assert stats["cancelled"] == sum(ledger.cancelled)
    assert timer.stop() == []
    assert timer.pending_timeouts() == 0


@pytest.mark.parametrize("stop_at", [0.5, 1.0], ids=["while-producing", "after-producing"])
def test_stress_stop_racing_producers_cancellers_and_tasks(make_timer, stop_at) -> None:
    """Issue 6's stress: 8 threads x 100k timeouts with random delays,
    cancels from other threads, tasks that schedule and cancel other
    timeouts, and stop() in the middle of it (once about half the
    timeouts are in, or once all are, with cancels and tasks still busy)."""
    timer = make_timer(0.001, 512)
    producers, per_producer = 8, 100_000
    n_main = producers * per_producer
    n_children = 20_000
    ledger = Ledger(n_main + n_children)
    to_cancel: collections.deque = collections.deque()
    live: dict[int, Timeout] = {}  # some timeouts a task may cancel
    errors = []
    child_next = [n_main]
    producing = threading.Event()
    producing.set()
    rng_delays = random.Random(99)
    delays = [
        rng_delays.choice((0, rng_delays.uniform(0, 0.05), rng_delays.uniform(0, 1.0), 3.0))
        for _ in range(4096)
    ]

    def task(index: int, timeout: Timeout) -> None:
        ledger.fire(index, timeout)
        if index % 40 == 0 and child_next[0] < n_main + n_children:
            # schedule another timeout, and cancel one of someone else's
            c = child_next[0]
            child_next[0] += 1
            try:
                child = timer.new_timeout(functools.partial(task, c), delays[c & 4095] / 10)
            except RuntimeError:  # the timer is being stopped
                pass
            else:
                ledger.scheduled[c] = 1
                live[c] = child
            if live:
                k, victim = live.popitem()
                if victim.cancel():
                    ledger.cancelled[k] += 1

    def produce(p: int) -> None:
        try:
            base = p * per_producer
            for j in range(per_producer):
                i = base + j
                try:
                    timeout = timer.new_timeout(functools.partial(task, i), delays[(i * 7) & 4095])
                except RuntimeError:
                    break  # stopped: the rest are never scheduled
                ledger.scheduled[i] = 1
                if j % 3 == 0:
                    to_cancel.append((i, timeout))
                elif j % 97 == 0:
                    live[i] = timeout
        except BaseException as e:
            errors.append(e)

    def cancel_loop(seed: int) -> None:
        try:
            rng = random.Random(seed)
            while producing.is_set() or to_cancel:
                try:
                    i, timeout = to_cancel.popleft()
                except IndexError:
                    time.sleep(0.001)
                    continue
                if rng.random() < 0.1:
                    time.sleep(0)  # let it race with its expiry
                if timeout.cancel():
                    ledger.cancelled[i] += 1
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    cancellers = [threading.Thread(target=cancel_loop, args=(s,)) for s in range(2)]
    for t in threads + cancellers:
        t.start()
    target = int(n_main * stop_at)
    # a slow interpreter (a debug build) needs over a minute for the 800k
    # schedules; each poll sums the whole ledger under the GIL
    assert wait_for(lambda: sum(ledger.scheduled) >= target, timeout=300, interval=0.05)
    returned = timer.stop()
    ledger.stopped = True
    fired_at_stop = sum(ledger.fired)
    for t in threads:
        t.join(60)
    producing.clear()
    for t in cancellers:
        t.join(60)
    assert not any(t.is_alive() for t in threads + cancellers)
    assert errors == []
    for timeout in returned:
        assert timeout.is_cancelled()
        ledger.returned[timeout.task.args[0]] += 1
    time.sleep(0.2)
    assert sum(ledger.fired) == fired_at_stop, "tasks ran after stop() returned"
    assert timer.pending_timeouts() == 0
    ledger.check()
    assert sum(ledger.scheduled) >= target
    assert sum(ledger.fired) > 0 and sum(ledger.cancelled) > 0 and returned
    assert timer.stats()["expired"] == sum(ledger.fired)


def test_stop_while_producers_run_many_times(make_timer) -> None:
    """stop() at random moments against producers and cancels."""
    for round_ in range(10):
        timer = make_timer(0.001, 64)
        n = 8000
        ledger = Ledger(n)
        rng = random.Random(round_)

        def produce(p: int, timer=timer, ledger=ledger, n=n) -> None:
            for i in range(p, n, 4):
                try:
                    t = timer.new_timeout(functools.partial(ledger.fire, i), (i % 50) * 0.001)
                except RuntimeError:
                    return
                ledger.scheduled[i] = 1
                if i % 5 == 0 and t.cancel():
                    ledger.cancelled[i] += 1

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(4)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0, 0.05))
        returned = timer.stop()
        ledger.stopped = True
        for t in threads:
            t.join(DEADLINE)
        for timeout in returned:
            ledger.returned[timeout.task.args[0]] += 1
        time.sleep(0.02)
        ledger.check()
        assert timer.pending_timeouts() == 0


@pytest.mark.parametrize("first_call", ["new_timeout", "start"])
def test_stop_racing_with_first_start(make_timer, first_call) -> None:
    """stop() on one thread while another starts the timer (explicitly or
    through its first new_timeout) returns promptly, and exactly once holds."""
    rng = random.Random(7)
    for _ in range(100):
        timer = make_timer()
        task_calls = []
        barrier = threading.Barrier(2)
        scheduled = []
        returned = []

        def first(timer=timer, barrier=barrier, scheduled=scheduled, calls=task_calls) -> None:
            barrier.wait()
            try:
                if first_call == "start":
                    timer.start()
                scheduled.append(timer.new_timeout(calls.append, 0))
            except RuntimeError:
                pass  # stop() came first

        def stop(timer=timer, barrier=barrier, returned=returned) -> None:
            barrier.wait()
            time.sleep(rng.uniform(0, 0.002))
            returned.extend(timer.stop())

        threads = [threading.Thread(target=first), threading.Thread(target=stop, daemon=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE)
        assert not threads[1].is_alive(), "stop() hung"
        assert not threads[0].is_alive()
        assert len(task_calls) + len(returned) == len(scheduled)
        time.sleep(0.005)
        assert len(task_calls) + len(returned) == len(scheduled)


def test_concurrent_cancels_of_the_same_timeouts(make_timer) -> None:
    """Of many threads cancelling the same timeout, at most one gets True,
    and a timeout with a True cancel never runs."""
    timer = make_timer(0.001, 64)
    n = 3000
    ledger = Ledger(n)
    timeouts = []
    for i in range(n):
        timeouts.append(timer.new_timeout(functools.partial(ledger.fire, i), (i % 30) * 0.001))
        ledger.scheduled[i] = 1
    lock = threading.Lock()
    wins = bytearray(n)

    def cancel_all(order: list[int]) -> None:
        for i in order:
            if timeouts[i].cancel():
                with lock:
                    wins[i] += 1

    orders = []
    for s in range(6):
        order = list(range(n))
        random.Random(s).shuffle(order)
        orders.append(order)
    threads = [threading.Thread(target=cancel_all, args=(o,)) for o in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert max(wins) <= 1
    ledger.cancelled[:] = wins
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert wait_for(lambda: sum(ledger.fired) + sum(wins) == n)
    time.sleep(0.05)
    ledger.check()


def test_max_pending_under_contention(make_timer) -> None:
    """With a limit, producers on several threads are refused rather than
    let past it, and every accepted timeout runs exactly once."""
    limit = 200
    timer = make_timer(0.001, 64, max_pending_timeouts=limit)
    n_per, producers = 5000, 4
    ledger = Ledger(n_per * producers)
    rejected = [0] * producers
    over = []

    def produce(p: int) -> None:
        for j in range(n_per):
            i = p * n_per + j
            try:
                timer.new_timeout(functools.partial(ledger.fire, i), 0.002)
            except RuntimeError as e:  # RejectedExecutionError
                assert type(e).__name__ == "RejectedExecutionError"
                rejected[p] += 1
                time.sleep(0)
                continue
            ledger.scheduled[i] = 1
            pending = timer.pending_timeouts()
            if pending > limit:
                over.append(pending)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert over == []
    accepted = sum(ledger.scheduled)
    assert accepted + sum(rejected) == n_per * producers
    assert wait_for(lambda: sum(ledger.fired) == accepted, timeout=30)
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    ledger.check()
    assert timer.stats()["rejected"] == sum(rejected)
