"""asyncio integration: call_later delivery, timeout scopes, wait_for, sleep.

Every test runs on asyncio's own event loop, on uvloop, and on a loop that
cannot watch file descriptors (add_reader raises NotImplementedError, as on
Windows' Proactor loop), to which batches are posted.  Where Python has
asyncio.timeout with its current rules (3.11.3+; 3.11.0-3.11.2 predate some
of them), the scope tests run against it too, with the same
expectations: hwtimer.timeout is meant as a drop-in replacement.

Timing bounds only ever say "not before the deadline" and "eventually"
(seconds of slack): the machine may be busy.
"""

from __future__ import annotations

import asyncio
import contextvars
import decimal
import fractions
import gc
import math
import pickle
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Awaitable, Coroutine, Iterator
from datetime import timedelta
from typing import Any, Callable

import pytest
from conftest import (
    ASYNCIO_TIMEOUT_IS_REFERENCE,
    LOOP_KINDS,
    README,
    HasFloat,
    HasIndex,
    IntFloatsOtherwise,
    event_loop,
    give_deadline_holding_loop,
    run_python,
)

import hwtimer

HAVE_ASYNCIO_TIMEOUT = sys.version_info >= (3, 11)
# Generous upper bound for anything that should happen "soon".
SOON = 10.0


class NoReaderLoop(asyncio.SelectorEventLoop):
    """A loop that cannot watch a file descriptor, like Windows' Proactor
    loop and some custom loops."""

    def add_reader(self, *args: Any) -> None:
        raise NotImplementedError


@pytest.fixture(params=[*LOOP_KINDS, "no-reader"])
def new_loop(request: pytest.FixtureRequest) -> str | Callable[[], asyncio.AbstractEventLoop]:
    """What event_loop() makes this test's loops of."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
    return NoReaderLoop if request.param == "no-reader" else request.param


@pytest.fixture
def run(new_loop: str | Callable[[], asyncio.AbstractEventLoop]) -> Callable[..., Any]:
    """Runs a coroutine function to completion on a fresh loop, then closes it."""

    def run(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        with event_loop(new_loop) as loop:
            try:
                return loop.run_until_complete(main())
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())

    return run


@pytest.fixture
def own_timer() -> Iterator[hwtimer.HashedWheelTimer]:
    """A timer of the test's own (the shared one is never stopped)."""
    with hwtimer.HashedWheelTimer(0.005, 256) as timer:
        yield timer


def _scope_impls() -> list[Any]:
    impls = [pytest.param(hwtimer.timeout, id="hwtimer")]
    if ASYNCIO_TIMEOUT_IS_REFERENCE:
        impls.append(pytest.param(asyncio.timeout, id="asyncio"))
    return impls


@pytest.fixture(params=_scope_impls())
def timeout(request: pytest.FixtureRequest) -> Callable[[float | None], Any]:
    """hwtimer.timeout, and asyncio.timeout as the reference where it
    exists and follows the current rules (3.11.3+)."""
    return request.param


def _not_early(timeout: Any, elapsed: float, delay: float) -> bool:
    """hwtimer never fires before the deadline on time.monotonic(); the
    reference, asyncio.timeout, may on uvloop, whose clock counts whole
    milliseconds."""
    slack = 0.0 if timeout is hwtimer.timeout else 0.002
    return elapsed >= delay - slack


def _cancelling(task: asyncio.Task[Any]) -> int:
    return task.cancelling() if HAVE_ASYNCIO_TIMEOUT else 0


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()


async def _wait_until(predicate: Callable[[], bool], limit: float = SOON) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


# --- timer.call_later --------------------------------------------------------


def test_call_later_runs_on_loop_thread_not_before_deadline(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        start = time.monotonic()

        def callback(a: int, b: str) -> None:
            done.set_result((a, b, threading.get_ident(), time.monotonic()))

        handle = hwtimer.default_timer().call_later(0.03, callback, 1, "x")
        assert handle.task is callback
        assert handle.deadline >= start + 0.03
        a, b, ident, when = await asyncio.wait_for(done, SOON)
        assert (a, b) == (1, "x")
        assert ident == threading.get_ident()
        assert when >= handle.deadline
        assert when - start >= 0.03
        assert handle.is_expired() and not handle.is_cancelled()
        assert handle.cancel() is False

    run(main)


def test_a_timer_with_an_executor_runs_loop_callbacks_in_the_loop(run: Any) -> None:
    """call_later() and call_every() callbacks, and scope expiries, go to
    their loop's thread on a timer with an executor too: the executor is
    for new_timeout() and new_periodic() tasks only."""
    submitted: list[Any] = []

    class Recording:
        def submit(self, fn: Any, *args: Any) -> None:
            submitted.append(args)
            fn(*args)

    async def main() -> None:
        timer = hwtimer.HashedWheelTimer(0.005, executor=Recording())
        try:
            seen: list[tuple[str, int]] = []
            timer.call_later(0.01, lambda: seen.append(("later", threading.get_ident())))
            every = timer.call_every(
                0.01, lambda: seen.append(("every", threading.get_ident())), delay=0.01
            )
            with pytest.raises(TimeoutError):
                async with hwtimer.timeout(0.02, timer=timer):
                    await asyncio.sleep(SOON)
            await _wait_until(lambda: [k for k, _ in seen].count("every") >= 2)
            every.cancel()
            assert "later" in [k for k, _ in seen]
            assert {ident for _, ident in seen} == {threading.get_ident()}
            assert submitted == []
            ran = timer.new_timeout(lambda to: None, 0)
            await _wait_until(lambda: submitted == [(ran,)])
        finally:
            timer.stop()

    run(main)


def test_call_later_accepts_timedelta(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        start = time.monotonic()
        hwtimer.default_timer().call_later(timedelta(milliseconds=20), done.set_result, None)
        await asyncio.wait_for(done, SOON)
        assert time.monotonic() - start >= 0.02

    run(main)


def test_call_later_needs_a_loop() -> None:
    with pytest.raises(RuntimeError):
        hwtimer.default_timer().call_later(0.01, print)


def test_call_later_cancel(run: Any) -> None:
    async def main() -> None:
        called: list[int] = []
        # 0.5 s: a loaded machine once took 20 ms from call_later to cancel
        handle = hwtimer.default_timer().call_later(0.5, called.append, 1)
        assert handle.cancel() is True
        assert handle.cancel() is False
        assert handle.is_cancelled() and not handle.is_expired()
        await asyncio.sleep(0.6)  # past the deadline
        assert called == []

    run(main)


def _handed_over(timer: Any, n: int) -> None:
    """Blocks the loop's thread until `n` call_later callbacks of `timer`
    have fallen due and been handed to the loop, which has not run them."""
    end = time.monotonic() + SOON
    while timer.stats()["expired"] < n:
        assert time.monotonic() < end
        time.sleep(0.01)
    time.sleep(0.05)  # the worker's batch is in the loop's hands


def _counts(timer: Any) -> tuple[int, int, int, int]:
    """(cancelled, expired, pending, taken_back) from `timer`'s stats()."""
    stats = timer.stats()
    return stats["cancelled"], stats["expired"], stats["pending"], stats["taken_back"]


def test_call_later_cancel_after_handover_before_its_run(run: Any, own_timer: Any) -> None:
    # as asyncio's TimerHandle: cancellable until the callback starts, also
    # once the timer has handed it to the loop in this very turn
    async def main() -> None:
        called: list[int] = []
        handle = own_timer.call_later(0.02, called.append, 1)
        _handed_over(own_timer, 1)  # the loop is blocked meanwhile
        assert not handle.is_cancelled()
        assert handle.cancel() is True
        assert handle.cancel() is False
        assert handle.is_cancelled() and not handle.is_expired()
        assert _counts(own_timer) == (1, 0, 0, 1)
        await asyncio.sleep(0.2)  # the loop takes what it was handed
        assert called == []
        assert _counts(own_timer) == (1, 0, 0, 1)

    run(main)


def test_call_later_cancel_of_its_own_handle_in_its_run(run: Any, own_timer: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        handles: list[Any] = []

        def callback() -> None:
            done.set_result((handles[0].cancel(), handles[0].is_expired()))

        handles.append(own_timer.call_later(0.02, callback))
        _handed_over(own_timer, 1)
        assert await asyncio.wait_for(done, SOON) == (False, True)
        assert not handles[0].is_cancelled()
        assert _counts(own_timer) == (0, 1, 0, 0)

    run(main)


def test_call_later_reset_after_handover_moves_it(run: Any, own_timer: Any) -> None:
    # a reset before the callback starts moves it, as one before it fell due does
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        handle = own_timer.call_later(0.02, lambda: done.set_result(time.monotonic()))
        _handed_over(own_timer, 1)
        moved = time.monotonic()
        assert handle.reset(0.3) is True
        await asyncio.sleep(0.1)
        assert not done.done()
        assert own_timer.stats()["pending"] == 1
        assert await asyncio.wait_for(done, SOON) >= moved + 0.3
        assert _counts(own_timer) == (0, 1, 0, 1)  # taken back once

    run(main)


def test_call_later_reset_after_handover_keeps_max_pending(run: Any) -> None:
    """A callback handed to its loop counts as expired: a reset would make
    it pending again, which max_pending_timeouts refuses there as it would
    a new timeout.  The reset then returns False (it has expired, its
    callback about to run), changes nothing, and counts as rejected."""

    async def main() -> None:
        with hwtimer.HashedWheelTimer(0.01, 64, max_pending_timeouts=1) as timer:
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            handle = timer.call_later(0.02, lambda: done.set_result(None))
            _handed_over(timer, 1)
            other = timer.new_timeout(lambda t: None, 60)  # the one pending allowed
            assert handle.reset(0.3) is False
            assert timer.pending_timeouts() == 1
            assert timer.stats()["rejected"] == 1
            await asyncio.wait_for(done, SOON)  # it runs as handed over
            assert handle.is_expired()
            other.cancel()
            assert handle.reset(0.3) is False  # and expired it stays

    run(main)


def test_stop_returns_a_call_later_reset_after_handover(run: Any) -> None:
    # reset after its handover, it was pending again: stop() returns it,
    # and one handed over before the stop and not reset still runs
    async def main() -> None:
        called: list[int] = []
        with hwtimer.HashedWheelTimer(0.005, 256) as timer:
            moved = timer.call_later(0.02, called.append, 1)
            kept = timer.call_later(0.02, called.append, 2)
            _handed_over(timer, 2)
            assert moved.reset(60) is True
            assert timer.stop() == [moved]
            assert moved.is_cancelled() and not kept.is_cancelled()
            await asyncio.sleep(0.1)
            assert called == [2]
            assert kept.is_expired() and kept.cancel() is False
            assert _counts(timer) == (1, 1, 0, 1)

    run(main)


# A sleep()'s deadline (timer._call_later_on_stop()), handed to its loop
# and reset, so pending again, when stop() comes: stop() cancels it and
# hands it back to the loop, calling is_closed() and call_soon_threadsafe(),
# Python code.  Here is_closed() lets go of both references to it (its
# holder's and, through the sink's run, the wheel's) before stop() is done
# with the loops' lists.
_STOP_HANDS_BACK_A_DEADLINE = """
import asyncio, gc, time
import hwtimer

class Loop(asyncio.SelectorEventLoop):
    runs, on_is_closed = [], []

    def add_reader(self, fd, callback, *args):
        self.runs.append(callback)  # the timer's sink's run
        return super().add_reader(fd, callback, *args)

    def is_closed(self):
        while self.on_is_closed:
            self.on_is_closed.pop()()
        return super().is_closed()

timer = hwtimer.HashedWheelTimer(tick_duration=0.001)
loop = Loop()
held = []

async def main():
    held.append(timer._call_later_on_stop(lambda remaining: None, 0.001, print, "ran"))
    end = time.monotonic() + 30
    while timer.stats()["expired"] < 1 and time.monotonic() < end:
        time.sleep(0.005)  # the loop's thread blocked: handed over, not run
    assert held[0].reset(30) is True
    assert len(Loop.runs) == 1

    def let_go():
        held.clear()
        Loop.runs[0]()  # the sink finds it cancelled and lets it go
        gc.collect()

    Loop.on_is_closed.append(let_go)
    print("stop", timer.stop())

loop.run_until_complete(main())
loop.close()
print("done")
"""


def test_stop_survives_a_deadline_let_go_while_it_hands_it_back() -> None:
    # PYTHONMALLOC=debug fills freed memory: a read of the deadline after
    # its release crashes
    proc = run_python(_STOP_HANDS_BACK_A_DEADLINE, env={"PYTHONMALLOC": "debug"})
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert proc.stdout.split() == ["stop", "[]", "done"]


def test_call_later_cancel_lets_go_of_the_arguments(run: Any) -> None:
    # as asyncio's handle.cancel() does: a handle kept after its cancel
    # does not keep what the callback would have got
    async def main() -> None:
        payload = _Payload()
        watch = weakref.ref(payload)
        handle = hwtimer.default_timer().call_later(0.5, print, payload)
        del payload
        assert watch() is not None
        assert handle.cancel() is True
        assert watch() is None
        assert handle.task is print and handle.is_cancelled()

    run(main)


def test_call_later_order_of_same_deadline_batch(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[int] = []
        done = loop.create_future()
        timer = hwtimer.default_timer()
        for i in range(100):
            timer.call_later(0.01, seen.append, i)
        timer.call_later(0.01, lambda: done.set_result(None))
        await asyncio.wait_for(done, SOON)
        await _wait_until(lambda: len(seen) == 100)
        assert sorted(seen) == list(range(100))

    run(main)


@pytest.mark.parametrize("not_a_loop", [5, "loop", object()])
def test_what_is_no_loop_or_timer_is_a_type_error(not_a_loop: object) -> None:
    timer = hwtimer.HashedWheelTimer(0.01)

    async def main() -> None:
        for method in (timer.call_later, timer.call_every):
            with pytest.raises(TypeError, match="loop must be an asyncio event loop"):
                method(1, print, loop=not_a_loop)
        with pytest.raises(TypeError, match="timer must be a HashedWheelTimer"):
            await hwtimer.sleep(0.01, timer=not_a_loop)
        # also where no deadline is needed: a delay or timeout <= 0
        for delay in (0, -1):
            with pytest.raises(TypeError, match="timer must be a HashedWheelTimer"):
                await hwtimer.sleep(delay, timer=not_a_loop)
            fut = asyncio.get_running_loop().create_future()
            with pytest.raises(TypeError, match="timer must be a HashedWheelTimer"):
                await hwtimer.wait_for(fut, delay, timer=not_a_loop)
            assert not fut.done()  # refused before anything was cancelled

    try:
        asyncio.run(main())
        assert timer.stats()["scheduled"] == 0
    finally:
        timer.stop()


def test_call_later_context(run: Any) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        timer = hwtimer.default_timer()
        seen = loop.create_future()
        explicit = loop.create_future()

        def callback(fut: asyncio.Future[str]) -> None:
            fut.set_result(var.get())
            var.set("changed by callback")

        var.set("captured")
        timer.call_later(0.01, callback, seen)
        var.set("later")  # the copy was taken at call_later
        other = contextvars.Context()
        other.run(var.set, "explicit")
        timer.call_later(0.01, callback, explicit, context=other)
        assert await asyncio.wait_for(seen, SOON) == "captured"
        assert await asyncio.wait_for(explicit, SOON) == "explicit"
        # The callback ran in its own copy: nothing leaks back.
        assert var.get() == "later"
        assert other[var] == "changed by callback"

    run(main)


def test_call_later_exception_goes_to_loop_handler(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        reported = loop.create_future()
        ran_after = loop.create_future()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if not reported.done():
                reported.set_result(context)

        def boom() -> None:
            raise ZeroDivisionError("boom")

        loop.set_exception_handler(handler)
        timer = hwtimer.default_timer()
        timer.call_later(0.01, boom)
        timer.call_later(0.01, ran_after.set_result, True)
        context = await asyncio.wait_for(reported, SOON)
        assert isinstance(context["exception"], ZeroDivisionError)
        # One failing callback does not stop the rest of its batch.
        assert await asyncio.wait_for(ran_after, SOON) is True

    run(main)


class UnshowableCallback:
    def __call__(self) -> None:
        raise ZeroDivisionError("unshowable callback failed")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_call_later_exception_of_a_callback_whose_repr_raises_goes_to_loop_handler(
    run: Any,
) -> None:
    # The handler gets the callback's own error, and a message naming the
    # callback as object.__repr__ would: not the repr's error instead.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        reported = loop.create_future()
        loop.set_exception_handler(lambda loop, context: reported.set_result(context))
        callback = UnshowableCallback()
        hwtimer.default_timer().call_later(0.01, callback)
        context = await asyncio.wait_for(reported, SOON)
        assert isinstance(context["exception"], ZeroDivisionError)
        shown = object.__repr__(callback)[:-1] + " (repr() raised RuntimeError)>"
        assert shown in context["message"]  # with its module and qualified name

    run(main)


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("source", ["asyncio", "hwtimer"])
def test_exception_handler_raising_keyboard_interrupt_stops_the_loop(
    new_loop: Any, source: str, exc_type: type[BaseException]
) -> None:
    # An exception handler that raises KeyboardInterrupt or SystemExit for
    # a failed callback stops the loop with it, as asyncio's own
    # loop.call_later() callbacks do: it is not swallowed.
    timer = hwtimer.HashedWheelTimer(0.005, 64)
    handled: list[BaseException] = []

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        handled.append(context["exception"])
        raise exc_type

    def fail() -> None:
        raise ValueError("boom")

    try:
        with event_loop(new_loop) as loop:
            loop.set_exception_handler(handler)
            if source == "asyncio":
                loop.call_later(0.01, fail)
            else:
                timer.call_later(0.01, fail, loop=loop)
            guard = loop.call_later(SOON, loop.stop)
            with pytest.raises(exc_type) as raised:
                loop.run_forever()
            guard.cancel()
            # a loop without readers: its posting thread may still be in
            # call_soon_threadsafe()'s write to the loop's self-pipe, which
            # closing the loop races (as with any thread's): read it first
            loop.run_until_complete(asyncio.sleep(0.05))
    finally:
        timer.stop()
    assert [type(exc) for exc in handled] == [ValueError]
    assert isinstance(raised.value.__context__, ValueError)


def test_call_later_from_other_thread(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        errors: list[BaseException] = []

        def callback() -> None:
            done.set_result(threading.get_ident())

        def schedule() -> None:
            try:
                hwtimer.default_timer().call_later(0.01, callback, loop=loop)
            except BaseException as exc:  # reported below, in the loop thread
                errors.append(exc)

        thread = threading.Thread(target=schedule)
        thread.start()
        thread.join()
        assert errors == []
        assert await asyncio.wait_for(done, SOON) == threading.get_ident()
        assert thread.ident != threading.get_ident()

    run(main)


def test_call_later_cancel_from_other_thread(run: Any) -> None:
    async def main() -> None:
        called: list[int] = []
        handle = hwtimer.default_timer().call_later(0.2, called.append, 1)
        results: list[bool] = []
        thread = threading.Thread(target=lambda: results.append(handle.cancel()))
        thread.start()
        thread.join()
        assert results == [True]
        assert handle.is_cancelled()
        await asyncio.sleep(0.4)
        assert called == []

    run(main)


def test_many_threads_schedule_onto_one_loop(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        idents: list[int] = []
        all_done = loop.create_future()
        total = 4 * 500

        def callback() -> None:
            idents.append(threading.get_ident())
            if len(idents) == total:
                all_done.set_result(None)

        def schedule() -> None:
            timer = hwtimer.default_timer()
            for i in range(500):
                timer.call_later((i % 10) / 1000, callback, loop=loop)

        threads = [threading.Thread(target=schedule) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        await asyncio.wait_for(all_done, SOON)
        assert set(idents) == {threading.get_ident()}

    run(main)


def test_call_later_on_own_timer(run: Any, own_timer: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        handle = own_timer.call_later(0.02, done.set_result, "own")
        assert handle.timer is own_timer
        assert await asyncio.wait_for(done, SOON) == "own"

    run(main)


def test_first_call_later_on_a_loop_does_not_keep_its_context(run: Any) -> None:
    """The first call_later() for a loop sets up the loop's watch of the
    timer; the loop must not keep the caller's contextvars context for
    that, or whatever the first request set there would live as long as
    the loop.  From the loop's thread and from another."""
    var: contextvars.ContextVar[object] = contextvars.ContextVar("var")
    watch: list[weakref.ref[Any]] = []

    def first_call(timer: hwtimer.HashedWheelTimer, loop: asyncio.AbstractEventLoop) -> None:
        payload = _Payload()
        watch.append(weakref.ref(payload))
        var.set(payload)
        timer.call_later(0.01, lambda: None, loop=loop)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        here = hwtimer.HashedWheelTimer(0.005, 64)
        there = hwtimer.HashedWheelTimer(0.005, 64)
        try:
            contextvars.copy_context().run(first_call, here, loop)
            thread = threading.Thread(target=first_call, args=(there, loop))
            thread.start()
            thread.join()
            await asyncio.sleep(0.1)  # both callbacks have run
            gc.collect()
            assert [ref() for ref in watch] == [None, None]
        finally:
            here.stop()
            there.stop()

    run(main)


class _Payload:
    """Something a weak reference can watch."""


def _wait_released(watch: weakref.ref[Any], what: str) -> None:
    deadline = time.monotonic() + SOON
    gc.collect()
    while watch() is not None:
        assert time.monotonic() < deadline, f"{what} not released"
        time.sleep(0.02)
        gc.collect()


def test_closed_and_collected_loop_drops_pending_callbacks(new_loop: Any) -> None:
    # Callbacks still pending for a loop that is closed and collected are
    # never run, and what they hold is released.
    timer = hwtimer.default_timer()
    called: list[object] = []
    payload = _Payload()
    watch = weakref.ref(payload)

    async def schedule(payload: _Payload) -> None:
        for _ in range(10):
            timer.call_later(0.05, called.append, payload)
        timer.call_later(0.3, called.append, payload)

    with event_loop(new_loop) as loop:
        loop.run_until_complete(schedule(payload))
    loop_watch = weakref.ref(loop)
    del loop, payload
    _wait_released(loop_watch, "the closed loop")
    _wait_released(watch, "the callbacks' arguments")
    assert called == []


def test_collected_loop_releases_far_callbacks_at_once(new_loop: Any) -> None:
    # A callback an hour away for a loop that is closed and collected does
    # not keep what it holds for that hour: it is cancelled with its loop.
    timer = hwtimer.HashedWheelTimer(0.01, 64)
    try:
        payload = _Payload()
        watch = weakref.ref(payload)

        async def schedule(payload: _Payload) -> hwtimer.Timeout:
            return timer.call_later(3600, print, payload)

        with event_loop(new_loop) as loop:
            handle = loop.run_until_complete(schedule(payload))
        loop_watch = weakref.ref(loop)
        del loop, payload
        _wait_released(loop_watch, "the closed loop")
        assert handle.is_cancelled()
        del handle
        _wait_released(watch, "the callback's argument")
        assert timer.pending_timeouts() == 0
    finally:
        timer.stop()


def test_closed_loop_never_runs_callbacks(new_loop: Any) -> None:
    # Callbacks that fall due while their loop is closed (but still
    # referenced) do not run; once the loop is gone, they are released.
    timer = hwtimer.default_timer()
    called: list[object] = []
    payload = _Payload()
    watch = weakref.ref(payload)

    async def schedule(payload: _Payload) -> None:
        for _ in range(10):
            timer.call_later(0.02, called.append, payload)

    with event_loop(new_loop) as loop:
        loop.run_until_complete(schedule(payload))
    del payload
    time.sleep(0.2)
    assert called == []
    del loop
    _wait_released(watch, "the callbacks' arguments")
    assert called == []


@pytest.mark.parametrize("far", [False, True], ids=["alone", "with-a-far-callback"])
@pytest.mark.parametrize("what", ["call_later", "sleep", "timeout"])
def test_a_loop_left_unclosed_is_collected_with_the_deadlines_it_got(
    own_timer: hwtimer.HashedWheelTimer, what: str, far: bool
) -> None:
    # A loop whose thread ends without closing it is collected as asyncio
    # collects it, also when deadlines that hold it fell due there after
    # its last run: delivered, they are its own, as its ready handles are.
    # (uvloop never collects a loop left unclosed, whatever it holds.)
    # Also with another callback of the loop's still an hour away that
    # holds nothing of it: that one keeps what it holds until it falls due,
    # not the deadlines handed to the loop, and so not the loop they hold
    # (asyncio collects such a loop with its own far TimerHandle); it is
    # cancelled with the loop.
    def abandon() -> weakref.ref[asyncio.AbstractEventLoop]:
        loop = asyncio.new_event_loop()
        if far:
            own_timer.call_later(3600, print, "far", loop=loop)
        give_deadline_holding_loop(loop, own_timer, what)
        return weakref.ref(loop)

    done: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    thread = threading.Thread(target=lambda: done.append(abandon()))
    thread.start()
    thread.join()
    deadline = time.monotonic() + SOON
    while own_timer.pending_timeouts() > far:
        assert time.monotonic() < deadline, "the deadline never fell due"
        time.sleep(0.02)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # unclosed loop
        _wait_released(done[0], "the unclosed loop")
    deadline = time.monotonic() + SOON
    while own_timer.pending_timeouts():  # cancelled with its loop
        assert time.monotonic() < deadline, "the far callback stayed pending"
        time.sleep(0.02)


@pytest.mark.parametrize("kind", LOOP_KINDS)
def test_closing_a_loop_cancels_callbacks_that_hold_it(kind: str) -> None:
    # A pending callback that holds its own loop (a bound method of a
    # protocol, a future of the loop) would keep the closed loop from ever
    # being collected: the loop lets go of the wake fd's reader when it is
    # closed, and that alone cancels its callbacks, as closing a loop drops
    # its own call_later() handles.
    timer = hwtimer.HashedWheelTimer(0.01, 64)
    try:

        async def schedule() -> hwtimer.Timeout:
            fut = asyncio.get_running_loop().create_future()
            return timer.call_later(3600, fut.set_result, None)

        with event_loop(kind) as loop:
            handle = loop.run_until_complete(schedule())
            assert not handle.is_cancelled()
        assert handle.is_cancelled()
        loop_watch = weakref.ref(loop)
        del loop, handle
        _wait_released(loop_watch, "the closed loop")
        assert timer.pending_timeouts() == 0
    finally:
        timer.stop()


def test_closing_a_loop_that_never_ran_cancels_its_callbacks(new_loop: Any) -> None:
    # call_later(loop=) for a loop that is not running yet has the loop
    # start watching when it first runs.  Closed without ever running, it
    # never watches, and never lets go of a reader: closing it must still
    # cancel its callbacks, or one that holds the loop keeps it, and what
    # it holds, until its deadline.
    timer = hwtimer.HashedWheelTimer(0.01, 64)
    try:
        with event_loop(new_loop) as loop:
            payload = _Payload()
            watch = weakref.ref(payload)
            handle = timer.call_later(3600, print, payload, loop=loop)
            held = timer.call_later(3600, print, loop, loop=loop)
            del payload
        assert handle.is_cancelled() and held.is_cancelled()
        del handle, held
        _wait_released(watch, "the callback's argument")
        loop_watch = weakref.ref(loop)
        del loop
        _wait_released(loop_watch, "the closed loop")
        assert timer.pending_timeouts() == 0
    finally:
        timer.stop()


class _FalseLike:
    """A false value that is not False, as a numpy bool is."""

    def __bool__(self) -> bool:
        return False


class _OddClosedLoop(asyncio.SelectorEventLoop):
    """A loop whose is_closed() answers as a third-party loop may: true when
    closed, and while open with `open_answer`, a false value that may not
    be False; or, once `fail` is set, with an error."""

    open_answer: object = False
    fail = False

    def is_closed(self) -> Any:
        if self.fail:
            self.fail = False
            raise ValueError("is_closed() failed")
        return super().is_closed() or self.open_answer


_OPEN_ANSWERS = [
    pytest.param(0, id="0"),
    pytest.param(None, id="None"),
    pytest.param(_FalseLike(), id="false-like"),
    pytest.param(ValueError, id="raises"),
]


def _odd_loop(answer: object) -> _OddClosedLoop:
    """A loop answering `answer`; for ValueError, the test sets `fail` once
    it has scheduled its work (call_later() asks is_closed() too)."""
    loop = _OddClosedLoop()
    if answer is not ValueError:
        loop.open_answer = answer
    return loop


def _run_on_odd_loop(
    answer: object,
    monkeypatch: pytest.MonkeyPatch,
    main: Callable[[_OddClosedLoop, hwtimer.HashedWheelTimer], Awaitable[str]],
) -> str:
    """Runs main(loop, timer) on a loop answering `answer` and a timer of
    its own, and returns what it returns.  Only an is_closed() that raises
    is reported to sys.unraisablehook, as that ValueError."""
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    timer = hwtimer.HashedWheelTimer(0.005, 64)
    loop = _odd_loop(answer)
    try:
        result = loop.run_until_complete(main(loop, timer))
    finally:
        loop.close()
        timer.stop()
    errors = [type(u.exc_value) for u in unraisable]
    assert errors == ([ValueError] if answer is ValueError else [])
    return result


@pytest.mark.parametrize("answer", _OPEN_ANSWERS)
def test_loop_open_by_the_truth_of_is_closed(
    answer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loop is closed when is_closed() is true, as asyncio asks: one that
    # answers 0, None or another false value is open, and keeps its
    # callbacks when another loop first uses the timer (which looks for
    # closed loops).  One whose is_closed() raises keeps them too, and the
    # error is reported, not taken for a close.
    async def main(loop: _OddClosedLoop, timer: hwtimer.HashedWheelTimer) -> str:
        done = loop.create_future()
        handle = timer.call_later(0.05, done.set_result, "ran")
        loop.fail = answer is ValueError
        with event_loop() as other:
            timer.call_later(3600, print, loop=other)
        assert not handle.is_cancelled()
        return await asyncio.wait_for(done, SOON)

    assert _run_on_odd_loop(answer, monkeypatch, main) == "ran"


@pytest.mark.parametrize("answer", _OPEN_ANSWERS)
def test_sleep_outlives_its_timers_stop_by_the_truth_of_is_closed(
    answer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stop() hands a pending sleep() to its loop unless the loop is closed:
    # is_closed() false, whatever false value it is, means open.  One that
    # raises is reported, and the sleep still ends.
    async def main(loop: _OddClosedLoop, timer: hwtimer.HashedWheelTimer) -> str:
        task = asyncio.ensure_future(hwtimer.sleep(0.2, "woke", timer=timer))
        await asyncio.sleep(0)  # its deadline is on the wheel
        loop.fail = answer is ValueError
        assert timer.stop() == []
        return await asyncio.wait_for(task, SOON)

    assert _run_on_odd_loop(answer, monkeypatch, main) == "woke"


def test_loop_not_running_then_resumed(new_loop: Any) -> None:
    # Callbacks that fall due between two run_until_complete calls run when
    # the loop runs again.
    timer = hwtimer.default_timer()
    seen: list[int] = []

    async def schedule() -> None:
        timer.call_later(0.01, seen.append, 1)

    async def wait() -> None:
        await _wait_until(lambda: seen == [1])

    with event_loop(new_loop) as loop:
        loop.run_until_complete(schedule())
        time.sleep(0.1)
        loop.run_until_complete(wait())


def test_ten_thousand_call_laters(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        timer = hwtimer.default_timer()
        count = 10_000
        fired: list[int] = []
        all_fired = loop.create_future()
        start = time.monotonic()

        def callback(i: int) -> None:
            fired.append(i)
            if len(fired) == count // 2:
                all_fired.set_result(time.monotonic())

        for i in range(count):
            handle = timer.call_later(0.1 + (i % 50) / 1000, callback, i)
            if i % 2:
                assert handle.cancel()
        end = await asyncio.wait_for(all_fired, 60)
        assert end - start >= 0.1
        await asyncio.sleep(0.1)
        assert sorted(fired) == list(range(0, count, 2))

    run(main)


# --- timeout() / timeout_at() -------------------------------------------------


def test_timeout_expires(run: Any, timeout: Any) -> None:
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        start = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            async with timeout(0.05) as cm:
                await asyncio.sleep(SOON)
        elapsed = time.monotonic() - start
        assert _not_early(timeout, elapsed, 0.05)
        assert elapsed < SOON
        assert cm.expired()
        assert isinstance(info.value.__cause__, asyncio.CancelledError)
        assert _cancelling(task) == 0
        # The task is not left with a pending cancellation.
        await asyncio.sleep(0.01)

    run(main)


def test_timeout_error_types(run: Any) -> None:
    async def main() -> None:
        for catch in (TimeoutError, asyncio.TimeoutError):
            with pytest.raises(catch):
                async with hwtimer.timeout(0.01):
                    await _forever()

    run(main)


def test_timeout_error_pickles(run: Any) -> None:
    # It crosses processes (multiprocessing, ProcessPoolExecutor) as the
    # builtin TimeoutError does: pickle finds its class, also before 3.11.
    async def main() -> BaseException:
        with pytest.raises(TimeoutError) as info:
            async with hwtimer.timeout(0.01):
                await _forever()
        return info.value

    error = pickle.loads(pickle.dumps(run(main)))
    assert isinstance(error, TimeoutError)
    assert isinstance(error, asyncio.TimeoutError)


def test_timeout_not_reached(run: Any, timeout: Any) -> None:
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        async with timeout(SOON) as cm:
            await asyncio.sleep(0.01)
            result = 42
        assert result == 42
        assert not cm.expired()
        assert _cancelling(task) == 0
        # The deadline is gone with the scope: nothing cancels us later.
        await asyncio.sleep(0.05)

    run(main)


def test_timeout_none_and_when(run: Any, timeout: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with timeout(None) as cm:
            assert cm.when() is None
            await asyncio.sleep(0.01)
        assert not cm.expired()
        before = loop.time()
        cm = timeout(1.5)
        after = loop.time()
        when = cm.when()
        assert when is not None and before + 1.5 <= when <= after + 1.5

    run(main)


def test_timeout_zero_and_negative(run: Any, timeout: Any) -> None:
    async def main() -> None:
        for delay in (0, -1):
            with pytest.raises(TimeoutError):
                async with timeout(delay) as cm:
                    await asyncio.sleep(SOON)
            assert cm.expired()

    run(main)


def test_timeout_body_without_await_completes(run: Any, timeout: Any) -> None:
    # A due deadline only acts at the next suspension point.
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        async with timeout(0) as cm:
            pass
        assert not cm.expired()
        assert _cancelling(task) == 0
        await asyncio.sleep(0.01)

    run(main)


def test_timeout_at(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        when = loop.time() + 0.05
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout_at(when) as cm:
                assert cm.when() == when
                await _forever()
        # `when` is on loop.time(): uvloop's is libuv's millisecond clock,
        # read at the start of the loop's iteration, up to 1 ms behind
        assert time.monotonic() - start >= 0.05 - 0.001
        assert cm.expired()

    run(main)


def test_an_int_subclass_deadline_is_its_int_value(run: Any, timeout: Any) -> None:
    # As for a delay on the timer, whatever its __float__ says.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        before = loop.time()
        when = timeout(IntFloatsOtherwise(2)).when()
        assert when is not None and before + 2 <= when <= loop.time() + 2
        past = IntFloatsOtherwise(int(loop.time()))
        timeout_at = hwtimer.timeout_at if timeout is hwtimer.timeout else asyncio.timeout_at
        with pytest.raises(TimeoutError):
            async with timeout_at(past):
                await asyncio.sleep(5)
        with pytest.raises(TimeoutError):
            async with timeout(None) as cm:
                cm.reschedule(past)
                await asyncio.sleep(5)

    run(main)


def test_timeout_timedelta_and_own_timer(run: Any, own_timer: Any) -> None:
    async def main() -> None:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout(timedelta(milliseconds=30), timer=own_timer):
                await _forever()
        assert time.monotonic() - start >= 0.03

    run(main)


def test_reschedule_later_earlier_and_off(run: Any, timeout: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        # Later: the first deadline passes without effect.
        with pytest.raises(TimeoutError):
            async with timeout(0.02) as cm:
                when = loop.time() + 0.1
                cm.reschedule(when)
                await _forever()
        # Measured from `when`: uvloop's time() counts whole milliseconds
        # and reschedule() reads it again, a millisecond on at times.
        assert _not_early(timeout, time.monotonic() - when, 0)
        # Earlier.
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            async with timeout(SOON) as cm:
                cm.reschedule(loop.time() + 0.02)
                await _forever()
        assert time.monotonic() - start < SOON
        # Into the past: due at the next iteration.
        with pytest.raises(TimeoutError):
            async with timeout(SOON) as cm:
                cm.reschedule(loop.time() - 1)
                await _forever()
        # Off.
        async with timeout(0.02) as cm:
            cm.reschedule(None)
            assert cm.when() is None
            await asyncio.sleep(0.1)
        assert not cm.expired()
        # From None to a deadline.
        with pytest.raises(TimeoutError):
            async with timeout(None) as cm:
                cm.reschedule(loop.time() + 0.02)
                await _forever()

    run(main)


def test_reschedule_takes_when_by_keyword(run: Any, timeout: Any) -> None:
    # asyncio's Timeout.reschedule(when) takes its argument by name too:
    # code written against it, cm.reschedule(when=...), must run unchanged.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with timeout(SOON) as cm:
                cm.reschedule(when=loop.time() + 0.02)
                await _forever()
        async with timeout(0.02) as cm:
            cm.reschedule(when=None)
            assert cm.when() is None
            await asyncio.sleep(0.05)
        assert not cm.expired()

    run(main)


def test_reschedule_many_times(run: Any) -> None:
    # Each reschedule replaces the deadline; none of the earlier ones fires.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with hwtimer.timeout(0.01) as cm:
            for i in range(50):
                cm.reschedule(loop.time() + SOON + i / 100)
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)  # well past the first deadline
            cm.reschedule(None)
            await asyncio.sleep(0.01)
        assert not cm.expired()

    run(main)


def test_reschedule_from_another_thread_is_refused(run: Any, timeout: Any) -> None:
    """A deadline is set from the thread of the scope's running loop, as
    asyncio.timeout()'s reschedule() requires ("no running event loop"
    elsewhere): one due already goes to the loop's call_soon(), which
    another thread's call does not wake, so the block would run on long
    past it.  Refused, the scope keeps its deadline and expires then
    (asyncio's drops its deadline before it refuses)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[BaseException] = []

        def other_thread(cm: Any, when: float) -> None:
            try:
                cm.reschedule(when)
            except BaseException as exc:
                errors.append(exc)

        start = time.monotonic()
        try:
            async with timeout(0.3) as cm:
                when = cm.when()
                for new in (loop.time() - 1, loop.time() + 0.05):
                    thread = threading.Thread(target=other_thread, args=(cm, new))
                    thread.start()
                    await loop.run_in_executor(None, thread.join)
                assert [type(exc) for exc in errors] == [RuntimeError, RuntimeError], errors
                if timeout is not hwtimer.timeout:
                    return
                assert cm.when() == when
                await asyncio.sleep(SOON)
        except TimeoutError:
            assert time.monotonic() - start >= 0.3
        else:
            pytest.fail("the scope did not expire")

    run(main)


def test_reschedule_outside_the_block(run: Any, timeout: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        cm = timeout(1)
        with pytest.raises(RuntimeError):
            cm.reschedule(loop.time() + 1)
        async with cm:
            pass
        with pytest.raises(RuntimeError):
            cm.reschedule(loop.time() + 1)
        with pytest.raises(TimeoutError):
            async with timeout(0) as cm:
                await _forever()
        with pytest.raises(RuntimeError):
            cm.reschedule(None)

    run(main)


def test_enter_twice(run: Any, timeout: Any) -> None:
    async def main() -> None:
        cm = timeout(1)
        async with cm:
            pass
        with pytest.raises(RuntimeError):
            async with cm:
                pass

    run(main)


def test_made_in_one_loop_entered_in_another(run: Any, timeout: Any) -> None:
    # the scope belongs to the task that enters it, as asyncio's does: not
    # to whatever runs, or does not, on the loop it was made in
    async def make() -> Any:
        return timeout(0.05)

    cm = run(make)

    async def enter() -> str:
        try:
            async with cm:
                await asyncio.sleep(SOON)
        except TimeoutError:
            return "timed out"
        return "not timed out"

    assert run(enter) == "timed out"


def test_enter_outside_a_task() -> None:
    cm = hwtimer.timeout_at(None)
    with pytest.raises(RuntimeError):
        cm.__aenter__().send(None)  # raised by either call


def test_timeout_needs_running_loop() -> None:
    with pytest.raises(RuntimeError):
        hwtimer.timeout(1)


def test_repr(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        cm = hwtimer.timeout_at(None)
        assert "created" in repr(cm)
        async with cm:
            cm.reschedule(loop.time() + 100)
            assert "active" in repr(cm) and "when=" in repr(cm)
        assert "finished" in repr(cm)
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout(0) as cm:
                await _forever()
        assert "expired" in repr(cm)

    run(main)


def test_nested_inner_expires(run: Any, timeout: Any) -> None:
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        async with timeout(SOON) as outer:
            with pytest.raises(TimeoutError):
                async with timeout(0.02) as inner:
                    await _forever()
            await asyncio.sleep(0.01)  # the outer scope goes on
        assert inner.expired()
        assert not outer.expired()
        assert _cancelling(task) == 0

    run(main)


def test_nested_outer_expires(run: Any, timeout: Any) -> None:
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        reached_after_inner = False
        with pytest.raises(TimeoutError):
            async with timeout(0.02) as outer:
                try:
                    async with timeout(SOON) as inner:
                        await _forever()
                finally:
                    reached_after_inner = True
        assert reached_after_inner
        assert outer.expired()
        assert not inner.expired()
        assert _cancelling(task) == 0

    run(main)


def test_nested_same_deadline_outer_reports(run: Any, timeout: Any) -> None:
    # Both expire at once: the inner scope lets the cancellation through
    # (another request is pending), and the outer one raises TimeoutError.
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        when = loop.time() - 1
        inner_saw: list[type] = []
        with pytest.raises(TimeoutError):
            async with timeout(SOON) as outer:
                outer.reschedule(when)
                try:
                    async with timeout(SOON) as inner:
                        inner.reschedule(when)
                        await _forever()
                except BaseException as exc:
                    inner_saw.append(type(exc))
                    raise
        assert inner_saw == [asyncio.CancelledError]
        assert inner.expired() and outer.expired()
        assert _cancelling(task) == 0

    run(main)


def test_nested_equal_deadlines_on_a_new_timer_expire_together(run: Any) -> None:
    """An inner scope at the outer one's deadline (timeout_at(outer.when()))
    expires with it, as in asyncio: the outer one raises TimeoutError and
    nothing after the inner block runs, also when the outer one is the
    first deadline of its timer, which that first schedule starts.  The
    start (threads, the loop's sink) once came between the delay's reading
    and the schedule, and put the outer deadline a tick late: 9 rounds in
    10 went wrong.  The deadlines are read a few microseconds apart still,
    so a deadline that close to a tick's end may fall on either side: a
    round or so in many can go wrong."""

    async def nested(timer: hwtimer.HashedWheelTimer) -> list[str]:
        seen: list[str] = []
        try:
            async with hwtimer.timeout(0.02, timer=timer) as outer:
                try:
                    async with hwtimer.timeout_at(outer.when(), timer=timer):
                        await _forever()
                except TimeoutError:
                    seen.append("inner")
                seen.append("after inner")
                await _forever()
        except TimeoutError:
            seen.append("outer")
        return seen

    async def main() -> int:
        wrong = 0
        for _ in range(20):
            with hwtimer.HashedWheelTimer(0.001) as timer:
                wrong += await nested(timer) != ["outer"]
        return wrong

    assert run(main) <= 3


def test_nested_deep(run: Any) -> None:
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        caught_at: list[int] = []

        async def level(n: int) -> None:
            if n == 0:
                await _forever()
                return
            try:
                async with hwtimer.timeout(0.03 if n == 5 else SOON):
                    await level(n - 1)
            except TimeoutError:
                caught_at.append(n)

        await level(10)
        assert caught_at == [5]
        assert _cancelling(task) == 0

    run(main)


def test_outside_cancel_during_scope(run: Any, timeout: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        entered = loop.create_future()
        scopes: list[Any] = []

        async def body() -> None:
            async with timeout(SOON) as cm:
                scopes.append(cm)
                entered.set_result(None)
                await _forever()

        task = asyncio.ensure_future(body())
        await entered
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert not scopes[0].expired()

    run(main)


def test_outside_cancel_before_expiry_wins(run: Any, timeout: Any) -> None:
    # A cancel() that is pending when the deadline passes is not turned into
    # TimeoutError: the task was cancelled, and stays cancelled.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        scopes: list[Any] = []

        async def body() -> None:
            task = asyncio.current_task()
            assert task is not None
            loop.call_soon(task.cancel)  # runs before the scope's expiry
            async with timeout(0) as cm:
                scopes.append(cm)
                await _forever()

        task = asyncio.ensure_future(body())
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert scopes[0].expired()

    run(main)


@pytest.mark.skipif(
    not HAVE_ASYNCIO_TIMEOUT,
    reason="before 3.11 a cancel() after the expiry in the same loop iteration is not visible",
)
def test_outside_cancel_after_expiry_same_iteration_wins(run: Any, timeout: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def body() -> None:
            task = asyncio.current_task()
            assert task is not None
            async with timeout(0):
                loop.call_soon(task.cancel)  # runs after the scope's expiry
                await _forever()

        task = asyncio.ensure_future(body())
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    run(main)


@pytest.mark.parametrize("awaits", ["gather", "task"])
def test_outside_cancel_before_expiry_while_awaiting_a_task_wins(
    run: Any, timeout: Any, awaits: str
) -> None:
    # The cancel() reaches the task while it awaits a gather() (or another
    # task) that takes its time to finish cancelling; the deadline passes
    # meanwhile.  The task was cancelled first: CancelledError, not
    # TimeoutError.
    async def main() -> None:
        started: list[None] = []

        async def child() -> None:
            try:
                started.append(None)
                await _forever()
            finally:
                await asyncio.sleep(0.3)  # a slow clean-up

        async def body() -> None:
            async with timeout(0.15):
                if awaits == "task":
                    await asyncio.ensure_future(child())
                else:
                    await asyncio.gather(child(), child())

        task = asyncio.ensure_future(body())
        await _wait_until(lambda: len(started) == (1 if awaits == "task" else 2))
        task.cancel()  # long before the deadline
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    run(main)


def test_outside_cancel_swallowed_then_timeout(run: Any) -> None:
    # A task that catches an outside cancellation (and, on 3.11+, uncancels
    # as it should) still gets TimeoutError from a later scope.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        entered = loop.create_future()

        async def body() -> str:
            try:
                entered.set_result(None)
                await _forever()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if HAVE_ASYNCIO_TIMEOUT and task is not None:
                    task.uncancel()
            try:
                async with hwtimer.timeout(0.02):
                    await _forever()
            except TimeoutError:
                return "timed out"
            return "not timed out"

        task = asyncio.ensure_future(body())
        await entered
        task.cancel()
        assert await task == "timed out"

    run(main)


def test_cancel_swallowed_inside_an_inner_scope_then_outer_timeout(run: Any) -> None:
    # A cancel() that is pending when an inner scope is entered, and that
    # the task then swallows (uncancelling it on 3.11+, where it can), does
    # not stay counted: the outer scope's deadline still gives TimeoutError,
    # as it does when no inner scope saw the cancel.
    async def body(inner: bool) -> str:
        task = asyncio.current_task()
        assert task is not None
        try:
            async with hwtimer.timeout(0.1):
                task.cancel()
                try:
                    if inner:
                        async with hwtimer.timeout(SOON):
                            await _forever()
                    else:
                        await _forever()
                except asyncio.CancelledError:
                    if HAVE_ASYNCIO_TIMEOUT:
                        task.uncancel()
                await _forever()
        except TimeoutError:
            return "TimeoutError"
        return "no error"

    async def main() -> None:
        assert await asyncio.ensure_future(body(False)) == "TimeoutError"
        assert await asyncio.ensure_future(body(True)) == "TimeoutError"

    run(main)


@pytest.mark.skipif(
    not HAVE_ASYNCIO_TIMEOUT,
    reason="before 3.11 a cancel() after the body took the scope's cancellation is not visible",
)
@pytest.mark.parametrize("awaits", ["future", "task"])
def test_outside_cancel_after_the_expiry_was_swallowed_wins(
    run: Any, timeout: Any, awaits: str
) -> None:
    # The deadline passed and the body swallowed its cancellation and goes
    # on inside the scope.  A cancel() from outside that comes then stays a
    # CancelledError, also when it reaches the body through a task it
    # awaits.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        swallowed = loop.create_future()

        async def body() -> None:
            async with timeout(0.02):
                try:
                    await _forever()
                except asyncio.CancelledError:
                    swallowed.set_result(None)
                if awaits == "task":
                    await asyncio.ensure_future(_forever())
                else:
                    await _forever()

        task = asyncio.ensure_future(body())
        await swallowed
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    run(main)


def test_expiry_while_a_condition_takes_its_lock_back_is_a_timeout(run: Any, timeout: Any) -> None:
    # The deadline passes while Condition.wait(), notified, waits to take
    # its lock back: wait() takes the scope's cancellation, takes the lock,
    # then raises a CancelledError of its own (on 3.9 and 3.10, one with
    # no trace of the scope's).  It is the scope's: TimeoutError, and the
    # task goes on.
    async def main() -> str:
        cond = asyncio.Condition()
        entered = asyncio.get_running_loop().create_future()

        async def waiter() -> str:
            async with cond:
                try:
                    async with timeout(0.1):
                        entered.set_result(None)
                        await cond.wait()
                except TimeoutError:
                    return "timed out"
                return "not timed out"

        task = asyncio.ensure_future(waiter())
        await entered
        async with cond:
            cond.notify()
            await asyncio.sleep(0.3)  # holds the lock past the deadline
        return await task

    assert run(main) == "timed out"


@pytest.mark.parametrize("handling", ["cancel", "timeout"])
def test_expiry_of_a_scope_entered_while_handling_a_cancellation_is_a_timeout(
    run: Any, timeout: Any, handling: str
) -> None:
    # Cleanup under a deadline, in the handler of a cancellation the task
    # has taken (a cancel() from outside, or an earlier scope's expiry):
    # the scope's own expiry is a TimeoutError.  The cancellation being
    # handled is in its CancelledError's context, and came before the
    # scope was entered: it is no cancel() made since.
    async def main() -> str:
        async def body() -> str:
            try:
                if handling == "cancel":
                    task.cancel()
                    await _forever()
                else:
                    async with timeout(0.01):
                        await _forever()
            except (asyncio.CancelledError, TimeoutError):
                try:
                    async with timeout(0.02) as cm:
                        await _forever()
                except TimeoutError:
                    return f"timed out, expired: {cm.expired()}"
                except asyncio.CancelledError:
                    return "cancelled"
            return "not cancelled"

        task = asyncio.ensure_future(body())
        return await task

    assert run(main) == "timed out, expired: True"


@pytest.mark.parametrize("awaits", ["task", "gather", "task-of-task"])
def test_expiry_through_awaited_tasks_is_a_timeout(run: Any, timeout: Any, awaits: str) -> None:
    # The scope's cancellation reaches the body through the tasks (or the
    # gather()) it awaits, each raising a CancelledError of its own: still
    # the scope's, and TimeoutError.
    async def main() -> None:
        async def nested() -> None:
            await asyncio.ensure_future(_forever())

        async def body() -> None:
            async with timeout(0.02):
                if awaits == "task":
                    await asyncio.ensure_future(_forever())
                elif awaits == "gather":
                    await asyncio.gather(_forever(), _forever())
                else:
                    await asyncio.ensure_future(nested())

        with pytest.raises(TimeoutError):
            await asyncio.ensure_future(body())

    run(main)


def test_body_swallows_the_cancellation(run: Any, timeout: Any) -> None:
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        async with timeout(0.02) as cm:
            try:
                await _forever()
            except asyncio.CancelledError:
                pass
        # No exception to convert; the scope still knows it expired.
        assert cm.expired()
        assert _cancelling(task) == 0

    run(main)


def test_body_raises_other_error_after_expiry(run: Any) -> None:
    async def main() -> None:
        with pytest.raises(ValueError) as info:
            async with hwtimer.timeout(0.02) as cm:
                try:
                    await _forever()
                except asyncio.CancelledError:
                    raise ValueError("cleanup failed") from None
        assert cm.expired()
        # As Python 3.13: a TimeoutError is put between the error and the
        # cancellation in the context chain, so a traceback shows the cause.
        context = info.value.__context__
        assert isinstance(context, TimeoutError)
        assert isinstance(context.__context__, asyncio.CancelledError)

    run(main)


def test_finish_as_timer_fires_future_ready_same_iteration(run: Any, timeout: Any) -> None:
    # The awaited future completes in the same loop iteration as the
    # expiry, just before it: the cancellation still wins, as in asyncio.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        fut = loop.create_future()
        with pytest.raises(TimeoutError):
            async with timeout(SOON) as cm:
                loop.call_soon(fut.set_result, 1)
                cm.reschedule(loop.time() - 1)
                await fut
        assert cm.expired()
        assert _cancelling(task) == 0
        await asyncio.sleep(0.01)

    run(main)


def test_finish_as_timer_fires_race(run: Any) -> None:
    # Many bodies that finish right at their deadline, driven by the same
    # wheel: each one either completes or raises TimeoutError, never both,
    # never neither, and no cancellation leaks out of its scope.
    async def main() -> None:
        outcomes: dict[str, int] = {"done": 0, "timeout": 0}

        async def one(delay: float) -> None:
            task = asyncio.current_task()
            assert task is not None
            try:
                async with hwtimer.timeout(delay) as cm:
                    await hwtimer.sleep(delay)
            except TimeoutError:
                assert cm.expired()
                outcomes["timeout"] += 1
            else:
                assert not cm.expired()
                outcomes["done"] += 1
            assert _cancelling(task) == 0
            # Still usable: no stray cancellation arrives.
            await asyncio.sleep(0.02)
            await asyncio.sleep(0)

        await asyncio.wait_for(
            asyncio.gather(*(one(0.005 + (i % 20) / 1000) for i in range(2000))), 60
        )
        assert outcomes["done"] + outcomes["timeout"] == 2000

    run(main)


def test_stale_expiry_after_exit_is_ignored(run: Any) -> None:
    # The scope exits right after its deadline passed on the wheel; the
    # expiry may already be on its way to the loop.  It must not cancel the
    # task once the block has been left.
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        for _ in range(200):
            async with hwtimer.timeout(0.001) as cm:
                deadline = time.monotonic() + 0.002
                while time.monotonic() < deadline:
                    pass  # busy: the wheel expires the scope meanwhile
            assert not cm.expired()
            await asyncio.sleep(0.003)  # a stray cancel would land here
        assert _cancelling(task) == 0

    run(main)


def test_stale_expiry_after_reschedule_is_ignored(run: Any) -> None:
    # The first deadline expires on the wheel while the task is busy; the
    # block then moves the deadline later.  The old expiry, already on its
    # way to the loop, must not act on the new deadline.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for _ in range(50):
            async with hwtimer.timeout(0.001) as cm:
                deadline = time.monotonic() + 0.002
                while time.monotonic() < deadline:
                    pass
                cm.reschedule(loop.time() + SOON)
                await asyncio.sleep(0.005)
            assert not cm.expired()
        assert _cancelling(task) == 0

    run(main)


def test_ten_thousand_concurrent_timeouts(run: Any) -> None:
    async def main() -> None:
        count = 10_000
        loop = asyncio.get_running_loop()
        release = loop.create_future()
        start = time.monotonic()

        async def expires() -> str:
            try:
                async with hwtimer.timeout(0.05):
                    await _forever()
            except TimeoutError:
                return "timeout"
            return "no timeout"

        async def finishes() -> str:
            async with hwtimer.timeout(SOON * 6):
                await release
            return "done"

        tasks = [asyncio.ensure_future(expires() if i % 2 else finishes()) for i in range(count)]
        await asyncio.sleep(0.1)
        release.set_result(None)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert time.monotonic() - start >= 0.05
        assert results.count("timeout") == count // 2
        assert results.count("done") == count // 2

    run(main)


def test_a_timeout_scope_cannot_be_subclassed_as_the_readme_says() -> None:
    # timeout() and timeout_at() make the scope; a subclass is refused
    # when the class is made, not when one is used
    readme = " ".join(README.read_text().split())
    assert "it cannot be subclassed (``TypeError``)" in readme
    with pytest.raises(TypeError, match="not an acceptable base type"):
        type("MyScope", (hwtimer.TimeoutScope,), {})


def test_scope_pending_timeouts_released(run: Any, own_timer: Any) -> None:
    # Scopes that exit cancel their deadline: the wheel is left empty.
    async def main() -> None:
        for _ in range(1000):
            async with hwtimer.timeout(100, timer=own_timer):
                await asyncio.sleep(0)
        await _wait_until(lambda: own_timer.pending_timeouts() == 0)

    run(main)


def test_taskgroup_inside_timeout(run: Any, timeout: Any) -> None:
    if not hasattr(asyncio, "TaskGroup"):
        pytest.skip("asyncio.TaskGroup is new in 3.11")

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with timeout(0.02):
                async with asyncio.TaskGroup() as group:
                    group.create_task(_forever())
                    group.create_task(_forever())

    run(main)


def test_asyncio_timeout_and_hwtimer_nested(run: Any) -> None:
    if not HAVE_ASYNCIO_TIMEOUT:
        pytest.skip("asyncio.timeout is new in 3.11")

    # Both share the task's cancel count, so they nest with each other.
    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02) as outer:
                async with hwtimer.timeout(SOON) as inner:
                    await _forever()
        assert outer.expired() and not inner.expired()
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout(0.02) as outer2:
                async with asyncio.timeout(SOON) as inner2:
                    await _forever()
        assert outer2.expired() and not inner2.expired()

    run(main)


# --- wait_for() ---------------------------------------------------------------


def test_wait_for_result(run: Any) -> None:
    async def main() -> None:
        assert await hwtimer.wait_for(asyncio.sleep(0.01, "coro"), 1) == "coro"
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_later(0.01, fut.set_result, "fut")
        assert await hwtimer.wait_for(fut, timedelta(seconds=1)) == "fut"
        assert await hwtimer.wait_for(asyncio.sleep(0.01, "none"), None) == "none"

    run(main)


def test_wait_for_in_flight_keeps_only_what_it_waits_for(run: Any) -> None:
    # What its refusals look up (a future's bound get_loop) is let go before
    # the wait: kept, it would cost every request in flight 64 bytes more.
    async def main() -> None:
        fut = asyncio.get_running_loop().create_future()
        coro = hwtimer.wait_for(fut, 10)
        task = asyncio.ensure_future(coro)
        await asyncio.sleep(0)  # now waiting for fut
        held = list(coro.cr_frame.f_locals.values())
        assert fut in held
        assert not [v for v in held if getattr(v, "__self__", None) is fut]
        fut.set_result("done")
        assert await task == "done"

    run(main)


def test_wait_for_exception(run: Any) -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("x")

    async def main() -> None:
        with pytest.raises(KeyError):
            await hwtimer.wait_for(fails(), 1)

    run(main)


def test_wait_for_timeout_cancels_aw(run: Any) -> None:
    async def main() -> None:
        cleaned_up = False

        async def slow() -> None:
            nonlocal cleaned_up
            try:
                await _forever()
            finally:
                await asyncio.sleep(0.01)  # cleanup finishes before TimeoutError
                cleaned_up = True

        inner = asyncio.ensure_future(slow())
        start = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            await hwtimer.wait_for(inner, 0.03)
        assert time.monotonic() - start >= 0.03
        assert inner.cancelled()
        assert cleaned_up
        assert isinstance(info.value, asyncio.TimeoutError)

    run(main)


def test_wait_for_zero_never_starts_coroutine(run: Any) -> None:
    async def main() -> None:
        started = False

        async def work() -> None:
            nonlocal started
            started = True

        for delay in (0, -1, timedelta(0)):
            with pytest.raises(TimeoutError):
                await hwtimer.wait_for(work(), delay)
            assert not started

    run(main)


def test_wait_for_zero_with_done_future(run: Any) -> None:
    async def main() -> None:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result("ready")
        assert await hwtimer.wait_for(fut, 0) == "ready"

    run(main)


def test_wait_for_zero_cancellation_suppressed(run: Any) -> None:
    # aw swallows its cancellation and returns a value: that value counts.
    async def main() -> None:
        async def stubborn() -> str:
            try:
                await _forever()
            except asyncio.CancelledError:
                return "kept"
            return "unreachable"

        task = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)
        assert await hwtimer.wait_for(task, 0) == "kept"

    run(main)


def test_wait_for_outer_cancel_propagates(run: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        inner = asyncio.ensure_future(_forever())
        outer = asyncio.ensure_future(hwtimer.wait_for(inner, SOON))
        await asyncio.sleep(0.01)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        assert inner.cancelled()
        assert loop.is_running()

    run(main)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.wait_for on timeout() is 3.12+")
def test_wait_for_same_as_asyncio(run: Any) -> None:
    async def outcome(wait_for: Any, make: Callable[[], Any], delay: Any) -> str:
        try:
            return f"result {await wait_for(make(), delay)!r}"
        except asyncio.TimeoutError:
            return "timeout"
        except Exception as exc:
            return f"error {type(exc).__name__}"

    async def main() -> None:
        async def fails() -> None:
            raise KeyError("x")

        cases = [
            (lambda: asyncio.sleep(0.01, 1), 1),
            (lambda: asyncio.sleep(1, 1), 0.01),
            (lambda: asyncio.sleep(0, 1), 0),
            (lambda: asyncio.sleep(0, 1), None),
            (fails, 1),
            (fails, 0),
        ]
        for make, delay in cases:
            expected = await outcome(asyncio.wait_for, make, delay)
            assert await outcome(hwtimer.wait_for, make, delay) == expected

    run(main)


# --- sleep() ------------------------------------------------------------------


def test_sleep(run: Any) -> None:
    async def main() -> None:
        start = time.monotonic()
        await hwtimer.sleep(0.03)
        assert time.monotonic() - start >= 0.03
        assert await hwtimer.sleep(0.01, "result") == "result"
        assert await hwtimer.sleep(timedelta(milliseconds=10), 5) == 5
        assert await hwtimer.sleep(-1, "negative") == "negative"

    run(main)


def test_sleep_on_own_timer(run: Any, own_timer: Any) -> None:
    async def main() -> None:
        start = time.monotonic()
        assert await hwtimer.sleep(0.02, "own", timer=own_timer) == "own"
        assert time.monotonic() - start >= 0.02

    run(main)


def test_sleep_nan(run: Any) -> None:
    async def main() -> None:
        with pytest.raises(ValueError):
            await hwtimer.sleep(math.nan)

    run(main)


def test_sleep_and_wait_for_take_the_delays_new_timeout_takes(run: Any, own_timer: Any) -> None:
    # objects with __float__ or __index__, as the README's rules for delays
    # say, not only int, float and timedelta
    delays = [HasFloat(0.01), HasIndex(0), decimal.Decimal("0.01"), fractions.Fraction(1, 100)]

    async def main() -> None:
        for delay in delays:
            assert await hwtimer.sleep(delay, "slept", timer=own_timer) == "slept"
            assert await hwtimer.sleep(delay, "slept") == "slept"
        for delay in [*delays[:1], HasIndex(10), *delays[2:]]:
            assert await hwtimer.wait_for(asyncio.sleep(0, "done"), delay) == "done"
        with pytest.raises(ValueError):
            await hwtimer.sleep(decimal.Decimal("NaN"))
        with pytest.raises(ValueError):
            await hwtimer.wait_for(
                asyncio.get_running_loop().create_future(), decimal.Decimal("NaN")
            )
        with pytest.raises(TimeoutError):
            await hwtimer.wait_for(asyncio.sleep(10), HasIndex(0))

    run(main)


def test_helpers_take_an_int_past_any_float_as_new_timeout_does(run: Any, own_timer: Any) -> None:
    # new_timeout() reads an int exactly, however large: 10**400 seconds
    # never fire and -(10**400) are due at once; the helpers take delays by
    # the same rules, rather than raising OverflowError on the way to float
    async def main() -> None:
        for delay in (10**400, HasIndex(10**400)):
            async with hwtimer.timeout(delay, timer=own_timer) as cm:
                await asyncio.sleep(0.02)
            assert not cm.expired() and cm.when() == math.inf
            waited = hwtimer.wait_for(asyncio.sleep(0.01, "done"), delay, timer=own_timer)
            assert await waited == "done"
            sleeper = asyncio.ensure_future(hwtimer.sleep(delay, timer=own_timer))
            await asyncio.sleep(0.05)
            assert not sleeper.done()
            sleeper.cancel()
        for delay in (-(10**400), HasIndex(-(10**400))):
            with pytest.raises(TimeoutError):
                async with hwtimer.timeout(delay, timer=own_timer):
                    await asyncio.sleep(10)
            with pytest.raises(TimeoutError):
                await hwtimer.wait_for(asyncio.sleep(10), delay, timer=own_timer)
            assert await hwtimer.sleep(delay, "slept", timer=own_timer) == "slept"

    run(main)


def test_deadlines_take_an_int_past_any_float_as_infinite(run: Any, own_timer: Any) -> None:
    # timeout_at(), TimeoutScope() and reschedule() read such an int as the
    # infinity it is past, as the delays above do: never, or at once
    async def main() -> None:
        huge = 10**400
        async with hwtimer.timeout_at(huge, timer=own_timer) as cm:
            await asyncio.sleep(0.02)
        assert not cm.expired() and cm.when() == math.inf
        assert hwtimer.TimeoutScope(huge).when() == math.inf
        async with hwtimer.timeout(10, timer=own_timer) as cm:
            cm.reschedule(huge)
            await asyncio.sleep(0.02)
        assert not cm.expired() and cm.when() == math.inf
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout_at(-huge, timer=own_timer) as cm:
                await asyncio.sleep(10)
        assert cm.when() == -math.inf
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout(10, timer=own_timer) as cm:
                cm.reschedule(-huge)
                await asyncio.sleep(10)

    run(main)


def test_timeout_at_takes_the_numbers_reschedule_takes(run: Any, own_timer: Any) -> None:
    # a deadline is read by the same rules whether the scope is made with
    # it or rescheduled to it: a number that is neither int nor float too
    async def main() -> None:
        loop = asyncio.get_running_loop()

        def has_float(seconds: int) -> HasFloat:
            return HasFloat(float(seconds))

        for make in (fractions.Fraction, has_float, decimal.Decimal, HasIndex):
            when = make(int(loop.time()) + 3600)
            assert hwtimer.TimeoutScope(when).when() is when
            async with hwtimer.timeout_at(when, timer=own_timer) as cm:
                await asyncio.sleep(0)
            assert cm.when() is when and not cm.expired()
            async with hwtimer.timeout(None, timer=own_timer) as cm:
                cm.reschedule(when)
            assert cm.when() is when
            with pytest.raises(TimeoutError):
                async with hwtimer.timeout_at(make(int(loop.time()) - 1), timer=own_timer):
                    await asyncio.sleep(10)
        for bad in ("1", [1], timedelta(seconds=1)):
            name = type(bad).__name__
            with pytest.raises(TypeError, match=rf"^when must be a number, not [\w.]*\b{name}$"):
                hwtimer.timeout_at(bad)

    run(main)


def test_helpers_refuse_a_delay_that_is_no_number_as_new_timeout_does(
    run: Any, own_timer: Any
) -> None:
    # the TypeError names the argument, in new_timeout()'s words, rather
    # than the comparison with 0 that a str or None fails
    async def main() -> None:
        for bad in ("1", None, [1], object()):
            kind = type(bad).__name__
            message = rf"delay must be a number of seconds or a timedelta, not {kind}$"
            with pytest.raises(TypeError, match=message):
                await hwtimer.sleep(bad, timer=own_timer)
            if bad is not None:  # None is no deadline there
                with pytest.raises(TypeError, match=message):
                    hwtimer.timeout(bad, timer=own_timer)
                sleeper = asyncio.sleep(0)
                with pytest.raises(TypeError, match="^timeout" + message[len("delay") :]):
                    await hwtimer.wait_for(sleeper, bad, timer=own_timer)
                sleeper.close()
        async with hwtimer.timeout(10, timer=own_timer) as cm:
            for bad in ("1", [1]):
                with pytest.raises(
                    TypeError, match=rf"^when must be a number, not {type(bad).__name__}$"
                ):
                    cm.reschedule(bad)
            assert cm.when() is not None and not cm.expired()
        with pytest.raises(TypeError, match=r"^delay must be .* not str$"):
            own_timer.new_timeout(print, "1")
        assert own_timer.pending_timeouts() == 0

    run(main)


def test_helpers_refuse_a_bool_delay_naming_the_argument(run: Any, own_timer: Any) -> None:
    # a bool is refused as new_timeout() refuses it, in its words, and the
    # TypeError names the argument given: wait_for()'s is `timeout`
    async def main() -> None:
        for bad in (True, False):
            message = r"delay must be a number of seconds or a timedelta, not bool$"
            with pytest.raises(TypeError, match="^" + message):
                await hwtimer.sleep(bad, timer=own_timer)
            with pytest.raises(TypeError, match="^" + message):
                hwtimer.timeout(bad, timer=own_timer)
            sleeper = asyncio.sleep(0)
            with pytest.raises(TypeError, match="^timeout" + message[len("delay") :]):
                await hwtimer.wait_for(sleeper, bad, timer=own_timer)
            sleeper.close()
        assert own_timer.pending_timeouts() == 0

    run(main)


def test_wait_for_names_its_timeout_when_refusing_nan(run: Any, own_timer: Any) -> None:
    async def main() -> None:
        for nan in (math.nan, decimal.Decimal("NaN")):
            sleeper = asyncio.sleep(0)
            with pytest.raises(ValueError, match="^timeout must not be NaN$"):
                await hwtimer.wait_for(sleeper, nan, timer=own_timer)
            sleeper.close()
        assert own_timer.pending_timeouts() == 0

    run(main)


def test_wait_for_closes_a_coroutine_it_refuses(run: Any, own_timer: Any) -> None:
    """A coroutine handed to wait_for() belongs to it: when wait_for()
    refuses before awaiting it (a stopped or full timer, a bad timeout or
    timer), it closes the coroutine, which then neither runs nor warns that
    it was never awaited.  A future it refuses is left as it was."""
    ran: list[str] = []

    async def job() -> str:
        ran.append("job")
        return "done"

    async def main() -> None:
        with hwtimer.HashedWheelTimer(0.01, 64, max_pending_timeouts=1) as full:
            holder = full.new_timeout(lambda _t: None, 60)
            refusals: list[tuple[type[BaseException], Callable[[Any], Any]]] = [
                (RuntimeError, lambda aw: hwtimer.wait_for(aw, 5, timer=full)),
                (ValueError, lambda aw: hwtimer.wait_for(aw, math.nan, timer=own_timer)),
                (TypeError, lambda aw: hwtimer.wait_for(aw, "5", timer=own_timer)),
                (TypeError, lambda aw: hwtimer.wait_for(aw, 5, timer=object())),
            ]
            loop = asyncio.get_running_loop()
            for error, call in refusals:
                coro = job()
                with pytest.raises(error):
                    await call(coro)
                assert coro.cr_frame is None  # closed
                fut = loop.create_future()
                with pytest.raises(error):
                    await call(fut)
                assert not fut.done()
            holder.cancel()
        own_timer.start()
        own_timer.stop()
        coro = job()
        with pytest.raises(RuntimeError, match="stopped timer"):
            await hwtimer.wait_for(coro, 5, timer=own_timer)
        assert coro.cr_frame is None
        assert ran == []

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        run(main)
        gc.collect()


def test_sleep_zero_yields_like_asyncio(run: Any) -> None:
    async def interleaving(sleep: Any) -> list[str]:
        order: list[str] = []

        async def worker(name: str) -> None:
            for i in range(3):
                order.append(f"{name}{i}")
                await sleep(0)

        await asyncio.gather(worker("a"), worker("b"))
        return order

    async def main() -> None:
        ours = await interleaving(hwtimer.sleep)
        theirs = await interleaving(asyncio.sleep)
        assert ours == theirs == ["a0", "b0", "a1", "b1", "a2", "b2"]

    run(main)


def test_sleep_cancelled_cancels_its_timeout(run: Any, own_timer: Any) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(hwtimer.sleep(100, timer=own_timer))
        await asyncio.sleep(0.01)
        assert own_timer.pending_timeouts() == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _wait_until(lambda: own_timer.pending_timeouts() == 0)

    run(main)


def test_many_concurrent_sleeps(run: Any) -> None:
    async def main() -> None:
        start = time.monotonic()
        results = await asyncio.wait_for(
            asyncio.gather(*(hwtimer.sleep(0.01 + (i % 30) / 1000, i) for i in range(10_000))),
            120,
        )
        assert results == list(range(10_000))
        assert time.monotonic() - start >= 0.01

    run(main)


# --- stop() under asyncio -----------------------------------------------------


def test_sleep_scope_and_wait_for_outlive_their_timers_stop(run: Any, own_timer: Any) -> None:
    """Stopped before their deadline, the timer's sleep(), timeout() and
    wait_for() go on on the loop's clock: each ends at its deadline, not
    before, and none of their deadlines is in stop()'s list."""

    async def guarded() -> None:
        async with hwtimer.timeout(0.5, timer=own_timer):
            await _forever()

    async def main() -> None:
        start = time.monotonic()
        ended: dict[str, float] = {}
        tasks = {
            "sleep": asyncio.ensure_future(hwtimer.sleep(0.5, "woke", timer=own_timer)),
            "timeout": asyncio.ensure_future(guarded()),
            "wait_for": asyncio.ensure_future(hwtimer.wait_for(_forever(), 0.5, timer=own_timer)),
        }
        for name, task in tasks.items():
            task.add_done_callback(lambda _, name=name: ended.setdefault(name, time.monotonic()))
        await asyncio.sleep(0)  # each has its deadline on the wheel
        assert own_timer.pending_timeouts() == 3
        assert own_timer.stop() == []
        done, _ = await asyncio.wait(tasks.values(), timeout=SOON)
        assert len(done) == 3, "a deadline was lost with its timer"
        assert tasks["sleep"].result() == "woke"
        for name in ("timeout", "wait_for"):
            with pytest.raises(TimeoutError):
                tasks[name].result()
        for name, when in ended.items():
            # uvloop's clock counts whole milliseconds
            assert when - start >= 0.5 - 0.002, name

    run(main)


def test_stop_never_lists_a_scope_deadline_dropped_while_it_runs() -> None:
    """A scope (or sleep) may drop its deadline in another thread while
    stop() runs Python (here: asking the loop is_closed() as it hands the
    first deadline to it); that deadline is still none of stop()'s."""

    class HookLoop(asyncio.SelectorEventLoop):
        hook: Callable[[], object] | None = None

        def is_closed(self) -> bool:
            hook, self.hook = self.hook, None
            if hook is not None:
                hook()
            return super().is_closed()

    timer = hwtimer.HashedWheelTimer(0.005, 64)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, HookLoop)
        scopes: list[hwtimer.TimeoutScope] = []

        async def guarded() -> None:
            async with hwtimer.timeout(SOON, timer=timer) as scope:
                scopes.append(scope)
                await _forever()

        tasks = [asyncio.ensure_future(guarded()) for _ in range(2)]
        await asyncio.sleep(0)
        assert timer.pending_timeouts() == 2
        loop.hook = lambda: [scope.reschedule(None) for scope in scopes]
        try:
            assert timer.stop() == []
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    try:
        with event_loop(HookLoop) as loop:
            loop.run_until_complete(main())
    finally:
        timer.stop()


def test_after_a_stop_only_a_deadline_still_to_come_needs_the_timer(
    run: Any, own_timer: Any
) -> None:
    """A new sleep(), timeout() or wait_for() on a stopped timer raises
    RuntimeError if its deadline is still to come; one with no deadline or
    one passed already never needs the timer, and runs as asyncio's."""

    async def scoped(delay: float | None) -> str:
        async with hwtimer.timeout(delay, timer=own_timer):
            await asyncio.sleep(0.01)
        return "done"

    async def main() -> None:
        own_timer.start()
        own_timer.stop()
        assert await hwtimer.sleep(0, "now", timer=own_timer) == "now"
        assert await hwtimer.sleep(-1, timer=own_timer) is None
        assert await scoped(None) == "done"
        for passed in (0, -1):
            with pytest.raises(TimeoutError):
                await scoped(passed)
        # futures: a coroutine that wait_for() never starts is never awaited
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await hwtimer.wait_for(loop.create_future(), 0, timer=own_timer)
        for call in (
            lambda: hwtimer.sleep(0.01, timer=own_timer),
            lambda: scoped(0.01),
            lambda: hwtimer.wait_for(loop.create_future(), 0.5, timer=own_timer),
        ):
            with pytest.raises(RuntimeError, match="stopped timer"):
                await call()

    run(main)


def test_sleep_cancelled_after_its_timers_stop(run: Any, own_timer: Any) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(hwtimer.sleep(0.2, timer=own_timer))
        await asyncio.sleep(0)
        own_timer.stop()
        await asyncio.sleep(0.01)  # on the loop's clock now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main)


def test_scope_rescheduled_after_its_timers_stop(run: Any, own_timer: Any) -> None:
    """reschedule() of a scope whose timer stopped, even before the scope
    heard of it, puts the deadline on the loop's clock."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout(SOON * 10, timer=own_timer) as scope:
                own_timer.stop()
                scope.reschedule(loop.time() + 0.05)
                await _forever()

    async def entered_before() -> None:
        loop = asyncio.get_running_loop()
        timer = hwtimer.HashedWheelTimer(0.005, 64)
        try:
            with pytest.raises(TimeoutError):
                async with hwtimer.timeout(SOON * 10, timer=timer) as scope:
                    timer.stop()
                    await asyncio.sleep(0.01)  # the scope hears of the stop
                    scope.reschedule(loop.time() + 0.05)
                    await _forever()
        finally:
            timer.stop()

    run(main)
    run(entered_before)


def test_scope_rescheduled_while_its_timer_stops() -> None:
    """A stop() that another thread makes while reschedule() runs (here:
    as the scope reads loop.time(), after it looked at the timer) still
    moves the deadline to the loop's clock: reschedule() does not raise,
    and the scope expires at its new deadline."""

    class HookLoop(asyncio.SelectorEventLoop):
        hook: Callable[[], object] | None = None

        def time(self) -> float:
            hook, self.hook = self.hook, None
            if hook is not None:
                hook()
            return super().time()

    timer = hwtimer.HashedWheelTimer(0.005, 64)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, HookLoop)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            async with hwtimer.timeout(SOON, timer=timer) as scope:
                when = loop.time() + 0.05
                loop.hook = timer.stop
                scope.reschedule(when)
                assert loop.hook is None, "the scope read no loop.time()"
                await asyncio.wait_for(_forever(), SOON)  # a guard: the scope's is sooner
        assert 0.05 - 0.002 <= time.monotonic() - start < SOON

    try:
        with event_loop(HookLoop) as loop:
            loop.run_until_complete(main())
    finally:
        timer.stop()


def test_scope_moved_to_the_loop_ignores_its_expiry_already_on_its_way(run: Any) -> None:
    """The deadline passed while the loop was busy (its expiry is on its way
    to the loop), then the timer stopped and the block moved the deadline on,
    now on the loop's clock: as with asyncio.timeout(), the block is not
    cancelled before the new deadline."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        timer = hwtimer.HashedWheelTimer(0.001, 64)
        try:
            with pytest.raises(TimeoutError):
                async with hwtimer.timeout(0.01, timer=timer) as scope:
                    limit = time.monotonic() + SOON
                    while timer.pending_timeouts():  # blocks the loop meanwhile
                        assert time.monotonic() < limit, "the deadline never expired"
                        time.sleep(0.001)
                    timer.stop()
                    moved_at = time.monotonic()
                    scope.reschedule(loop.time() + 0.3)
                    await asyncio.sleep(SOON)
            assert time.monotonic() - moved_at >= 0.3 - 0.002  # uvloop counts whole ms
        finally:
            timer.stop()

    run(main)


def test_sleep_follows_the_loop_when_its_timer_stops_in_looptime_mode(own_timer: Any) -> None:
    from hwtimer.testing import follow_loop_time

    async def main() -> str:
        task = asyncio.ensure_future(hwtimer.sleep(0.05, "woke", timer=own_timer))
        await asyncio.sleep(0)
        own_timer.stop()
        async with hwtimer.timeout(SOON, timer=own_timer):
            return await task

    with follow_loop_time():
        assert asyncio.run(main()) == "woke"


def test_scope_deadlines_on_the_loops_clock_run_in_contexts_of_their_own() -> None:
    # A context is entered by one thread at a time: a deadline that ran in
    # one shared with another loop's deadline, in its run in another
    # thread, would be refused by the loop, and its timeout lost.
    from hwtimer.testing import follow_loop_time

    async def main() -> None:
        loop = asyncio.get_running_loop()
        contexts: list[contextvars.Context | None] = []
        call_at = loop.call_at

        def recording_call_at(when: float, callback: Any, *args: Any, context: Any = None) -> Any:
            contexts.append(context)
            return call_at(when, callback, *args, context=context)

        loop.call_at = recording_call_at  # type: ignore[method-assign]
        async with hwtimer.timeout(SOON):
            assert len(contexts) == 1 and contexts[0] is not None
            entered, release = threading.Event(), threading.Event()

            def hold() -> None:
                entered.set()
                release.wait(SOON)

            other = threading.Thread(target=contexts[0].run, args=(hold,))
            other.start()
            try:
                assert entered.wait(SOON)
                with pytest.raises(TimeoutError):
                    async with hwtimer.timeout(0.01):
                        await asyncio.sleep(2)
            finally:
                release.set()
                other.join()

    with follow_loop_time():
        asyncio.run(main())


def _wait_delivered(timer: hwtimer.HashedWheelTimer, handle: hwtimer.Timeout) -> None:
    """Blocks the loop until `handle`'s run is handed to it: off the wheel
    (no longer in the snapshot), still pending."""
    deadline = time.monotonic() + SOON
    while any(t is handle for t in timer.pending_snapshot()):
        assert time.monotonic() < deadline, "the run was never delivered"
        time.sleep(0.001)
    assert not handle.is_cancelled() and not handle.is_expired()


def test_stop_returns_a_call_every_run_waiting_for_its_loop(run: Any) -> None:
    """A call_every() run handed to a busy loop when stop() is called is
    returned by stop(), cancelled, and does not run."""

    async def main() -> None:
        timer = hwtimer.HashedWheelTimer(0.001, 512)
        runs: list[float] = []
        try:
            handle = timer.call_every(0.02, lambda: runs.append(time.monotonic()))
            _wait_delivered(timer, handle)  # the loop is busy meanwhile
            left = timer.stop()
            assert [t for t in left if t is handle] == [handle]
            assert handle.is_cancelled()
            await asyncio.sleep(0.2)  # the loop takes what it was handed
            assert runs == []
        finally:
            timer.stop()

    run(main)


def test_stop_from_a_call_every_run_returns_it(run: Any) -> None:
    """stop() called while a call_every() run is going in the loop (from
    that run) returns it: that run is its last."""

    async def main() -> None:
        timer = hwtimer.HashedWheelTimer(0.001, 512)
        left: list[hwtimer.Timeout] = []
        runs = 0

        def tick() -> None:
            nonlocal runs
            runs += 1
            if runs == 1:
                left.extend(timer.stop())

        try:
            handle = timer.call_every(0.01, tick)
            await _wait_until(lambda: runs >= 1)
            assert [t for t in left if t is handle] == [handle]
            await asyncio.sleep(0.1)
            assert runs == 1
            assert handle.is_cancelled()
        finally:
            timer.stop()

    run(main)


def test_a_timer_dropped_as_a_coroutine_returns_keeps_its_result() -> None:
    """On 3.9 a coroutine's locals are freed after its return value is set
    as StopIteration: a timer freed then must not clear it."""

    async def main() -> str:
        timer = hwtimer.HashedWheelTimer(0.01)
        fired = asyncio.Event()
        timer.call_later(0.01, fired.set)
        await fired.wait()
        timer.stop()
        return "value"

    assert asyncio.run(main()) == "value"
