"""Re-arming and periodic timeouts: Timeout.reset(), new_periodic() and
call_every(), on the real timer.

Periods are short and bounds generous: a run is checked against its own
grid point (never early, never at an old deadline), never against a
tight wall-clock window.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import DEADLINE, Counter, collect_until, wait_for

import hwtimer

# time.monotonic() and the core read the same clock; a float's rounding
# may put a reading a hair before a deadline computed from the same ns.
EPS = 1e-6


class Runs:
    """A periodic task that records each run: start, end, deadline; can
    sleep in chosen runs and tracks how many runs overlap."""

    def __init__(self, sleeps: dict[int, float] | None = None) -> None:
        self.lock = threading.Lock()
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.deadlines: list[float] = []
        self.sleeps = sleeps or {}
        self.active = 0
        self.max_active = 0

    def __call__(self, timeout: hwtimer.Timeout) -> None:
        start = time.monotonic()
        with self.lock:
            k = len(self.starts)
            self.starts.append(start)
            self.deadlines.append(timeout.deadline)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(self.sleeps.get(k, 0))
        with self.lock:
            self.active -= 1
            self.ends.append(time.monotonic())

    @property
    def count(self) -> int:
        return len(self.ends)

    def wait(self, n: int) -> bool:
        return wait_for(lambda: self.count >= n)

    def check_never_early(self) -> None:
        for start, deadline in zip(self.starts, self.deadlines):
            assert start >= deadline - EPS


def grid(first: float, period: float, deadline: float) -> float:
    """Which grid point (k, as a float) `deadline` is."""
    return (deadline - first) / period


# ---- reset ----


def test_reset_moves_the_deadline_and_runs_once_after_it(timer) -> None:
    c = Counter()
    t = timer.new_timeout(c, 0.05)
    old = t.deadline
    assert t.reset(0.3) is True
    assert t.deadline > old + 0.2  # shown at once
    new = t.deadline
    assert c.wait(1)
    assert c.times[0] >= new - EPS
    time.sleep(0.1)
    assert c.count == 1
    assert t.is_expired()


def test_reset_to_earlier(timer) -> None:
    c = Counter()
    t = timer.new_timeout(c, 30)
    assert t.reset(0.02) is True
    assert c.wait(1)
    assert c.times[0] >= t.deadline - EPS


def test_reset_of_expired_or_cancelled_is_false_and_changes_nothing(timer) -> None:
    c = Counter()
    t = timer.new_timeout(c, 0)
    assert c.wait(1)
    d = t.deadline
    assert t.reset(1) is False
    assert t.deadline == d
    u = timer.new_timeout(c, 10)
    assert u.cancel()
    d = u.deadline
    assert u.reset(0) is False
    assert u.deadline == d and u.is_cancelled()
    time.sleep(0.05)
    assert c.count == 1


def test_reset_inside_its_own_task_is_false(timer) -> None:
    got = []
    t = timer.new_timeout(lambda to: got.append(to.reset(0)), 0)
    assert wait_for(lambda: got)
    assert got == [False] and t.is_expired()


def test_reset_keeps_the_pending_count(timer) -> None:
    ts = [timer.new_timeout(lambda to: None, 10) for _ in range(5)]
    for t in ts:
        assert t.reset(20)
    time.sleep(0.05)
    assert timer.pending_timeouts() == 5
    assert timer.stats()["scheduled"] == 5


@pytest.mark.parametrize("bad", ["1", None, [], True])
def test_reset_bad_delay_type_raises_and_changes_nothing(timer, bad) -> None:
    t = timer.new_timeout(lambda to: None, 10)
    d = t.deadline
    with pytest.raises(TypeError):
        t.reset(bad)
    assert t.deadline == d
    assert not t.is_cancelled() and not t.is_expired()


def test_reset_nan_raises_and_changes_nothing(timer) -> None:
    t = timer.new_timeout(lambda to: None, 10)
    d = t.deadline
    with pytest.raises(ValueError):
        t.reset(float("nan"))
    assert t.deadline == d


def test_reset_accepts_what_new_timeout_accepts(timer) -> None:
    import datetime

    t = timer.new_timeout(lambda to: None, 10)
    assert t.reset(datetime.timedelta(seconds=20))
    assert t.reset(float("inf"))
    assert t.deadline == float("inf")
    assert t.reset(-5)  # the next tick
    assert wait_for(t.is_expired)


def test_reset_takes_its_delay_by_name_as_api_md_writes_it(timer) -> None:
    """reset(delay) names its parameter: reset(delay=...) is the same call,
    and a wrong name or a second delay is a TypeError that changes nothing."""
    t = timer.new_timeout(lambda to: None, 10)
    assert t.reset(delay=20)
    assert t.deadline > time.monotonic() + 15
    d = t.deadline
    for args, kwargs in [((), {"seconds": 5}), ((5,), {"delay": 5}), ((), {})]:
        with pytest.raises(TypeError, match="reset"):
            t.reset(*args, **kwargs)
    assert t.deadline == d
    assert not t.is_cancelled() and not t.is_expired()


def test_reset_after_stop_is_false(make_timer) -> None:
    timer = make_timer()
    t = timer.new_timeout(lambda to: None, 10)
    assert timer.stop() == [t]
    assert t.reset(1) is False


def test_reset_races_expiry_and_cancel_from_several_threads(make_timer) -> None:
    """Go's guarantee: once reset() returned True, the task runs at most
    once, at or after that new deadline; a cancel() that returned True
    means it never runs."""
    timer = make_timer(0.001, 64)
    n_per_thread, threads = 150, 4
    # keyed by the Timeout itself, which keeps it alive: an id could be reused
    # by another thread's timeout once the first one is freed
    runs: dict[hwtimer.Timeout, list[float]] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def task(to: hwtimer.Timeout) -> None:
        now = time.monotonic()
        with lock:
            runs.setdefault(to, []).append(now)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine = []
        for _ in range(n_per_thread):
            t = timer.new_timeout(task, rng.uniform(0, 0.004))
            last_true = None
            cancelled = False
            for _ in range(rng.randrange(1, 4)):
                time.sleep(rng.uniform(0, 0.003))
                if rng.random() < 0.15:
                    cancelled = t.cancel() or cancelled
                elif t.reset(rng.uniform(0, 0.004)):
                    last_true = t.deadline
            mine.append((t, last_true, cancelled))
        for t, _, _ in mine:
            # expired is set when it falls due; its run follows on the
            # dispatch thread
            if not wait_for(lambda t=t: t.is_cancelled() or (t.is_expired() and t in runs)):
                errors.append(f"{t!r} neither ran nor was cancelled")
        time.sleep(0.05)  # a second run, if there were one, would show
        with lock:
            for t, last_true, cancelled in mine:
                got = runs.get(t, [])
                if len(got) > 1:
                    errors.append(f"{t!r} ran {len(got)} times")
                if cancelled and got:
                    errors.append(f"{t!r} ran although cancel() returned True")
                if last_true is not None and got and got[0] < last_true - EPS:
                    errors.append(f"{t!r} ran at {got[0]}, before its reset deadline {last_true}")
                if not cancelled and not got and not t.is_cancelled():
                    errors.append(f"{t!r} was lost")

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors[:5]
    assert wait_for(lambda: timer.pending_timeouts() == 0)


def test_reset_of_a_call_later_handle() -> None:
    async def main() -> list[float]:
        timer = hwtimer.HashedWheelTimer(0.01)
        try:
            loop = asyncio.get_running_loop()
            got: list[float] = []
            h = timer.call_later(0.02, lambda: got.append(time.monotonic()))
            assert h.reset(0.15)
            deadline = h.deadline
            while not got:
                await asyncio.sleep(0.01)
            assert got[0] >= deadline - EPS
            assert loop.time() >= 0
            await asyncio.sleep(0.05)
            assert len(got) == 1
            return got
        finally:
            timer.stop()

    asyncio.run(main())


# ---- new_periodic ----


def test_periodic_runs_on_a_fixed_grid_without_drift(timer) -> None:
    # burst: every grid point runs, however late a busy machine makes it
    runs = Runs()
    before = time.monotonic()
    p = timer.new_periodic(runs, 0.02, missed="burst")
    after = time.monotonic()
    first = p.deadline
    assert before + 0.02 - EPS <= first <= after + 0.02 + EPS
    assert runs.wait(20)
    p.cancel()
    runs.check_never_early()
    for k, d in enumerate(runs.deadlines[:20]):
        assert grid(first, 0.02, d) == pytest.approx(k, abs=1e-6)  # no drift
    assert not p.is_expired()
    assert runs.max_active == 1


def test_skipping_periodic_stays_on_its_grid(timer) -> None:
    runs = Runs()
    p = timer.new_periodic(runs, 0.02)
    first = p.deadline
    assert runs.wait(10)
    p.cancel()
    runs.check_never_early()
    ks = [grid(first, 0.02, d) for d in runs.deadlines]
    assert ks[0] == pytest.approx(0, abs=1e-6)
    for a, b in zip(ks, ks[1:]):
        assert b == pytest.approx(round(b), abs=1e-6) and round(b) > round(a)


def test_periodic_delay_and_deadline_of_next_run(timer) -> None:
    runs = Runs()
    p = timer.new_periodic(runs, 10, delay=0.01)
    assert runs.wait(1)
    assert wait_for(lambda: p.deadline == pytest.approx(runs.deadlines[0] + 10, abs=1e-6))
    assert timer.pending_timeouts() == 1
    assert not p.is_expired() and not p.is_cancelled()


def test_periodic_counts_once_in_pending_and_stats(timer) -> None:
    runs = Runs()
    p = timer.new_periodic(runs, 0.01)
    assert runs.wait(5)
    s = timer.stats()
    assert timer.pending_timeouts() == 1 and s["pending"] == 1
    assert s["scheduled"] == 1 and s["expired"] == 0
    assert p.cancel()
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert wait_for(lambda: timer.stats()["cancelled"] == 1)


def test_periodic_counts_once_against_max_pending(make_timer) -> None:
    timer = make_timer(max_pending_timeouts=2)
    runs = Runs()
    timer.new_periodic(runs, 0.01)
    timer.new_timeout(lambda to: None, 10)
    with pytest.raises(hwtimer.RejectedExecutionError):
        timer.new_periodic(runs, 0.01)
    assert runs.wait(10)  # its runs are not schedules: nothing rejected
    assert timer.stats()["rejected"] == 1
    assert timer.pending_timeouts() == 2


def test_cancel_stops_a_periodic_and_no_run_starts_after(timer) -> None:
    runs = Runs()
    p = timer.new_periodic(runs, 0.005)
    assert runs.wait(3)
    assert p.cancel() is True
    n = len(runs.starts)
    time.sleep(0.1)
    assert len(runs.starts) == n
    assert p.cancel() is False
    assert p.is_cancelled() and not p.is_expired()
    assert p.reset(0) is False
    assert wait_for(lambda: timer.pending_timeouts() == 0)


def test_cancel_from_inside_its_run(timer) -> None:
    got = []

    def task(to: hwtimer.Timeout) -> None:
        got.append(1)
        if len(got) == 3:
            assert to.cancel() is True

    timer.new_periodic(task, 0.005)
    assert wait_for(lambda: len(got) == 3)
    time.sleep(0.1)
    assert len(got) == 3
    assert wait_for(lambda: timer.pending_timeouts() == 0)


def test_cancel_during_a_run_from_another_thread(timer) -> None:
    started = threading.Event()
    release = threading.Event()
    got = []

    def task(to: hwtimer.Timeout) -> None:
        got.append(1)
        started.set()
        release.wait(DEADLINE)

    p = timer.new_periodic(task, 0.005)
    assert started.wait(DEADLINE)
    assert p.cancel() is True  # while it runs
    assert timer.pending_timeouts() == 0  # a cancel counts at once
    release.set()
    time.sleep(0.1)
    assert got == [1]
    assert wait_for(lambda: timer.pending_timeouts() == 0)


def test_exception_ends_a_periodic(timer, caplog) -> None:
    got = []

    def task(to: hwtimer.Timeout) -> None:
        got.append(1)
        if len(got) == 3:
            raise ValueError("boom")

    with caplog.at_level(logging.WARNING, logger="hwtimer"):
        p = timer.new_periodic(task, 0.005)
        assert wait_for(p.is_expired)
    time.sleep(0.05)
    assert len(got) == 3
    assert not p.is_cancelled() and p.cancel() is False
    s = timer.stats()
    assert s["expired"] == 1 and s["task_errors"] == 1 and s["pending"] == 0
    assert any("boom" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


def test_stop_returns_a_waiting_periodic(make_timer) -> None:
    timer = make_timer()
    runs = Runs()
    p = timer.new_periodic(runs, 10)
    assert timer.stop() == [p]
    assert p.is_cancelled()
    assert timer.pending_timeouts() == 0


def test_stop_returns_a_periodic_in_its_run_and_none_starts_after(make_timer) -> None:
    timer = make_timer()
    started = threading.Event()
    runs = Runs(sleeps={0: 0.2})

    def task(to: hwtimer.Timeout) -> None:
        started.set()
        runs(to)

    p = timer.new_periodic(task, 0.01)
    assert started.wait(DEADLINE)
    left = timer.stop()  # waits for the run
    assert left == [p]
    assert p.is_cancelled()
    n = len(runs.starts)
    time.sleep(0.05)
    assert len(runs.starts) == n == 1
    assert timer.pending_timeouts() == 0
    assert timer.stop() == []


def test_stop_returns_a_periodic_whose_run_raises_after_the_stop(make_timer, caplog) -> None:
    """A run that stop() began during ends as stop() ends it, whether its
    task returns (above) or raises: returned, cancelled; the error is
    still logged and counted."""
    timer = make_timer()
    started, go = threading.Event(), threading.Event()

    def task(to: hwtimer.Timeout) -> None:
        started.set()
        assert go.wait(DEADLINE)
        raise ValueError("after the stop")

    probes = []  # each cancelled, before stop() began

    def refuses_new_timeouts() -> bool:
        try:
            probes.append(timer.new_timeout(lambda t: None, 60).cancel())
        except RuntimeError:
            return True
        return False

    p = timer.new_periodic(task, 0.01)
    assert started.wait(DEADLINE)
    left: list[list[hwtimer.Timeout]] = []
    stopper = threading.Thread(target=lambda: left.append(timer.stop()))
    stopper.start()
    assert wait_for(refuses_new_timeouts)  # stop() has begun, and waits for the run
    go.set()
    stopper.join(DEADLINE)
    assert left == [[p]]
    assert p.is_cancelled() and not p.is_expired()
    stats = timer.stats()
    assert all(probes)
    counts = (stats["cancelled"] - len(probes), stats["expired"], stats["task_errors"])
    assert counts == (1, 0, 1)
    assert "after the stop" in caplog.text


def test_stop_returns_a_periodic_in_its_run_on_the_executor(make_timer) -> None:
    """stop() does not wait for the executor's run, and returns the periodic
    timeout all the same: that run is its last."""
    release, started, ended = threading.Event(), threading.Event(), threading.Event()
    runs = []

    def task(to: hwtimer.Timeout) -> None:
        runs.append(to)
        started.set()
        release.wait(DEADLINE)
        ended.set()

    with ThreadPoolExecutor(2) as pool:
        timer = make_timer(executor=pool)
        p = timer.new_periodic(task, 0.01)
        assert started.wait(DEADLINE)
        left = timer.stop()  # the run goes on, on the pool
        assert not ended.is_set()
        assert left == [p]
        assert p.is_cancelled()
        release.set()
    assert ended.is_set() and runs == [p]  # the pool has shut down: no run after
    assert p.is_cancelled() and not p.is_expired()
    assert timer.pending_timeouts() == 0
    assert timer.stop() == []


def test_stop_returns_a_periodic_submitted_and_not_begun(make_timer) -> None:
    """A periodic timeout that waits in the executor's queue when stop() is
    called is returned by it, and does not run."""
    release, submitted = threading.Event(), threading.Event()
    runs = []

    class Pool(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
            future = super().submit(fn, *args, **kwargs)
            if args and isinstance(args[0], hwtimer.Timeout):
                submitted.set()  # by the timer
            return future

    with Pool(1) as pool:
        timer = make_timer(executor=pool)
        pool.submit(release.wait, DEADLINE)  # the one worker is busy
        p = timer.new_periodic(runs.append, 0.01)
        assert submitted.wait(DEADLINE)
        assert timer.stop() == [p]
        assert p.is_cancelled()
        release.set()
    assert runs == []
    assert timer.pending_timeouts() == 0


class _HeldExecutor:
    """Keeps what is submitted until the test runs it."""

    def __init__(self) -> None:
        self.queue: list[tuple[object, tuple[object, ...]]] = []
        self.lock = threading.Lock()

    def submit(self, fn, *args):
        with self.lock:
            self.queue.append((fn, args))

    def run_all(self) -> None:
        with self.lock:
            queue, self.queue = self.queue, []
        for fn, args in queue:
            fn(*args)


def test_cancel_and_reset_of_timeouts_waiting_in_the_executor(make_timer) -> None:
    """A one-shot submitted to the executor has expired: cancel() and
    reset() return False and it runs once. A periodic one whose run waits
    there is still pending: cancel() returns True and that run does not
    happen; reset() returns True and moves that run to the new deadline."""
    executor = _HeldExecutor()
    timer = make_timer(0.005, executor=executor)
    ran: list[tuple[str, float]] = []

    def task(name: str):
        return lambda to: ran.append((name, time.monotonic()))

    one = timer.new_timeout(task("one"), 0)
    cancelled = timer.new_periodic(task("cancelled"), 0.01, delay=0)
    moved = timer.new_periodic(task("moved"), 0.01, delay=0)
    assert wait_for(lambda: len(executor.queue) == 3)
    assert timer.pending_timeouts() == 2  # the periodic ones
    assert one.is_expired()
    assert one.cancel() is False and one.reset(0.1) is False
    assert cancelled.cancel() is True
    assert moved.reset(0.3) is True
    new_deadline = moved.deadline
    assert timer.pending_timeouts() == 1
    executor.run_all()
    assert [name for name, _ in ran] == ["one"]
    assert wait_for(lambda: executor.queue)  # the moved run, at its new deadline
    executor.run_all()
    assert [name for name, _ in ran] == ["one", "moved"]
    assert ran[1][1] >= new_deadline - EPS
    assert moved.cancel() is True
    s = timer.stats()
    assert (s["pending"], s["scheduled"], s["expired"], s["cancelled"]) == (0, 3, 1, 2)
    time.sleep(0.05)
    executor.run_all()
    assert len(ran) == 2


def test_stop_returns_periodics_whose_runs_end_together_on_the_executor(make_timer) -> None:
    """Two executor runs that end while stop() waits for the dispatch thread
    are both kept for it, also when the first one's list is made by an
    allocation whose collection runs a finalizer that lets go of the GIL,
    and the second run ends meanwhile."""
    a_go, b_go, release = threading.Event(), threading.Event(), threading.Event()
    started, blocked = threading.Semaphore(0), threading.Event()
    futures: dict[str, object] = {}
    a_thread: list[int] = []
    hold = []

    class Pool(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
            if args and args[0] is late:
                blocked.set()  # the dispatch thread waits here: so does stop()
                release.wait(DEADLINE)
            future = super().submit(fn, *args, **kwargs)
            for name, p in (("a", pa), ("b", pb)):
                if args and args[0] is p:
                    futures[name] = future
            return future

    class Finalized:
        def __del__(self) -> None:
            # collected at the first allocation after a's run: b's run ends
            # (and is kept for stop()) before that allocation returns
            if a_thread and threading.get_ident() == a_thread[0]:
                b_go.set()
                assert wait_for(lambda: "b" in futures)
                futures["b"].result(DEADLINE)  # type: ignore[attr-defined]

    def task_a(to: hwtimer.Timeout) -> None:
        started.release()
        a_go.wait(DEADLINE)
        gc.disable()
        try:
            hold.append([[] for _ in range(1000)])  # no free list to reuse, a collection due
            f = Finalized()
            f.cycle = f  # type: ignore[attr-defined]
            del f
            a_thread.append(threading.get_ident())
        finally:
            gc.enable()

    def task_b(to: hwtimer.Timeout) -> None:
        started.release()
        b_go.wait(DEADLINE)

    def ends_runs() -> None:
        def stopped() -> bool:
            try:
                timer.new_timeout(str, 3600).cancel()
            except RuntimeError:
                return True
            return False

        assert wait_for(stopped)
        a_go.set()
        assert wait_for(lambda: "a" in futures)
        futures["a"].result(DEADLINE)  # type: ignore[attr-defined]
        b_go.set()
        futures["b"].result(DEADLINE)  # type: ignore[attr-defined]
        release.set()

    late = None
    with Pool(3) as pool:
        timer = make_timer(executor=pool)
        pa = timer.new_periodic(task_a, 0.01)
        pb = timer.new_periodic(task_b, 0.01)
        assert started.acquire(timeout=DEADLINE) and started.acquire(timeout=DEADLINE)
        late = timer.new_timeout(str, 0.01)
        assert blocked.wait(DEADLINE)
        helper = threading.Thread(target=ends_runs)
        helper.start()
        try:
            left = timer.stop()
        finally:
            a_go.set()
            b_go.set()
            release.set()
            helper.join(DEADLINE)
    assert sorted(map(id, left)) == sorted([id(pa), id(pb)])
    assert pa.is_cancelled() and pb.is_cancelled()


def test_periodic_runs_never_overlap_with_an_executor(make_timer) -> None:
    with ThreadPoolExecutor(4) as pool:
        timer = make_timer(executor=pool)
        runs = Runs(sleeps={k: 0.03 for k in range(6)})
        p = timer.new_periodic(runs, 0.005, missed="burst")
        assert runs.wait(8)
        p.cancel()
        assert runs.max_active == 1
        runs.check_never_early()
        timer.stop()


def test_reset_of_a_periodic_moves_the_next_run_and_the_grid(timer) -> None:
    runs = Runs()
    p = timer.new_periodic(runs, 0.02, missed="burst")
    assert runs.wait(2)
    assert p.reset(0.2)
    moved = p.deadline
    n = len(runs.starts)
    assert runs.wait(n + 3)
    p.cancel()
    after = [d for d in runs.deadlines if d >= moved - EPS]
    assert after[0] == pytest.approx(moved, abs=1e-6)
    for k, d in enumerate(after[:3]):
        assert grid(moved, 0.02, d) == pytest.approx(k, abs=1e-6)
    runs.check_never_early()


def test_reset_inside_a_periodic_run_moves_its_next_run(timer) -> None:
    runs = Runs()

    def task(to: hwtimer.Timeout) -> None:
        runs(to)
        if len(runs.starts) == 2:
            assert to.reset(0.15) is True

    p = timer.new_periodic(task, 0.01)
    assert runs.wait(3)
    p.cancel()
    assert runs.deadlines[2] - runs.starts[1] >= 0.15 - 0.01
    runs.check_never_early()


# ---- missed runs ----

P = 0.05  # period of the missed-run tests; run 1 takes 3.4 periods


def missed_runs(timer, missed: str) -> tuple[Runs, float]:
    runs = Runs(sleeps={1: 3.4 * P})
    p = timer.new_periodic(runs, P, missed=missed)
    first = p.deadline
    assert runs.wait(6)
    p.cancel()
    runs.check_never_early()
    assert runs.max_active == 1
    return runs, first


def test_missed_skip_keeps_the_grid_and_drops_missed_runs(timer) -> None:
    runs, first = missed_runs(timer, "skip")
    ks = [grid(first, P, d) for d in runs.deadlines]
    for k in ks:
        assert k == pytest.approx(round(k), abs=1e-6)  # all on the grid
    assert ks[0] == pytest.approx(0, abs=1e-6)
    # the next is the first grid point after run 1 ended: the 3 or more
    # points it overran are skipped
    assert runs.deadlines[2] > runs.ends[1]
    assert runs.deadlines[2] - P <= runs.ends[1] + EPS
    assert round(ks[2]) >= round(ks[1]) + 4
    assert round(ks[3]) > round(ks[2])


def test_missed_delay_runs_once_now_and_restarts_the_grid(timer) -> None:
    runs, first = missed_runs(timer, "delay")
    # once now: right after run 1 ended, off the old grid
    assert runs.starts[2] - runs.ends[1] < 0.5
    assert runs.deadlines[2] <= runs.ends[1] + 0.02
    # then the grid restarts from that run's start
    assert runs.deadlines[3] == pytest.approx(runs.starts[2] + P, abs=0.02)
    assert runs.deadlines[4] >= runs.deadlines[3] + P - EPS


def check_delay_restarts_from_a_catch_up_that_waited(runs: Runs) -> None:
    """Run 1 of a "delay" periodic overran run 2's grid point, and run 2,
    the one "now" after it, waited for a later tick: its deadline is where
    run 1 ended, and the grid restarts at its start, so run 3 is a period
    after run 2 began (then, at most as late as its start measured here)."""
    assert runs.deadlines[3] - P > runs.deadlines[2] + EPS
    assert runs.deadlines[3] - P <= runs.starts[2] + EPS
    assert runs.max_active == 1
    runs.check_never_early()


def test_missed_delay_catch_up_on_an_executor_restarts_the_grid_at_its_start(make_timer):
    # on an executor the run after an overrun always goes back on the
    # wheel, behind what the dispatch thread has yet to submit
    with ThreadPoolExecutor(1) as pool:
        timer = make_timer(executor=pool)
        runs = Runs(sleeps={1: 2.5 * P})
        p = timer.new_periodic(runs, P, missed="delay")
        assert runs.wait(4)
        p.cancel()
        timer.stop()
    check_delay_restarts_from_a_catch_up_that_waited(runs)


def test_missed_delay_catch_up_behind_other_work_restarts_the_grid_at_its_start(timer):
    runs = Runs(sleeps={1: 2.5 * P})
    p = timer.new_periodic(runs, P, missed="delay")
    # due while run 1 (at 2 P) goes on: it waits when run 1 ends, and the
    # run after the overrun waits behind it
    timer.new_timeout(lambda to: None, 2.5 * P)
    try:
        assert runs.wait(4)
    finally:
        p.cancel()
    check_delay_restarts_from_a_catch_up_that_waited(runs)


def test_missed_delay_call_every_catch_up_restarts_the_grid_at_its_start(timer):
    # call_every's run after an overrun never starts inside the loop's
    # callback: it goes back on the wheel
    runs = Runs(sleeps={1: 2.5 * P})

    async def main() -> None:
        h = timer.call_every(P, lambda: runs(h), missed="delay")
        try:
            while runs.count < 4:
                await asyncio.sleep(0.005)
        finally:
            h.cancel()

    asyncio.run(asyncio.wait_for(main(), DEADLINE))
    check_delay_restarts_from_a_catch_up_that_waited(runs)


def test_missed_burst_runs_every_missed_deadline_back_to_back(timer) -> None:
    runs, first = missed_runs(timer, "burst")
    ks = [grid(first, P, d) for d in runs.deadlines]
    assert ks[:6] == pytest.approx([0, 1, 2, 3, 4, 5], abs=1e-6)  # none dropped
    # the missed ones (2, 3, 4) start back to back after run 1
    for j in (2, 3, 4):
        assert runs.starts[j] - runs.ends[j - 1] < 0.5
        assert runs.starts[j] >= runs.ends[1] - EPS


def test_late_timer_skip_does_not_run_missed_deadlines(make_timer) -> None:
    """A dispatch thread held up by another task: the timer is late by
    periods; skip then runs the due one once, not every missed one."""
    timer = make_timer()
    runs = Runs()
    timer.new_timeout(lambda to: time.sleep(0.25), 0.03)
    p = timer.new_periodic(runs, 0.02, delay=0.04)
    first = p.deadline
    assert runs.wait(4)
    p.cancel()
    ks = [round(grid(first, 0.02, d)) for d in runs.deadlines]
    assert ks[0] == 0 and ks[1] >= 10  # 1..9 were missed and dropped


@pytest.mark.parametrize("missed", ["delay", "burst"])
def test_a_periodic_that_cannot_catch_up_lets_other_tasks_run(timer, missed) -> None:
    """A task slower than its period is due again as each run ends; its
    catch-up runs wait behind the other due tasks rather than keep the
    dispatch thread for good."""
    runs = Runs(sleeps={k: 2.5 * P for k in range(1000)})
    p = timer.new_periodic(runs, P, missed=missed)
    ran = threading.Event()
    timer.new_timeout(lambda to: ran.set(), 2 * P)
    try:
        assert ran.wait(DEADLINE)
        assert runs.wait(runs.count + 2)  # and it goes on catching up
    finally:
        p.cancel()
    assert runs.max_active == 1


def test_a_call_every_that_cannot_catch_up_lets_its_loop_run(timer) -> None:
    async def main() -> int:
        calls = 0

        def cb() -> None:
            nonlocal calls
            calls += 1
            time.sleep(2.5 * P)

        h = timer.call_every(P, cb, missed="burst")
        await asyncio.sleep(5 * P)  # the loop gets its turn between runs
        h.cancel()
        return calls

    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(asyncio.run(main())), daemon=True)
    thread.start()
    thread.join(DEADLINE)
    assert result and result[0] >= 2


def test_reset_of_a_periodic_delivered_but_not_yet_run_moves_that_run(make_timer) -> None:
    """A task resets a periodic timeout due in the same tick, after it in
    the batch: reset() returns True, so that run does not happen at the old
    deadline but at the new one."""
    timer = make_timer(tick_duration=0.2)
    runs = Runs()
    box: dict[str, object] = {}

    def first(to: hwtimer.Timeout) -> None:
        box["at"] = time.monotonic()  # before: the new deadline is 0.3 s on from the reset
        box["reset"] = box["p"].reset(0.3)

    timer.new_timeout(first, 0.01)
    box["p"] = p = timer.new_periodic(runs, 10.0, delay=0.01)
    assert wait_for(lambda: "reset" in box)
    assert box["reset"] is True
    assert runs.wait(1)
    p.cancel()
    assert runs.starts[0] >= box["at"] + 0.3 - EPS
    assert runs.deadlines[0] == pytest.approx(box["at"] + 0.3, abs=0.05)


# ---- bad input ----


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"period": 0}, ValueError),
        ({"period": -1}, ValueError),
        ({"period": float("nan")}, ValueError),
        ({"period": "1"}, TypeError),
        ({"period": None}, TypeError),
        ({"period": 1, "missed": "bogus"}, ValueError),
        ({"period": 1, "missed": 1}, ValueError),
        ({"period": 1, "delay": "x"}, TypeError),
        ({"period": 1, "delay": float("nan")}, ValueError),
    ],
)
def test_new_periodic_bad_input_schedules_nothing(timer, kwargs, exc) -> None:
    with pytest.raises(exc):
        timer.new_periodic(lambda to: None, **kwargs)
    assert timer.pending_timeouts() == 0
    assert timer.stats()["scheduled"] == 0


def test_new_periodic_task_must_be_callable(timer) -> None:
    with pytest.raises(TypeError):
        timer.new_periodic(None, 1)
    with pytest.raises(TypeError):
        timer.new_periodic(lambda to: None, 1, 2)  # delay is keyword-only
    assert timer.stats()["scheduled"] == 0


def test_new_periodic_after_stop(make_timer) -> None:
    timer = make_timer()
    timer.stop()
    with pytest.raises(RuntimeError):
        timer.new_periodic(lambda to: None, 1)


# ---- call_every ----


def test_call_every_runs_in_the_loop_thread_with_args_and_context(timer) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def main() -> None:
        got: list[tuple[object, str, int]] = []
        var.set("mine")
        loop_thread = threading.get_ident()

        def cb(x: object) -> None:
            got.append((x, var.get(), threading.get_ident()))

        h = timer.call_every(0.01, cb, "a", delay=0)
        first = h.deadline
        while len(got) < 5:
            await asyncio.sleep(0.005)
        assert h.cancel()
        n = len(got)
        await asyncio.sleep(0.05)
        assert len(got) == n
        assert all(g == ("a", "mine", loop_thread) for g in got)
        assert h.deadline >= first

    asyncio.run(main())
    assert wait_for(lambda: timer.pending_timeouts() == 0)


def test_call_every_missed_burst_in_the_loop(timer) -> None:
    async def main() -> list[float]:
        deadlines: list[float] = []
        h = None

        def cb() -> None:
            deadlines.append(h.deadline)
            if len(deadlines) == 2:
                time.sleep(3.4 * P)  # blocks the loop

        h = timer.call_every(P, cb, missed="burst")
        first = h.deadline
        while len(deadlines) < 6:
            await asyncio.sleep(0.01)
        h.cancel()
        return [grid(first, P, d) for d in deadlines]

    ks = asyncio.run(main())
    assert ks[:6] == pytest.approx([0, 1, 2, 3, 4, 5], abs=1e-6)


def test_call_every_error_is_reported_and_ends_it(timer) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        reported = []
        loop.set_exception_handler(lambda loop, ctx: reported.append(ctx))
        got = []

        def cb() -> None:
            got.append(1)
            raise RuntimeError("bad")

        h = timer.call_every(0.01, cb, delay=0)
        while not reported:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        assert len(got) == 1 and h.is_expired()
        assert isinstance(reported[0]["exception"], RuntimeError)

    asyncio.run(main())
    assert timer.pending_timeouts() == 0


def test_call_every_bad_input(timer) -> None:
    async def main() -> None:
        with pytest.raises(ValueError):
            timer.call_every(0, lambda: None)
        with pytest.raises(TypeError):
            timer.call_every("1", lambda: None)
        with pytest.raises(ValueError):
            timer.call_every(1, lambda: None, missed="late")
        with pytest.raises(TypeError):
            timer.call_every(1, None)
        with pytest.raises(TypeError):
            timer.call_every(1, lambda: None, bogus=1)
        with pytest.raises(TypeError):
            timer.call_later(1, lambda: None, missed="skip")  # call_every's only

    asyncio.run(main())
    assert timer.stats()["scheduled"] == 0


def test_call_every_needs_a_loop(timer) -> None:
    with pytest.raises(RuntimeError):
        timer.call_every(1, lambda: None)


def test_call_every_of_a_closed_loop_is_let_go(timer) -> None:
    loop = asyncio.new_event_loop()
    got = []
    timer.call_every(0.01, got.append, 1, loop=loop, delay=0)
    loop.run_until_complete(asyncio.sleep(0.1))
    loop.close()
    assert got
    # a timeout for another loop purges the closed loop's sink
    loop2 = asyncio.new_event_loop()
    try:
        timer.call_later(10, lambda: None, loop=loop2).cancel()
        assert wait_for(lambda: timer.pending_timeouts() == 0)
    finally:
        loop2.close()


def test_second_reset_to_sooner_wakes_a_sleeping_worker(make_timer) -> None:
    timer = make_timer(0.01, 1024)  # a turn of 10 s: nothing wakes it before 8 s
    c = Counter()
    t = timer.new_timeout(c, 8)
    time.sleep(2.5)  # idle long enough that the worker blocks until the 8 s tick
    assert t.reset(9)  # later: no need to wake it
    assert t.reset(0.05)  # sooner, before the worker saw the first reset
    began = time.monotonic()
    assert c.wait(1, timeout=4)  # not at the 8 s tick, 5.5 s away
    assert c.times[0] - began < 4


def test_periodic_with_an_executor_ends_on_an_exception(make_timer) -> None:
    with ThreadPoolExecutor(2) as pool:
        timer = make_timer(executor=pool)
        got = []

        def task(to: hwtimer.Timeout) -> None:
            got.append(threading.current_thread().name)
            if len(got) == 3:
                raise ValueError("boom")

        p = timer.new_periodic(task, 0.005)
        assert wait_for(p.is_expired)
        time.sleep(0.05)
        assert len(got) == 3
        assert all("dispatch" not in name for name in got)  # ran in the pool
        assert wait_for(lambda: timer.pending_timeouts() == 0)
        assert timer.stats()["task_errors"] == 1
        timer.stop()


def test_reset_of_a_periodic_from_another_thread_during_its_run(timer) -> None:
    started = threading.Event()
    release = threading.Event()
    runs = Runs()

    def task(to: hwtimer.Timeout) -> None:
        runs(to)
        if len(runs.starts) == 1:
            started.set()
            release.wait(DEADLINE)

    p = timer.new_periodic(task, 0.01)
    assert started.wait(DEADLINE)
    assert p.reset(0.3) is True  # while it runs: moves the next run
    moved = p.deadline
    release.set()
    assert runs.wait(2)
    p.cancel()
    assert runs.deadlines[1] == pytest.approx(moved, abs=1e-6)
    assert runs.starts[1] >= moved - EPS


def test_an_ended_periodic_lets_go_of_its_task(timer) -> None:
    import weakref

    class Task:
        def __call__(self, to: hwtimer.Timeout) -> None:
            pass

    task = Task()
    ref = weakref.ref(task)
    p = timer.new_periodic(task, 0.005)
    del task
    time.sleep(0.03)
    assert p.cancel()
    del p
    assert collect_until(ref)


class _InlineExecutor:
    """An executor of the user's own: submit() runs the call at once."""

    def submit(self, fn, *args):
        fn(*args)


@pytest.mark.parametrize("executor", [None, "pool", "inline"])
@pytest.mark.parametrize("end", ["cancel", "stop", "raise"])
def test_an_ended_periodic_lets_go_of_its_task_on_any_executor(
    make_timer, monkeypatch, end: str, executor: str | None
) -> None:
    """However a periodic timeout ends, on the dispatch thread or on an
    executor, the timer holds its task no more."""
    import weakref

    # the log record of the error would keep the task's frame
    monkeypatch.setattr(logging.getLogger("hwtimer"), "disabled", True)

    runs = []

    class Task:
        def __call__(self, to: hwtimer.Timeout) -> None:
            runs.append(to.deadline)
            if end == "raise":
                raise ValueError("periodic task failed")

    with ThreadPoolExecutor(2) as pool:
        ex = {None: None, "pool": pool, "inline": _InlineExecutor()}[executor]
        timer = make_timer(0.005, executor=ex)
        task = Task()
        ref = weakref.ref(task)
        p = timer.new_periodic(task, 0.005)
        del task
        assert wait_for(lambda: len(runs) >= (1 if end == "raise" else 2))
        if end == "cancel":
            assert p.cancel()
        elif end == "stop":
            assert timer.stop() == [p]
        else:
            assert wait_for(p.is_expired)
            assert wait_for(lambda: timer.stats()["task_errors"] == 1)
        del p
        assert collect_until(ref)
        timer.stop()


def test_stop_returns_a_waiting_call_every(make_timer) -> None:
    timer = make_timer()

    async def main() -> None:
        h = timer.call_every(10, lambda: None)
        assert timer.stop() == [h]
        assert h.is_cancelled()

    asyncio.run(main())
