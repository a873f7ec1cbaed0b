"""asyncio on a ManualTimer: call_later callbacks and scope expiries handed
to their loop when the test advances the clock; timeout(), wait_for() and
sleep() under the manual_timer fixture; the example service's IdleWatcher
over half an hour in milliseconds; and follow_loop_time() on a loop whose
time() is fake."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import run_threads_switching_often

import hwtimer
from hwtimer.testing import ManualTimer, follow_loop_time, use_timer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "echo_service.py"


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Callable[[], Awaitable[Any]]], Any]:
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        new_loop = uvloop.new_event_loop
    else:
        new_loop = asyncio.new_event_loop

    def runner(main: Callable[[], Awaitable[Any]]) -> Any:
        loop = new_loop()
        try:
            return loop.run_until_complete(main())
        finally:
            loop.close()

    return runner


def test_async_advances_add_up_as_their_seconds_do(manual_timer: ManualTimer, run: Any) -> None:
    """advance_async(1 / 3) three times, mixed with advance(), reaches 1.0,
    and a sleep until then ends."""

    async def main() -> None:
        woke: list[float] = []

        async def sleeper() -> None:
            await hwtimer.sleep(1.0)
            woke.append(manual_timer.time())

        task = asyncio.ensure_future(sleeper())
        await manual_timer.advance_async(1 / 3)
        manual_timer.advance(1 / 3)
        await manual_timer.advance_async(1 / 3)
        await task
        assert woke == [1.0]
        assert manual_timer.time() == 1.0

    run(main)


def test_call_later_is_handed_to_the_loop(manual_timer: ManualTimer, run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ran: list[tuple[float, int]] = []
        manual_timer.call_later(
            2, lambda x: ran.append((manual_timer.time(), threading.get_ident())), 1
        )
        assert manual_timer.advance(1.999) == 0
        assert manual_timer.advance(0.001) == 1  # handed over ...
        assert ran == []  # ... to run in the loop, not in advance()
        while not ran:
            await asyncio.sleep(0)
        assert ran == [(2.0, threading.get_ident())]
        ran.clear()
        manual_timer.call_later(1, lambda: ran.append((manual_timer.time(), 0)))
        assert await manual_timer.advance_async(5) == 1
        assert ran == [(3.0, 0)]  # the clock stopped at its tick while it ran
        assert manual_timer.time() == 7.0
        assert loop.is_running()

    run(main)


def test_call_later_handed_to_the_loop_is_cancellable_until_it_runs(
    manual_timer: ManualTimer, run: Any
) -> None:
    # as asyncio's TimerHandle: a cancel in the loop's thread after the
    # handover, before the loop ran the callback, wins
    async def main() -> None:
        ran: list[int] = []
        handles: list[Any] = []

        def cancel_own(k: int) -> None:
            ran.append(k)
            handles[k].cancel()  # its own, in its run: too late, False

        for k in range(3):
            handles.append(manual_timer.call_later(1, cancel_own, k))
        assert manual_timer.advance(1) == 3  # handed over, not run
        assert handles[1].cancel() is True
        assert handles[2].reset(1) is True  # due at 2.0
        assert handles[1].is_cancelled() and not handles[1].is_expired()
        stats = manual_timer.stats()
        assert (stats["expired"], stats["cancelled"], stats["pending"]) == (1, 1, 1)
        for _ in range(5):
            await asyncio.sleep(0)
        assert ran == [0]
        assert handles[0].is_expired() and handles[0].cancel() is False
        assert await manual_timer.advance_async(1) == 1  # the reset one, at 2.0
        assert ran == [0, 2]
        assert handles[2].cancel() is False and handles[2].is_expired()
        stats = manual_timer.stats()
        assert (stats["expired"], stats["cancelled"], stats["pending"]) == (2, 1, 0)

    run(main)


def test_a_large_tick_gives_each_consumer_its_own_in_order(
    manual_timer: ManualTimer, run: Any
) -> None:
    # 20,000 due in one tick: new_timeout() and new_periodic() tasks, which
    # advance() runs, between call_later() callbacks, which go to the loop,
    # some of each cancelled.  The wheel's walk takes the first kind off
    # the bucket in runs, chunk by chunk and slice by slice, and the others
    # one by one: each consumer still gets its own once, in scheduling
    # order.
    async def main() -> None:
        n = 20_000
        ran: list[int] = []
        on_loop: list[int] = []
        handles: list[Any] = []
        for i in range(n):
            if i % 3 == 1:
                handles.append(manual_timer.call_later(1, on_loop.append, i))
            elif i % 10 == 4:
                handles.append(manual_timer.new_periodic(lambda t, i=i: ran.append(i), 5, delay=1))
            else:
                handles.append(manual_timer.new_timeout(lambda t, i=i: ran.append(i), 1))
        cancelled = set(range(0, n, 7))
        assert all(handles[i].cancel() for i in cancelled)
        due = [i for i in range(n) if i not in cancelled]
        loop_due = [i for i in due if i % 3 == 1]
        assert manual_timer.advance(1) == len(due)
        assert ran == [i for i in due if i % 3 != 1]
        for _ in range(100):
            if len(on_loop) >= len(loop_due):
                break
            await asyncio.sleep(0)
        assert on_loop == loop_due
        periodic = [i for i in due if i % 3 != 1 and i % 10 == 4]
        stats = manual_timer.stats()
        assert stats["pending"] == len(periodic)  # each due again at 6.0
        assert stats["cancelled"] == len(cancelled)

    run(main)


def test_call_every_runs_at_each_tick_on_the_loop(manual_timer: ManualTimer, run: Any) -> None:
    async def main() -> None:
        times: list[float] = []
        handle = manual_timer.call_every(60, lambda: times.append(manual_timer.time()))
        assert await manual_timer.advance_async(3600) == 60  # an hour, every minute
        assert times == [60.0 * k for k in range(1, 61)]
        assert handle.cancel()
        assert await manual_timer.advance_async(600) == 0

    run(main)


def test_a_loops_catch_up_runs_count_as_one_hand_over(manual_timer: ManualTimer, run: Any) -> None:
    # a "burst" callback shorter than the tick is handed over once a tick
    # and catches up in the loop: advance_async() counts the hand-overs
    async def main() -> None:
        runs: list[float] = []
        handle = manual_timer.call_every(0.0001, lambda: runs.append(1), missed="burst")
        assert await manual_timer.advance_async(0.01) == 10
        assert len(runs) == 100
        assert handle.cancel()

    run(main)


def test_call_later_from_another_thread_with_loop_given(
    manual_timer: ManualTimer, run: Any
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        threads: list[int] = []

        def callback() -> None:
            threads.append(threading.get_ident())
            done.set()

        def test_thread() -> None:
            manual_timer.call_later(30, callback, loop=loop)
            manual_timer.advance(31)

        thread = threading.Thread(target=test_thread)
        thread.start()
        await asyncio.wait_for(done.wait(), 10)
        thread.join()
        assert threads == [threading.get_ident()]

    run(main)


def test_timeout_scope_expires_when_the_clock_passes(manual_timer: ManualTimer, run: Any) -> None:
    async def main() -> None:
        started = time.monotonic()

        async def body() -> str:
            try:
                async with hwtimer.timeout(60) as cm:
                    await asyncio.Event().wait()
            except TimeoutError:
                assert cm.expired()
                return f"timed out at {manual_timer.time()}"
            return "no timeout"

        task = asyncio.create_task(body())
        await asyncio.sleep(0)  # it enters the scope at 0.0
        await manual_timer.advance_async(59.9)
        assert not task.done()
        await manual_timer.advance_async(0.2)
        assert task.done()
        assert task.result() == "timed out at 60.0"
        assert time.monotonic() - started < 5  # a minute of timer time, no real wait

    run(main)


def test_a_scope_on_a_tick_end_fires_there_whatever_the_loop_time(
    manual_timer: ManualTimer,
) -> None:
    """timeout(60) is due 60 s on from its creation, exactly: not the 60 s
    and an ulp that loop.time() + 60 - loop.time() gives just below a
    power of two, which rounded up to whole ns is a tick later."""

    class StoppedClockLoop(asyncio.SelectorEventLoop):
        def time(self) -> float:
            return 8191.0001  # (this + 60) - this is 60.00000000000091

    async def main() -> str:
        async def body() -> str:
            try:
                async with hwtimer.timeout(60):
                    await asyncio.Event().wait()
            except TimeoutError:
                return f"timed out at {manual_timer.time()}"
            return "no timeout"

        task = asyncio.create_task(body())
        await asyncio.sleep(0)
        await manual_timer.advance_async(60)
        assert task.done()
        return task.result()

    loop = StoppedClockLoop()
    try:
        assert loop.run_until_complete(main()) == "timed out at 60.0"
    finally:
        loop.close()


def test_wait_for_and_sleep_under_the_fixture(manual_timer: ManualTimer, run: Any) -> None:
    async def main() -> None:
        never = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(hwtimer.wait_for(never, 10))
        quick = asyncio.create_task(hwtimer.wait_for(asyncio.sleep(0, "fast"), 10))
        sleeping = asyncio.create_task(hwtimer.sleep(3, "woke"))
        await asyncio.sleep(0)
        assert await quick == "fast"
        await manual_timer.advance_async(2.999)
        assert not sleeping.done()
        await manual_timer.advance_async(0.001)
        assert sleeping.done() and sleeping.result() == "woke"
        await manual_timer.advance_async(7)
        assert waiting.done()
        with pytest.raises(TimeoutError):
            waiting.result()
        assert never.cancelled()
        assert manual_timer.pending_timeouts() == 0

    run(main)


def test_nested_scopes_on_the_manual_clock(manual_timer: ManualTimer, run: Any) -> None:
    async def main() -> list[str]:
        events: list[str] = []

        async def body() -> None:
            async with hwtimer.timeout(10):
                try:
                    async with hwtimer.timeout(2):
                        await asyncio.sleep(3600)
                except TimeoutError:
                    events.append(f"inner at {manual_timer.time()}")
                await asyncio.sleep(3600)

        task = asyncio.create_task(body())
        await asyncio.sleep(0)
        for _ in range(12):
            await manual_timer.advance_async(1)
        with pytest.raises(TimeoutError):
            await task
        events.append(f"outer by {manual_timer.time()}")
        return events

    assert run(main) == ["inner at 2.0", "outer by 12.0"]


@pytest.mark.parametrize(("moved", "left"), [(100, 0.0), (3, 2.0)])
def test_scope_entered_late_keeps_its_deadline_on_the_manual_clock(
    manual_timer: ManualTimer, run: Any, moved: float, left: float
) -> None:
    # timeout(5) made at 0.0 is due at 5 on the manual clock, as
    # asyncio.timeout()'s deadline is fixed when it is made: entered after
    # the clock moved `moved` seconds, it has `left` of them to run (none:
    # it expires at the loop's next iteration)
    async def main() -> None:
        cm = hwtimer.timeout(5)
        await manual_timer.advance_async(moved)

        async def body() -> float:
            with pytest.raises(TimeoutError):
                async with cm:
                    await asyncio.Event().wait()
            return manual_timer.time()

        task = asyncio.create_task(body())
        await asyncio.sleep(0)  # it enters the scope at `moved`
        if left:
            await manual_timer.advance_async(left - 0.001)
            assert not task.done()
            await manual_timer.advance_async(0.001)
        assert await asyncio.wait_for(task, 5) == pytest.approx(moved + left)

    run(main)


def test_advance_async_moves_the_clock_after_the_tasks_made_before_it_start(
    manual_timer: ManualTimer, run: Any
) -> None:
    """The clock moves by `seconds` once the tasks created just before the
    call have started, also when one of them moves it first."""

    async def main() -> None:
        async def advances() -> None:
            manual_timer.advance(5)

        asyncio.ensure_future(advances())
        await manual_timer.advance_async(1)
        assert manual_timer.time() == 6.0
        # two at once: each moves it by its own seconds
        await asyncio.gather(manual_timer.advance_async(1), manual_timer.advance_async(1))
        assert manual_timer.time() == 8.0

    run(main)


def test_advance_async_waits_for_tasks_that_yield_between_deadlines(
    manual_timer: ManualTimer, run: Any
) -> None:
    """A worker that yields to the loop many times after each wake-up (a
    batch processed item by item) schedules its next sleep before the
    clock moves on."""

    async def main() -> None:
        runs: list[float] = []

        async def worker() -> None:
            while True:
                await hwtimer.sleep(1)
                runs.append(manual_timer.time())
                for _ in range(40):
                    await asyncio.sleep(0)

        task = asyncio.ensure_future(worker())
        await manual_timer.advance_async(5)
        task.cancel()
        await asyncio.wait([task])
        assert runs == [1.0, 2.0, 3.0, 4.0, 5.0]

    run(main)


def test_advance_async_warns_when_the_loop_does_not_settle(
    manual_timer: ManualTimer, run: Any
) -> None:
    """A task that never waits keeps the loop busy for ever: advance_async()
    gives up waiting for it after a bounded number of turns, and says so
    (the clock then moves on before that task has settled), at the line
    of the call."""

    async def main() -> None:
        async def spins() -> None:
            await hwtimer.sleep(1)
            while True:
                await asyncio.sleep(0)

        task = asyncio.ensure_future(spins())
        with pytest.warns(RuntimeWarning, match="still had work ready") as caught:
            await manual_timer.advance_async(2)
        task.cancel()
        await asyncio.wait([task])
        assert manual_timer.time() == 2.0
        assert {w.filename for w in caught} == {__file__}

    run(main)


def test_an_advance_from_a_callback_adds_to_a_running_advance_async(
    manual_timer: ManualTimer, run: Any
) -> None:
    """advance_async(seconds) moves the clock by its own seconds: an
    advance() that a callback makes meanwhile moves it further, as two
    advance() calls in a row would, and the periodic runs of the whole span
    all happen (those of new_periodic(), which advance() runs itself)."""

    async def main() -> None:
        runs: list[float] = []
        manual_timer.new_periodic(lambda t: runs.append(manual_timer.time()), 0.1)
        manual_timer.call_later(0.25, manual_timer.advance, 0.5)
        await manual_timer.advance_async(1)
        assert manual_timer.time() == 1.5
        assert len(runs) == 15 and runs[-1] == 1.5

    run(main)


def test_an_advance_from_a_callback_adds_its_fraction_of_a_ns_too(
    manual_timer: ManualTimer, run: Any
) -> None:
    """The seconds of advance_async() and of an advance() that a callback
    makes meanwhile add up below a ns too, as advance() calls in a row do:
    the carry of neither is lost, so the clock reads what the same calls
    in a row reach, however the fractions fall."""

    async def main() -> None:
        a, b, rest = 0.1 + 0.4e-9, 0.007 + 0.4e-9, 0.05e-9
        in_a_row = ManualTimer()
        for seconds in (a, b, rest):
            in_a_row.advance(seconds)
        manual_timer.call_later(0.05, manual_timer.advance, b)
        await manual_timer.advance_async(a)
        manual_timer.advance(rest)
        assert manual_timer.time() == in_a_row.time()

    run(main)


def test_advance_async_lets_a_task_woken_by_a_woken_task_schedule_at_its_tick(
    manual_timer: ManualTimer, run: Any
) -> None:
    """What the tasks that a tick woke set going settles before the clock
    moves on, on every loop: a task woken by one of them (through an
    Event) schedules its sleep at that tick, so it runs one sleep later."""

    async def main() -> None:
        event = asyncio.Event()
        woke: list[float] = []

        async def setter() -> None:
            await hwtimer.sleep(0.01)
            event.set()

        async def follower() -> None:
            await event.wait()
            await hwtimer.sleep(0.01)
            woke.append(manual_timer.time())

        tasks = [asyncio.ensure_future(setter()), asyncio.ensure_future(follower())]
        await manual_timer.advance_async(0.05)
        assert woke == [0.02]
        await asyncio.gather(*tasks)

    run(main)


def test_advance_async_waits_for_a_task_woken_through_a_futures_callbacks(
    manual_timer: ManualTimer, run: Any
) -> None:
    """A task that awaits gather(), or a future that a plain callback
    completes, is woken by callbacks that take turns of the loop of their
    own, with no task ready to step meanwhile: on a loop that hides its
    ready queue (uvloop) too, it schedules its next deadline before the
    clock moves, at the start and at each tick."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        times: list[tuple[str, float]] = []

        async def child() -> None:
            pass

        async def gathers() -> None:
            await asyncio.gather(child(), child())
            await hwtimer.sleep(1)
            times.append(("gathered", manual_timer.time()))
            await asyncio.gather(child(), child())
            await hwtimer.sleep(1)
            times.append(("gathered", manual_timer.time()))

        async def called_back() -> None:
            for _ in range(2):
                done = loop.create_future()
                loop.call_soon(loop.call_soon, done.set_result, None)
                await done
                await hwtimer.sleep(1)
                times.append(("called back", manual_timer.time()))

        tasks = [asyncio.ensure_future(gathers()), asyncio.ensure_future(called_back())]
        await manual_timer.advance_async(2)
        assert all(task.done() for task in tasks)
        assert sorted(times) == [
            ("called back", 1.0),
            ("called back", 2.0),
            ("gathered", 1.0),
            ("gathered", 2.0),
        ]

    run(main)


def test_advance_async_waits_for_a_task_woken_through_gather_nested_three_deep(
    manual_timer: ManualTimer, run: Any
) -> None:
    """The chain of done callbacks that the README says advance_async()
    waits for on every loop: gather() nested three deep, each level a turn
    of the loop with no task ready to step."""

    async def main() -> None:
        times: list[float] = []

        async def nested() -> None:
            for _ in range(2):
                await asyncio.gather(asyncio.gather(asyncio.gather(hwtimer.sleep(1))))
                times.append(manual_timer.time())

        task = asyncio.ensure_future(nested())
        await manual_timer.advance_async(2)
        assert task.done()
        assert times == [1.0, 2.0]

    run(main)


def test_advance_async_with_a_callback_of_an_unhashable_object_ready(
    manual_timer: ManualTimer, run: Any
) -> None:
    """A handle in the loop's ready queue whose callback is a method of an
    unhashable object (a list's append) is work like any other: the clock
    moves once it has run, and advance_async() raises nothing."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        got: list[int] = []

        async def pump() -> None:
            for i in range(5):
                loop.call_soon(got.append, i)
                await asyncio.sleep(0)

        task = asyncio.ensure_future(pump())
        assert await manual_timer.advance_async(1) == 0
        assert task.done() and got == [0, 1, 2, 3, 4]
        assert manual_timer.time() == 1.0

    run(main)


def test_advance_async_on_loops_in_several_threads_at_once() -> None:
    """Event loops in several threads, each advancing a ManualTimer of its
    own with advance_async() at the same time: none of them raises (each
    reads which tasks are settling while the others come and go)."""
    errors: list[BaseException] = []

    def one_loop() -> None:
        timer = ManualTimer()

        async def main() -> None:
            for _ in range(300):
                await timer.advance_async(0.001)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the test, not the thread
            errors.append(exc)
        finally:
            timer.stop()

    for _ in range(3):
        run_threads_switching_often(one_loop, 16)
    assert errors == []


def test_advance_async_bad_input_changes_nothing(manual_timer: ManualTimer, run: Any) -> None:
    async def main() -> None:
        ran: list[int] = []
        manual_timer.call_later(0, ran.append, 1)
        for bad, error in ((-1, ValueError), (float("nan"), ValueError), ("x", TypeError)):
            with pytest.raises(error):
                await manual_timer.advance_async(bad)
        assert manual_timer.time() == 0.0 and ran == []
        await manual_timer.advance_async(0.001)
        assert ran == [1]

    run(main)


def test_advance_async_moves_new_timeouts_into_the_wheel_as_advance_does(
    manual_timer: ManualTimer, run: Any
) -> None:
    # advance(0) moves the timeouts scheduled since into the wheel (the
    # worker's job on a real timer); advance_async() does the same, also
    # for those that the callbacks of its last tick scheduled
    def in_wheel() -> int:
        return sum(level["timeouts"] for level in manual_timer.stats()["levels"])

    async def main() -> None:
        manual_timer.new_timeout(lambda timeout: None, 5)
        assert await manual_timer.advance_async(0) == 0
        assert in_wheel() == 1
        manual_timer.call_later(1, manual_timer.new_timeout, lambda timeout: None, 10)
        assert await manual_timer.advance_async(1) == 1
        assert manual_timer.pending_timeouts() == 2
        assert in_wheel() == 2

    run(main)


def test_idle_watcher_over_half_an_hour(manual_timer: ManualTimer, run: Any) -> None:
    # examples/echo_service.py's IdleWatcher with a 30-minute idle timeout:
    # activity keeps it quiet, 30 minutes of silence report it, all in
    # well under a second of real time.
    spec = importlib.util.spec_from_file_location("echo_service_manual", EXAMPLE)
    assert spec is not None and spec.loader is not None
    echo_service = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(echo_service)

    async def main() -> list[float]:
        idle_at: list[float] = []
        watcher = echo_service.IdleWatcher(
            30 * 60, lambda: idle_at.append(manual_timer.time()), clock=manual_timer.time
        )
        watcher.start()
        for _ in range(10):  # a read every 10 minutes: never idle
            await manual_timer.advance_async(10 * 60)
            watcher.touch()
        assert idle_at == [] and manual_timer.pending_timeouts() == 1
        last_touch = manual_timer.time()
        await manual_timer.advance_async(29 * 60 + 59)
        assert idle_at == []
        await manual_timer.advance_async(2)
        assert len(idle_at) == 1
        # at the last read + 30 minutes, a tick boundary
        assert idle_at == [last_touch + 30 * 60]
        assert manual_timer.pending_timeouts() == 0
        watcher.stop()
        return idle_at

    started = time.monotonic()
    run(main)
    assert time.monotonic() - started < 10  # "well under a second", on a busy machine


# ---- follow_loop_time(): a loop whose time() is fake ----


class JumpLoop(asyncio.SelectorEventLoop):
    """A loop whose time() runs ahead of the real clock by `offset`, which
    the test moves: a stand-in for any fake-time loop."""

    offset = 0.0

    def time(self) -> float:
        return super().time() + self.offset


def run_jump(main: Callable[[JumpLoop], Awaitable[Any]]) -> Any:
    loop = JumpLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


def test_follow_loop_time_puts_deadlines_on_the_loop() -> None:
    async def main(loop: JumpLoop) -> list[str]:
        events: list[str] = []

        async def scoped() -> None:
            try:
                async with hwtimer.timeout(100):
                    await asyncio.sleep(10**6)
            except TimeoutError:
                events.append("timeout")

        async def sleeper() -> None:
            await hwtimer.sleep(50)
            events.append("slept")

        tasks = [asyncio.create_task(scoped()), asyncio.create_task(sleeper())]
        await asyncio.sleep(0)
        started = time.monotonic()
        loop.offset += 60  # loop time jumps a minute: the sleep is over
        while "slept" not in events:
            await asyncio.sleep(0.001)
        assert events == ["slept"]
        loop.offset += 60  # and the scope's 100 s
        await asyncio.gather(*tasks)
        assert events == ["slept", "timeout"]
        assert time.monotonic() - started < 5
        return events

    with follow_loop_time():
        run_jump(main)


def test_follow_loop_time_a_scope_entered_late_keeps_its_loop_deadline() -> None:
    # made at loop time t, timeout(5) is due at t + 5 on the loop's clock:
    # entered after that clock jumped 100 s, it expires at once
    async def main(loop: JumpLoop) -> None:
        cm = hwtimer.timeout(5)
        loop.offset += 100
        with pytest.raises(TimeoutError):
            async with cm:
                await asyncio.sleep(5)  # real seconds: the offset stays

    with follow_loop_time():
        run_jump(main)


def test_without_follow_loop_time_a_real_timer_ignores_loop_time(
    timer: hwtimer.HashedWheelTimer,
) -> None:
    # a timer of its own, stopped after the test: the shared one keeps the
    # cancelled deadline (and through it the loop) until its worker's next
    # look at its cancels, up to a second later
    async def main(loop: JumpLoop) -> bool:
        fired = False
        try:
            async with hwtimer.timeout(100, timer=timer):
                loop.offset += 200
                await asyncio.sleep(0.05)  # loop time has passed the deadline
        except TimeoutError:
            fired = True
        return fired

    assert run_jump(main) is False


def test_follow_loop_time_nests_and_leaves_manual_timers_alone() -> None:
    from hwtimer._hwtimer import _follow_loop_time

    assert _follow_loop_time(None) is False
    with follow_loop_time():
        with follow_loop_time():
            assert _follow_loop_time(None) is True
        assert _follow_loop_time(None) is True
    assert _follow_loop_time(None) is False

    async def main(loop: JumpLoop) -> str:
        timer = ManualTimer()
        with use_timer(timer), follow_loop_time():
            sleeping = asyncio.create_task(hwtimer.sleep(5, "on the manual clock"))
            await asyncio.sleep(0)
            loop.offset += 10  # the loop's clock does not count here
            await asyncio.sleep(0.01)
            assert not sleeping.done()
            await timer.advance_async(5.001)
            result = await sleeping
        timer.stop()
        return result

    assert run_jump(main) == "on the manual clock"


# ---- a timer freed as its coroutine finishes ----


@pytest.mark.parametrize("make", [ManualTimer, lambda: hwtimer.HashedWheelTimer(0.01, 8)])
def test_a_timer_freed_as_a_coroutine_ends_keeps_its_outcome(
    make: Callable[[], Any], run: Any
) -> None:
    # Closing a freed timer's loop sinks asks the loop whether it is
    # closed: that must not clear the exception in flight (the coroutine's
    # StopIteration, before 3.11, or what it raised).
    async def returns() -> str:
        timer = make()
        timer.call_later(10, lambda: None).cancel()
        timer.stop()
        return "value"

    async def raises() -> None:
        timer = make()
        timer.call_later(10, lambda: None).cancel()
        timer.stop()
        raise LookupError("kept")

    assert run(returns) == "value"
    with pytest.raises(LookupError, match="kept"):
        run(raises)


class NoReaderLoop(asyncio.SelectorEventLoop):
    """A loop that cannot watch a descriptor: the timer's posting thread
    hands it the callbacks."""

    def add_reader(self, *args: Any) -> None:
        raise NotImplementedError


async def _two_callbacks_then_advance(timer: ManualTimer) -> list[float]:
    got: list[float] = []
    timer.call_later(1, lambda: got.append(timer.time()))
    timer.call_later(100, lambda: got.append(timer.time()))
    await timer.advance_async(2)
    return got


def test_advance_async_waits_for_callbacks_posted_to_a_loop_without_add_reader() -> None:
    # the posting thread may take a while to get the GIL: each callback
    # still runs at its tick, before advance_async() returns
    for _ in range(30):
        timer = ManualTimer()
        loop = NoReaderLoop()
        try:
            got = loop.run_until_complete(_two_callbacks_then_advance(timer))
        finally:
            loop.close()
        timer.stop()
        assert got == [1.0]
