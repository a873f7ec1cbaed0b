"""What a pending timeout weighs: a one-shot Timeout fits pymalloc's 80-byte
size class with its GC header, as the README says; and what the cyclic GC
pays for timeouts: nothing for those only the wheel holds."""

from __future__ import annotations

import gc
import re
import struct
import sys
import threading
import weakref

import pytest
from conftest import README, run_python, wait_for

import hwtimer

GC_HEADER = 2 * struct.calcsize("P")


def noop(timeout: hwtimer.Timeout) -> None:
    pass


def test_pending_one_shot_timeout_is_80_bytes_as_the_readme_says(timer) -> None:
    t = timer.new_timeout(noop, 1000.0)
    size = type(t).__basicsize__ + GC_HEADER
    assert sys.getsizeof(t) == size  # getsizeof counts the GC header
    assert size <= 80
    said = re.search(r"A ``Timeout`` is (\d+) bytes", README.read_text())
    assert said and int(said[1]) == size
    p = timer.new_periodic(noop, 1000.0)
    assert isinstance(p, hwtimer.Timeout)  # a subtype that carries the period
    periodic_size = type(p).__basicsize__ + GC_HEADER
    assert sys.getsizeof(p) == periodic_size
    said = re.search(r"A\s+periodic one carries\s.*?\((\d+) bytes\)", README.read_text(), re.S)
    assert said and int(said[1]) == periodic_size
    assert t.cancel() and p.cancel()


def test_a_timeout_takes_no_weak_references_as_the_readme_says(timer) -> None:
    # no __weakref__ slot, which would take it past 80 bytes: refused with
    # a TypeError, and the timeout is none the worse
    t = timer.new_timeout(noop, 1000.0)
    assert "takes no weak references" in README.read_text()
    with pytest.raises(TypeError, match="weak reference"):
        weakref.ref(t)
    assert t.cancel()


def test_100k_pending_timeouts_cost_80_bytes_each() -> None:
    # a fresh interpreter: no released Timeouts kept for reuse
    proc = run_python(
        """
        import gc, tracemalloc, hwtimer
        def noop(t): pass
        timer = hwtimer.HashedWheelTimer(0.001, 4096)
        timer.new_timeout(noop, 1.0).cancel()
        n = 100_000
        keep = [None] * n
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            keep[i] = timer.new_timeout(noop, 1000.0 + (i % 60000) * 0.05)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        print((after - before) / n)
        timer.stop()
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) <= 80.5


def test_a_fire_and_forget_timeout_is_never_tracked_by_the_gc(timer) -> None:
    tracked = []
    done = threading.Event()

    def task(timeout: hwtimer.Timeout) -> None:
        tracked.append(gc.is_tracked(timeout))
        if len(tracked) == 100:
            done.set()

    for _ in range(100):
        timer.new_timeout(task, 0.001)
    assert done.wait(10)
    assert tracked == [False] * 100


def test_a_timeout_its_caller_holds_is_tracked_once_it_fired(timer) -> None:
    done = threading.Event()
    t = timer.new_timeout(lambda _t: done.set(), 0.001)
    assert not gc.is_tracked(t)  # pending: the wheel holds it
    assert done.wait(10)
    assert wait_for(lambda: gc.is_tracked(t))


def test_a_cycle_a_task_makes_with_its_timeout_is_collected(timer) -> None:
    class Task:
        def __call__(self, timeout: hwtimer.Timeout) -> None:
            self.timeout = timeout  # task -> timeout -> task
            done.set()

    done = threading.Event()
    task = Task()
    gone = weakref.ref(task)
    timer.new_timeout(task, 0.001)
    del task
    assert done.wait(10)

    def collected() -> bool:
        gc.collect()
        return gone() is None

    assert wait_for(collected)


def test_a_cancelled_timeout_its_caller_holds_is_tracked(timer) -> None:
    t = timer.new_timeout(noop, 0.001)
    assert t.cancel()

    def tracked() -> bool:
        gc.collect()  # a timeout its cancel took back is tracked by then
        return gc.is_tracked(t)

    assert wait_for(tracked)  # one the worker took is once it released it


def test_a_tick_of_released_timeouts_is_reused_without_allocating() -> None:
    # a fresh interpreter: its free list starts empty and nothing else runs
    proc = run_python(
        """
        import gc
        from hwtimer.testing import ManualTimer
        def noop(t): pass
        timer = ManualTimer()
        n = 10_000  # what a 1 ms tick hands back at the fastest schedule + cancel
        for t in [timer.new_timeout(noop, 60) for _ in range(n)]:
            t.cancel()
        timer.advance(0.002)  # the worker's tick releases the n cancelled ones
        gc.disable()
        before = gc.get_count()[0]
        kept = [timer.new_timeout(noop, 60) for _ in range(n)]
        print(gc.get_count()[0] - before)
        """
    )
    # the list's growth allocates a little; a Timeout from pymalloc counts 1
    assert int(proc.stdout) < 100
