"""Loops that cannot watch a file descriptor.

Windows' Proactor loop and some custom loops raise NotImplementedError
from add_reader().  call_later() callbacks for such a loop reach it through
a posting thread of the timer (named after it, ``<thread_name>-post``),
which hands each batch over with one call_soon_threadsafe.  The whole of
test_asyncio.py also runs on such a loop; these are the cases particular to
it: how many posts a batch costs, and when the posting thread ends.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable

import pytest
from conftest import (
    DEADLINE,
    collect_until,
    give_deadline_holding_loop,
    native_thread_names,
    run_python,
    wait_for,
    wake_fds,
)

import hwtimer


class NoReaderLoop(asyncio.SelectorEventLoop):
    """A loop without add_reader that counts the batches posted to it."""

    def __init__(self) -> None:
        super().__init__()
        self.posts = 0

    def add_reader(self, *args: Any) -> None:
        raise NotImplementedError

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
        if type(getattr(callback, "__self__", None)).__name__ == "_LoopDelivery":
            self.posts += 1
        return super().call_soon_threadsafe(callback, *args, **kw)


def _posters(timer: hwtimer.HashedWheelTimer) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == timer.thread_name + "-post"]


async def _until(done: Callable[[], bool]) -> None:
    """Lets the loop run until `done()`, for at most DEADLINE seconds."""
    end = time.monotonic() + DEADLINE
    while not done() and time.monotonic() < end:
        await asyncio.sleep(0.005)


def _run_until(loop: asyncio.AbstractEventLoop, done: Callable[[], bool]) -> None:
    loop.run_until_complete(_until(done))


@pytest.fixture
def loop() -> Any:
    loop = NoReaderLoop()
    yield loop
    loop.close()


def test_a_batch_is_posted_once(make_timer: Any, loop: NoReaderLoop) -> None:
    # 300 callbacks fall due while the loop is busy: however many ticks
    # they span, the loop gets one call_soon_threadsafe for them all.
    timer = make_timer(0.01, 64)
    ran: list[int] = []
    n = 300

    async def main() -> None:
        for i in range(n):
            timer.call_later(0.02 + (i % 5) * 0.01, ran.append, i)
        # busy: everything falls due and is delivered before the loop looks
        # (the worker counts a tick's expiries just before it hands them over)
        assert wait_for(lambda: timer.stats()["expired"] == n)
        time.sleep(0.2)
        await _until(lambda: len(ran) == n)

    loop.run_until_complete(main())
    assert sorted(ran) == list(range(n))
    assert loop.posts == 1
    assert len(_posters(timer)) == 1


def test_batches_apart_are_posted_apart(make_timer: Any, loop: NoReaderLoop) -> None:
    timer = make_timer(0.01, 64)
    ran: list[int] = []

    async def main() -> None:
        for i in range(3):
            timer.call_later(0.01, ran.append, i)
            await _until(lambda i=i: len(ran) > i)

    loop.run_until_complete(main())
    assert ran == [0, 1, 2]
    assert loop.posts == 3


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/task")
@pytest.mark.parametrize(
    "name, native",
    [
        ("pn", "pn-post"),
        # 15 bytes (as the shared timer's name) leave no room for "-post":
        # the posting thread keeps 13 of them and the role's initial, so
        # that it does not show as the worker
        ("request-timeout", "request-timeo-p"),
    ],
)
def test_posting_thread_has_its_native_name(
    make_timer: Any, loop: NoReaderLoop, name: str, native: str
) -> None:
    # ps -T and /proc show the timer's worker and dispatch thread by name;
    # the posting thread too, rather than as one more "python".
    timer = make_timer(0.01, 64, thread_name=name)
    ran: list[int] = []

    async def main() -> None:
        timer.call_later(0.01, ran.append, 1)
        await _until(lambda: bool(ran))

    loop.run_until_complete(main())
    assert len(_posters(timer)) == 1
    assert wait_for(lambda: native in native_thread_names())


def test_posting_thread_ends_when_the_timer_stops(make_timer: Any, loop: NoReaderLoop) -> None:
    # A batch that fell due before stop() still runs on the loop; then the
    # posting thread is gone.
    timer = make_timer(0.01, 64)
    ran: list[str] = []

    async def schedule() -> None:
        timer.call_later(0.01, ran.append, "due")
        timer.call_later(3600, ran.append, "far")

    loop.run_until_complete(schedule())
    assert len(_posters(timer)) == 1
    assert wait_for(lambda: timer.stats()["expired"] == 1)
    [far] = timer.stop()
    assert far.is_cancelled()
    assert wait_for(lambda: not _posters(timer))
    _run_until(loop, lambda: bool(ran))
    assert ran == ["due"]


def test_posting_thread_ends_with_its_loop(make_timer: Any) -> None:
    # A loop closed and collected with callbacks pending: they never run,
    # what they hold is released, and the posting thread ends.
    timer = make_timer(0.01, 64)
    loop = NoReaderLoop()
    payload = {"held": True}
    ran: list[object] = []

    async def schedule(payload: object) -> None:
        timer.call_later(0.01, ran.append, payload)
        timer.call_later(3600, ran.append, payload)

    loop.run_until_complete(schedule(payload))
    assert len(_posters(timer)) == 1
    loop.close()
    watch = weakref.ref(loop)
    del loop, payload
    assert collect_until(watch)
    assert wait_for(lambda: not _posters(timer))
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert ran == []


def test_closed_loop_stops_its_posting_thread(make_timer: Any) -> None:
    # Closed but still referenced: the next batch cannot be posted, so the
    # thread closes the sink and ends, and the callbacks are released.
    timer = make_timer(0.01, 64)
    loop = NoReaderLoop()
    ran: list[int] = []

    async def schedule() -> None:
        timer.call_later(0.05, ran.append, 1)

    loop.run_until_complete(schedule())
    loop.close()
    assert wait_for(lambda: not _posters(timer))
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert ran == []


def test_loop_collected_while_its_posting_thread_is_made_stops_it(make_timer: Any) -> None:
    # A loop left unclosed, in a cycle, that the cyclic GC collects while
    # its posting thread is being made (threading.Thread() allocates): the
    # sink is closed, and its wake fd with it.  No thread is left polling
    # a closed descriptor for ever, holding what the loop was handed.
    timer = make_timer(0.01, 64)

    class QueueLoop:
        def __init__(self) -> None:
            self.handed: list[Callable[[], object]] = []
            self.me = self  # only the cyclic GC frees it

        def add_reader(self, *args: Any) -> None:
            raise NotImplementedError

        def call_soon_threadsafe(self, callback: Callable[[], object], *args: Any) -> None:
            self.handed.append(callback)

        def is_closed(self) -> bool:
            return False

    gc.collect()
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.disable()
    try:
        loop = QueueLoop()
        handle = timer.call_later(3600, print, "far", loop=loop)
        [register] = loop.handed  # made outside the loop: it registers from there
        watch = weakref.ref(loop)
        del loop
        gc.set_threshold(1)  # every allocation collects the young objects
        gc.enable()
        register()
    finally:
        gc.set_threshold(*thresholds)
        if not enabled:
            gc.disable()
    assert collect_until(watch), "the loop was not collected"
    assert wait_for(lambda: not _posters(timer)), "the posting thread outlived its loop"
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert handle.is_cancelled()


def test_posting_thread_closes_the_wake_fd_as_it_ends(make_timer: Any) -> None:
    # A handle kept after its loop has closed keeps the sink, but not its
    # descriptor: a service that keeps its handles does not run out of fds.
    timer = make_timer(0.01, 64)
    before = wake_fds()
    handles = []

    async def schedule() -> None:
        handles.append(timer.call_later(0, lambda: None))
        await asyncio.sleep(0.05)

    for _ in range(5):
        loop = NoReaderLoop()
        try:
            loop.run_until_complete(schedule())
        finally:
            loop.close()
    del loop  # collected, each loop's posting thread ends
    assert wait_for(lambda: gc.collect() >= 0 and not _posters(timer))
    assert all(handle.is_expired() for handle in handles)
    assert wait_for(lambda: wake_fds() == before)


def test_loop_closed_with_a_batch_posted_to_it_stops_its_posting_thread(
    make_timer: Any,
) -> None:
    # The loop stops with a batch posted to it and not yet run, and is
    # closed, which drops the post.  Nothing will take that batch, so the
    # worker would never wake the thread for the next one: the close must
    # tell the timer itself.  The callbacks still pending are cancelled and
    # released, also one whose handle is kept, and the thread ends.
    timer = make_timer(0.01, 64)
    loop = NoReaderLoop()
    payload = type("Payload", (), {})()
    held = weakref.ref(payload)
    ran: list[object] = []

    async def schedule(payload: object) -> Any:
        timer.call_later(0.02, ran.append, "first")
        timer.call_later(0.2, ran.append, payload)
        return timer.call_later(3600, ran.append, "far")

    def stop_once_posted() -> None:
        loop.stop()
        assert wait_for(lambda: loop.posts == 1)

    far = loop.run_until_complete(schedule(payload))
    del payload
    loop.call_later(0.005, stop_once_posted)
    loop.run_forever()
    assert loop.posts == 1 and ran == []
    loop.close()
    assert wait_for(lambda: not _posters(timer))
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    assert far.is_cancelled()
    assert wait_for(lambda: held() is None), "what the callbacks hold was kept"
    assert ran == []


@pytest.mark.parametrize("loop_type", [asyncio.SelectorEventLoop, NoReaderLoop])
def test_keyboard_interrupt_leaves_the_rest_for_the_next_run(
    make_timer: Any, loop_type: type[asyncio.AbstractEventLoop]
) -> None:
    # As in asyncio, KeyboardInterrupt from a callback stops the loop; the
    # rest of its batch runs when the loop runs again.  It comes out of the
    # loop: not the callback's error, so not counted as one.
    timer = make_timer(0.01, 64)
    loop = loop_type()
    ran: list[int] = []

    def interrupt() -> None:
        ran.append(1)
        raise KeyboardInterrupt

    async def main() -> None:
        timer.call_later(0.02, ran.append, 0)
        timer.call_later(0.02, interrupt)
        timer.call_later(0.02, ran.append, 2)
        timer.call_later(0.02, ran.append, 3)
        await asyncio.sleep(DEADLINE)

    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(main())
        assert ran == [0, 1]
        _run_until(loop, lambda: len(ran) == 4)
        assert ran == [0, 1, 2, 3]
        assert timer.stats()["task_errors"] == 0
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


def test_keyboard_interrupt_after_the_posting_thread_closed_the_sink(make_timer: Any) -> None:
    # A task lets the posting thread fail to post the next batch (the loop
    # refuses it), which closes the sink and cancels the rest of the task's
    # own batch; then the task raises KeyboardInterrupt.  That rest cannot
    # wait for a next run that nothing will post: it is released, as the
    # close released what the sink held.
    timer = make_timer(0.01, 64)
    refuse = threading.Event()

    class RefusingLoop(NoReaderLoop):
        def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any) -> Any:
            if refuse.is_set():
                raise RuntimeError("refused")
            return super().call_soon_threadsafe(callback, *args)

    loop = RefusingLoop()
    payload = type("Payload", (), {})()
    held = weakref.ref(payload)
    ran: list[object] = []

    def refuse_the_next_post_then_interrupt() -> None:
        refuse.set()
        timer.call_later(0, ran.append, "next batch")
        # the worker delivers it, and the posting thread fails to post it
        assert wait_for(lambda: not _posters(timer))
        raise KeyboardInterrupt

    async def schedule(payload: object) -> Any:
        timer.call_later(0.02, refuse_the_next_post_then_interrupt)
        return timer.call_later(0.02, ran.append, payload)

    async def busy() -> None:
        # both are delivered before the loop looks: one batch
        assert wait_for(lambda: timer.stats()["expired"] == 2)
        time.sleep(0.05)
        await asyncio.sleep(DEADLINE)

    try:
        rest = loop.run_until_complete(schedule(payload))
        del payload
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(busy())
        assert loop.posts == 1
        assert rest.is_cancelled()
        assert wait_for(lambda: timer.pending_timeouts() == 0)
        del rest
        assert collect_until(held), "what the batch's rest holds was kept"
        assert ran == []
    finally:
        refuse.clear()
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


@pytest.mark.parametrize("made", [False, True], ids=["not-made", "made-then-raised"])
def test_posting_thread_that_fails_to_start_changes_nothing(
    make_timer: Any, loop: NoReaderLoop, monkeypatch: pytest.MonkeyPatch, made: bool
) -> None:
    # Thread.start() raises: no thread could be made, or one was and an
    # exception (a signal handler's) came while start() waited for it.  The
    # call_later() that needed it raises that error and leaves nothing
    # behind: no timeout, no wake fd, no thread polling a closed one.  The
    # next call_later(), once threads start, makes the thread and runs.
    timer = make_timer(0.01, 64)
    timer.start()
    start = threading.Thread.start
    failing = [True]
    error = KeyboardInterrupt if made else RuntimeError

    def failing_start(thread: threading.Thread) -> None:
        if not (failing and thread.name.endswith("-post")):
            return start(thread)
        if made:
            start(thread)
        raise error("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", failing_start)
    gc.collect()  # the sinks of earlier tests
    before = wake_fds()
    ran: list[int] = []

    def no_wake_fd_left() -> bool:
        gc.collect()
        return wake_fds() <= before

    async def main() -> None:
        with pytest.raises(error):
            timer.call_later(0.01, ran.append, 1)
        assert timer.pending_timeouts() == 0
        assert wait_for(lambda: not _posters(timer))
        assert wait_for(no_wake_fd_left)
        failing.clear()
        timer.call_later(0.01, ran.append, 2)
        await _until(lambda: bool(ran))

    loop.run_until_complete(main())
    assert ran == [2]
    assert len(_posters(timer)) == 1
    assert timer.stop() == []
    assert wait_for(lambda: not _posters(timer))


class BareLoop:
    """A loop of the least that call_later(loop=) asks for: is_closed() and
    call_soon_threadsafe(), whose callbacks run in a thread of its own.  It
    has no add_reader() at all."""

    def __init__(self) -> None:
        self._calls: list[Any] = []
        self._ready = threading.Condition()
        self._closed = False
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._calls and not self._closed:
                    self._ready.wait()
                if not self._calls:
                    return
                callback, args = self._calls.pop(0)
            callback(*args)

    def is_closed(self) -> bool:
        return self._closed

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any, **kw: Any) -> None:
        with self._ready:
            if self._closed:
                raise RuntimeError("Event loop is closed")
            self._calls.append((callback, args))
            self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        self.thread.join(DEADLINE)


def test_a_loop_without_add_reader_gets_its_callbacks_posted(make_timer: Any) -> None:
    # No add_reader() is no way to watch a descriptor, as one that raises
    # NotImplementedError: the batches are posted, not lost.
    timer = make_timer(0.01, 64)
    loop = BareLoop()
    ran = threading.Event()
    threads: list[threading.Thread] = []
    try:
        handle = timer.call_later(
            0.01, lambda: (threads.append(threading.current_thread()), ran.set()), loop=loop
        )
        assert ran.wait(DEADLINE)
        assert threads == [loop.thread]
        assert handle.is_expired() and not handle.is_cancelled()
        assert len(_posters(timer)) == 1
    finally:
        timer.stop()
        loop.close()


def test_scheduled_from_another_thread_before_the_loop_runs(make_timer: Any) -> None:
    # The sink is registered from the loop's own thread once it runs.
    timer = make_timer(0.01, 64)
    loop = NoReaderLoop()
    ran: list[str] = []
    try:
        t = threading.Thread(target=lambda: timer.call_later(0.01, ran.append, "x", loop=loop))
        t.start()
        t.join()
        time.sleep(0.05)  # due, and delivered, before the loop watches the sink
        assert not _posters(timer)
        _run_until(loop, lambda: bool(ran))
        assert ran == ["x"]
        assert len(_posters(timer)) == 1
    finally:
        loop.close()


@pytest.mark.parametrize("close", [False, True], ids=["loop-open", "loop-closed"])
def test_exit_with_callbacks_pending(close: bool) -> None:
    # Interpreter exit with the posting thread waiting and callbacks both
    # due and far: no hang, no crash, nothing printed.
    code = f"""
    import asyncio, hwtimer, warnings

    # asyncio's own warning for the loop left open on purpose, which a
    # debug build of CPython or -X dev shows
    warnings.filterwarnings("ignore", "unclosed event loop", ResourceWarning)

    class NoReaderLoop(asyncio.SelectorEventLoop):
        def add_reader(self, *args):
            raise NotImplementedError

    timer = hwtimer.default_timer()
    loop = NoReaderLoop()

    async def main():
        for i in range(2000):
            timer.call_later(0.001 * (i % 20), int)
            timer.call_later(3600, int)
        await asyncio.sleep(0.005)

    loop.run_until_complete(main())
    if {close}:
        loop.close()
    print("ok", flush=True)
    """
    for _ in range(5):
        proc = run_python(code, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "ok\n"
        assert proc.stderr == ""


def test_a_batch_delivered_before_it_is_posted_is_not_collected(
    make_timer: Any, loop: NoReaderLoop
) -> None:
    # A callback falls due while the loop runs the batch before it: the
    # posting thread is woken, and until it takes the GIL to post, the
    # loop holds nothing of the sink.  A collection then (here, in the
    # handle that runs right after that batch, which holds the GIL all
    # along) must leave the open loop its callback and its posting thread.
    timer = make_timer(0.005, 64)
    ran: list[int] = []

    def first() -> None:
        ran.append(1)
        interval = sys.getswitchinterval()
        sys.setswitchinterval(100)  # the posting thread waits for the GIL
        try:
            end = time.monotonic() + DEADLINE
            while timer.stats()["expired"] < 2 and time.monotonic() < end:
                pass
            # counted just before it is handed over
            end = time.monotonic() + 0.05
            while time.monotonic() < end:
                pass
        finally:
            sys.setswitchinterval(interval)

    async def main() -> None:
        timer.call_later(0.02, first)
        timer.call_later(0.15, ran.append, 2)
        assert wait_for(lambda: loop.posts == 1)
        loop.call_soon(gc.collect)  # next after the posted batch
        await _until(lambda: len(ran) == 2)

    loop.run_until_complete(main())
    assert ran == [1, 2]
    assert len(_posters(timer)) == 1


@pytest.mark.parametrize("what", ["call_later", "sleep", "timeout"])
def test_a_loop_left_unclosed_is_collected_with_the_deadlines_it_got(
    make_timer: Any, what: str
) -> None:
    # As for a loop that watches the wake fd: a loop whose thread ends
    # without closing it is collected, also when deadlines that hold it
    # fell due after its last run; its wake fd is closed, and its posting
    # thread ends.  The thread must not hold what it hands over.
    timer = make_timer(0.005, 256)
    gc.collect()  # the sinks of earlier tests
    before = wake_fds()

    def abandon() -> weakref.ref[asyncio.AbstractEventLoop]:
        loop = NoReaderLoop()
        give_deadline_holding_loop(loop, timer, what)
        posters.extend(_posters(timer))
        return weakref.ref(loop)

    done: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    posters: list[threading.Thread] = []
    thread = threading.Thread(target=lambda: done.append(abandon()))
    thread.start()
    thread.join()
    assert len(posters) == 1
    assert wait_for(lambda: timer.pending_timeouts() == 0), "the deadline never fell due"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # unclosed loop
        assert collect_until(done[0]), "the unclosed loop was not collected"

        def no_wake_fd_left() -> bool:
            gc.collect()
            return wake_fds() <= before

        assert wait_for(no_wake_fd_left)
    assert wait_for(lambda: not _posters(timer))


@pytest.mark.parametrize("what", ["call_later", "sleep", "timeout"])
def test_a_loop_left_unclosed_is_collected_while_it_has_callbacks_pending(
    make_timer: Any, what: str
) -> None:
    # As above, with another callback of the loop's still an hour away that
    # holds nothing of it: that one keeps the sink until it falls due, not
    # the batch posted to the loop, and so not the loop the batch holds.
    timer = make_timer(0.005, 256)

    def abandon() -> weakref.ref[asyncio.AbstractEventLoop]:
        loop = NoReaderLoop()
        timer.call_later(3600, print, "far", loop=loop)
        give_deadline_holding_loop(loop, timer, what)
        return weakref.ref(loop)

    done: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    thread = threading.Thread(target=lambda: done.append(abandon()))
    thread.start()
    thread.join()
    assert wait_for(lambda: timer.pending_timeouts() == 1), "the deadline never fell due"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # unclosed loop
        assert collect_until(done[0]), "the unclosed loop was not collected"
    assert wait_for(lambda: timer.pending_timeouts() == 0), "the far callback stayed pending"
    assert wait_for(lambda: not _posters(timer))


@pytest.mark.parametrize("how", ["loop-dropped", "timer-dropped"])
def test_a_forked_child_lets_go_of_the_posting_sink(how: str) -> None:
    # In a child of fork() the posting thread is the parent's: it never
    # runs there to let go of the sink, nor of the wake fd.  Once the loop
    # or the timer goes, the child closes that fd, as it does the wake fd
    # of a loop that watched it.
    proc = run_python(
        """
        import asyncio, gc, os, sys, warnings
        sys.path.insert(0, sys.argv[2])
        from conftest import wake_fds
        import hwtimer

        class NoReaderLoop(asyncio.SelectorEventLoop):
            def add_reader(self, *args):
                raise NotImplementedError

        warnings.simplefilter("ignore", DeprecationWarning)  # fork, threads
        timer = hwtimer.HashedWheelTimer(0.005)
        before = wake_fds()
        loop = NoReaderLoop()
        ran = []

        async def main():
            timer.call_later(0.01, ran.append, 1)
            while not ran:
                await asyncio.sleep(0.005)

        loop.run_until_complete(main())
        assert wake_fds() == before + 1
        pid = os.fork()
        if pid == 0:
            if sys.argv[1] == "loop-dropped":
                loop.close()
                del loop
            else:
                timer.stop()
                del timer
            gc.collect()
            left = wake_fds() - before
            print("wake fds left in the child:", left, flush=True)
            os._exit(0 if left == 0 else 1)
        _, status = os.waitpid(pid, 0)
        loop.close()
        timer.stop()
        print(os.waitstatus_to_exitcode(status))
        """,
        argv=(how, os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["wake fds left in the child: 0", "0"]
