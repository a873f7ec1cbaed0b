"""timer.pending_snapshot(): the soonest pending timeouts, as Timeout
objects in deadline order, and what it refuses."""

from __future__ import annotations

import asyncio
import gc
import random
import sys
import threading
import time
import weakref

import pytest
from conftest import DEADLINE, refuse_dispatch_thread, wait_for

import hwtimer


def noop(_timeout: object) -> None:
    pass


def test_deadline_order_and_limit(timer) -> None:
    delays = [random.uniform(1.0, 30.0) for _ in range(300)]
    held = [timer.new_timeout(noop, d) for d in delays]
    want = sorted(held, key=lambda t: t.deadline)
    snap = timer.pending_snapshot()
    assert len(snap) == 100
    assert snap == want[:100]
    assert all(a is b for a, b in zip(snap, want))  # the very objects
    assert timer.pending_snapshot(limit=7) == want[:7]
    assert timer.pending_snapshot(0) == []
    assert timer.pending_snapshot(10**40) == want  # more than pending: all
    assert timer.pending_snapshot(sys.maxsize) == want


def test_ties_keep_scheduling_order(make_timer) -> None:
    timer = make_timer(0.5, 64)  # one tick holds them all
    held = [timer.new_timeout(noop, 5.0) for _ in range(20)]
    same = [t for t in timer.pending_snapshot(1000) if t in held]
    # a deadline is read once per timeout: those equal keep their order
    assert [held.index(t) for t in same] == sorted(held.index(t) for t in same)
    assert len(same) == 20


def test_cancelled_ones_are_left_out_at_once(timer) -> None:
    held = [timer.new_timeout(noop, 10.0 + i) for i in range(10)]
    for t in held[::2]:
        assert t.cancel()
    # before the worker has processed the cancels, and after
    assert timer.pending_snapshot() == held[1::2]
    assert wait_for(lambda: timer.pending_timeouts() == 5)
    assert timer.pending_snapshot() == held[1::2]


def test_expired_ones_are_left_out(timer) -> None:
    fired = threading.Event()
    soon = timer.new_timeout(lambda _t: fired.set(), 0.0)
    later = timer.new_timeout(noop, 60.0)
    assert fired.wait(DEADLINE)
    assert wait_for(soon.is_expired)
    assert timer.pending_snapshot() == [later]


def test_reset_ones_are_at_their_new_deadline(timer) -> None:
    a = timer.new_timeout(noop, 10.0)
    b = timer.new_timeout(noop, 20.0)
    c = timer.new_timeout(noop, 30.0)
    assert c.reset(5.0)  # queued for the worker: still where it was
    assert timer.pending_snapshot() == [c, a, b]
    assert a.reset(40.0)
    assert timer.pending_snapshot() == [c, b, a]
    time.sleep(0.05)  # the worker has relinked them
    assert timer.pending_snapshot() == [c, b, a]
    assert [t.deadline for t in timer.pending_snapshot()] == sorted(t.deadline for t in (a, b, c))


def test_far_ones_on_upper_levels(make_timer) -> None:
    timer = make_timer(0.01, 64)  # level 0 spans 0.64 s
    far = [timer.new_timeout(noop, d) for d in (7200.0, 60.0, 86400.0 * 30, 3.0)]
    never = timer.new_timeout(noop, float("inf"))
    near = timer.new_timeout(noop, 0.3)
    want = sorted(far + [near], key=lambda t: t.deadline) + [never]

    def in_wheel() -> bool:
        s = timer.stats()
        return sum(lv["timeouts"] for lv in s["levels"]) + s["never_due"] == 6

    assert wait_for(in_wheel)
    assert timer.stats()["never_due"] == 1
    assert sum(lv["timeouts"] for lv in timer.stats()["levels"][1:]) >= 4
    assert timer.pending_snapshot() == want  # never-due ones come last
    assert timer.pending_snapshot(2) == want[:2]


def test_periodic_ones(timer) -> None:
    runs = []
    p = timer.new_periodic(lambda t: runs.append(t), 0.02)
    far = timer.new_timeout(noop, 60.0)
    assert wait_for(lambda: len(runs) >= 3)
    # between its runs it is on the wheel, at its next run's deadline
    assert wait_for(lambda: timer.pending_snapshot() == [p, far])
    assert p.cancel()
    assert wait_for(lambda: timer.pending_snapshot() == [far])


def test_call_later_handles() -> None:
    async def main() -> list:
        with hwtimer.HashedWheelTimer(0.01, 64) as timer:
            h1 = timer.call_later(30.0, print)
            h2 = timer.call_later(10.0, print, "x")
            h3 = timer.call_every(20.0, print)
            snap = timer.pending_snapshot()
            for h in (h1, h2, h3):
                h.cancel()
            return [snap, [h2, h3, h1]]

    got, want = asyncio.run(main())
    assert got == want


def test_a_stopped_timer_has_none(make_timer) -> None:
    timer = make_timer()
    assert timer.pending_snapshot() == []  # never started
    held = timer.new_timeout(noop, 60.0)
    assert timer.pending_snapshot() == [held]
    assert timer.stop() == [held]
    assert timer.pending_snapshot() == []
    assert timer.pending_snapshot(0) == []


@pytest.mark.parametrize(
    ("limit", "error"),
    [
        ("10", TypeError),
        (10.0, TypeError),
        (None, TypeError),
        (True, TypeError),
        (-1, ValueError),
        (-(10**40), ValueError),
    ],
)
def test_bad_limit_changes_nothing(timer, limit, error) -> None:
    held = [timer.new_timeout(noop, 10.0 + i) for i in range(3)]
    before = timer.stats()["scheduled"]
    with pytest.raises(error, match="limit"):
        timer.pending_snapshot(limit)
    with pytest.raises(error, match="limit"):
        timer.pending_snapshot(limit=limit)
    assert timer.pending_snapshot() == held
    assert timer.stats()["scheduled"] == before
    with pytest.raises(TypeError):
        timer.pending_snapshot(1, 2)
    with pytest.raises(TypeError):
        timer.pending_snapshot(lim=1)


def test_references_outlive_the_timeout(timer) -> None:
    """The snapshot holds strong references: a timeout that fires or is
    cancelled after it, and that nothing else holds, stays readable."""

    class Task:
        def __call__(self, _t: object) -> None:
            pass

    task = Task()
    ref = weakref.ref(task)
    timer.new_timeout(task, 0.05)
    del task
    snap = timer.pending_snapshot()
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    gc.collect()
    assert snap[0].is_expired() and snap[0].task is ref()
    del snap
    assert wait_for(lambda: (gc.collect(), ref() is None)[1])


def test_snapshots_while_threads_schedule_and_cancel(make_timer) -> None:
    """Snapshots taken back to back while producers schedule and cancel and
    the worker expires: no crash, every timeout given is alive, pending or
    done since, in deadline order, and no timeout is lost."""
    timer = make_timer(0.001, 256)
    fired = [0]
    lock = threading.Lock()

    def task(_t: object) -> None:
        with lock:
            fired[0] += 1

    stop = threading.Event()
    kept: list[list[hwtimer.Timeout]] = [[] for _ in range(3)]
    cancelled = [0] * 3

    def producer(i: int) -> None:
        rng = random.Random(i)
        while not stop.is_set():
            t = timer.new_timeout(task, rng.uniform(0.0, 0.2))
            if rng.random() < 0.5 and t.cancel():
                cancelled[i] += 1
            else:
                kept[i].append(t)
            if rng.random() < 0.1:
                t.reset(rng.uniform(0.0, 0.1))

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    snaps = 0
    try:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            snap = timer.pending_snapshot(random.choice([1, 10, 100, 1000]))
            deadlines = [t.deadline for t in snap]
            assert len(set(map(id, snap))) == len(snap)
            assert all(isinstance(t, hwtimer.Timeout) and t.timer is timer for t in snap)
            # a reset between the walk and this read may move one later
            assert sum(a > b for a, b in zip(deadlines, deadlines[1:])) <= len(snap) // 2 + 1
            timer.stats()
            snaps += 1
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert snaps > 10
    total = sum(len(k) for k in kept)
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert wait_for(lambda: fired[0] == total)  # exactly once, none lost
    assert timer.stats()["expired"] == total
    assert timer.pending_snapshot() == []


def test_on_a_manual_timer() -> None:
    """The same on hwtimer.testing.ManualTimer, where the clock and so the
    layout are exact: order, reset, expiry by advance(), and the spread."""
    testing = pytest.importorskip("hwtimer.testing")
    timer = testing.ManualTimer(0.001, 64)  # level 0 spans 64 ms
    try:
        a = timer.new_timeout(noop, 5.0)
        b = timer.new_timeout(noop, 0.01)
        c = timer.new_timeout(noop, 3600.0)
        d = timer.new_timeout(noop, 0.01)
        assert timer.pending_snapshot() == [b, d, a, c]
        assert timer.advance(0.0) == 0  # moves them into the wheel
        s = timer.stats()
        assert s["fullest_bucket"] == 2 and s["levels"][0]["occupied"] == 1
        assert [lv["timeouts"] for lv in s["levels"]][:1] == [2]
        assert sum(lv["timeouts"] for lv in s["levels"][1:]) == 2
        assert timer.advance(0.02) == 2
        assert timer.pending_snapshot() == [a, c]
        assert c.reset(1.0)
        assert timer.pending_snapshot() == [c, a]
        assert timer.pending_snapshot(1) == [c]
        with pytest.raises(ValueError, match="limit"):
            timer.pending_snapshot(-1)
    finally:
        assert timer.stop() != []
    assert timer.pending_snapshot() == []


class _Task:
    def __call__(self, _timeout: object) -> None:
        pass


@pytest.mark.parametrize("read", ["stats", "pending_snapshot"])
def test_on_a_manual_timer_a_cancel_it_processes_lets_go_of_the_task(read: str) -> None:
    """The cancels a read processes (unlinking the timeouts, as a tick
    does) let go of their tasks then, not at the next advance()."""
    testing = pytest.importorskip("hwtimer.testing")
    timer = testing.ManualTimer(0.001, 64)
    try:
        task = _Task()
        gone = weakref.ref(task)
        timeout = timer.new_timeout(task, 5.0)
        timer.advance(0.0)  # in the wheel: its cancel waits for a tick
        assert timeout.cancel()
        del task, timeout
        getattr(timer, read)()
        gc.collect()
        assert gone() is None
    finally:
        timer.stop()


def test_after_a_start_that_failed_lists_what_was_scheduled(make_timer, monkeypatch) -> None:
    """A start() whose dispatch thread cannot start keeps what other users
    scheduled meanwhile, pending: the snapshot lists it, whether or not the
    worker took it from the producers' queue before it went down."""
    timer = make_timer(0.01)
    scheduled: list = []
    refuse_dispatch_thread(monkeypatch, lambda: scheduled.append(timer.new_timeout(noop, 3600.0)))
    with pytest.raises(RuntimeError, match="can't start new thread"):
        timer.start()
    monkeypatch.undo()
    assert timer.pending_timeouts() == 1
    assert timer.pending_snapshot() == scheduled
    assert timer.stop() == scheduled
