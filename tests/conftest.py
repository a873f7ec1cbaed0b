"""Shared fixtures and helpers for hwtimer's tests.

Every timer a test starts must be stopped, or the suite leaks native
threads: take timers from the `make_timer` factory (or the `timer`
fixture), which stops them all when the test ends and then checks that
their worker and dispatch threads are gone.

Bounds are generous on purpose: the suite must pass on a busy two-core
machine, so something expected within 50 ms is waited for up to 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import hwtimer

#: How long to wait for something that should happen "soon".
DEADLINE = 10.0

# The random programs of the hypothesis tests are the same on every run, so
# that a failure is one anyone can repeat; `pytest --hypothesis-profile=
# explore` searches afresh, and longer.  Generating a program is quick, but
# a loaded machine or a sanitizer build can make it look slow.
settings.register_profile(
    "repeatable",
    max_examples=150,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore", max_examples=3000, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("repeatable")


#: The directory that holds the hwtimer package under test, for subprocesses.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(hwtimer.__file__)))


class HasFloat:
    """A delay that is neither int nor float: it has __float__."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        return self.value


class IntFloatsOtherwise(int):
    """An int whose __float__ says something else."""

    def __float__(self) -> float:
        return float(int(self)) * 1000


class HasIndex:
    """A delay that is neither int nor float: it has __index__."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def run_threads_switching_often(target: Callable[[], object], n: int) -> None:
    """Runs `target` in `n` threads at once, the GIL passing between them
    as often as it can, and returns once they have all ended."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=target) for _ in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)


def wait_for(
    condition: Callable[[], object], timeout: float = DEADLINE, interval: float = 0.002
) -> bool:
    """Polls `condition` until it is true or `timeout` seconds pass.

    Returns whether it became true; callers assert on it.
    """
    end = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= end:
            return bool(condition())
        time.sleep(interval)


def native_thread_names() -> list[str]:
    """The names (comm) of this process's native threads, as ps -T shows them."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", "rb") as f:
                names.append(f.read().rstrip(b"\n").decode("utf-8", "replace"))
        except OSError:  # the thread exited meanwhile (ENOENT, ESRCH)
            pass
    return names


def _cut(name: str, size: int) -> str:
    """`name` cut to at most `size` bytes of UTF-8, whole characters."""
    return name.encode("utf-8")[:size].decode("utf-8", "ignore")


def native_name(name: str) -> str:
    """What Linux keeps of a thread name: at most 15 bytes, whole characters."""
    return _cut(name, 15)


def native_helper_name(timer_name: str, role: str) -> str:
    """The native name of a timer's "dispatch" or "post" thread: the name
    "<timer>-<role>" as Linux keeps it; or, where the timer's name leaves no
    room for the role (15 bytes or more), its first 13 bytes, "-" and the
    role's initial, so that the thread does not show as the worker does."""
    if len(timer_name.encode("utf-8")) < 15:
        return native_name(f"{timer_name}-{role}")
    return _cut(timer_name, 13) + "-" + role[0]


def collect_until(ref: Callable[[], object], timeout: float = DEADLINE) -> bool:
    """Runs the cyclic GC until the weak reference `ref` is dead."""

    def dead() -> bool:
        gc.collect()
        return ref() is None

    return wait_for(dead, timeout, interval=0.01)


class Counter:
    """A task that counts its calls and remembers each Timeout it got."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[hwtimer.Timeout] = []
        self.times: list[float] = []
        self.threads: list[str] = []

    def __call__(self, timeout: hwtimer.Timeout) -> None:
        now = time.monotonic()
        with self.lock:
            self.calls.append(timeout)
            self.times.append(now)
            self.threads.append(threading.current_thread().name)

    @property
    def count(self) -> int:
        return len(self.calls)

    def wait(self, n: int = 1, timeout: float = DEADLINE) -> bool:
        return wait_for(lambda: self.count >= n, timeout)


def run_python(
    code: str,
    timeout: float = 60.0,
    env: dict | None = None,
    args: tuple[str, ...] = (),
    argv: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with hwtimer importable;
    `args` go to the interpreter, `argv` to the code (sys.argv[1:]).

    The test fails (instead of hanging) if it does not finish in `timeout`.
    """
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.pop("PYTHONWARNINGS", None)
    full_env.pop("PYTHONDEVMODE", None)
    if env:
        full_env.update(env)
    try:
        return subprocess.run(
            [sys.executable, *args, "-c", textwrap.dedent(code), *argv],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"subprocess did not finish in {timeout} s (a hang?)\n"
            f"stdout: {e.stdout!r}\nstderr: {e.stderr!r}"
        )


# Code that has a subprocess take SIGINT as an interactive shell leaves it,
# even if this process ignores it.
INTERRUPTIBLE = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


@contextlib.contextmanager
def interruptible_example(path: Path, args: list[str]) -> Iterator[subprocess.Popen[str]]:
    """Runs the script `path` with `args` in a fresh interpreter, with
    hwtimer importable, that Ctrl-C (interrupt()) reaches and that shows
    every ResourceWarning; kills it if it still runs at the end."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    code = INTERRUPTIBLE + (
        "import runpy, sys\n"
        f"sys.argv = [{str(path)!r}, *{args!r}]\n"
        f"runpy.run_path({str(path)!r}, run_name='__main__')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-W", "always::ResourceWarning", "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def interrupt(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Sends `proc` a Ctrl-C and returns its stdout and stderr from there
    to its exit."""
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=60)


def _threads_of(names: set[str]) -> list[str]:
    """The worker, dispatch and posting threads of the timers named `names`."""
    helpers = {n + suffix for n in names for suffix in ("-dispatch", "-post")}
    natives = {native_name(n) for n in names} | {
        native_helper_name(n, role) for n in names for role in ("dispatch", "post")
    }
    found = [n for n in native_thread_names() if n in natives]
    found += [t.name for t in threading.enumerate() if t.name in helpers]
    return found


@pytest.fixture(autouse=True)
def _shared_timer_lets_go(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under a count of references around each test (scripts/refleaks.sh,
    pytest-leaks' -R), the shared timer lets go of what the test cancelled
    before the count: its worker looks at cancels up to a second later, and
    a closed loop that a cancelled deadline holds until then would be
    counted as leaked by each run of a quick test.  A snapshot does the
    worker's part at once."""
    yield
    if request.config.getoption("leaks", None):
        from hwtimer import _default

        if _default._timer is not None:
            _default._timer.pending_snapshot()


@pytest.fixture
def make_timer() -> Iterator[Callable[..., hwtimer.HashedWheelTimer]]:
    """A factory of HashedWheelTimer (same arguments) whose timers are all
    stopped when the test ends; the test then fails if any of their
    threads is still alive.  Defaults to a 10 ms tick."""
    timers: list[hwtimer.HashedWheelTimer] = []

    def factory(
        tick_duration: object = 0.01, ticks_per_wheel: object = 64, **kwargs: object
    ) -> hwtimer.HashedWheelTimer:
        timer = hwtimer.HashedWheelTimer(tick_duration, ticks_per_wheel, **kwargs)
        timers.append(timer)
        return timer

    yield factory
    names = set()
    for timer in timers:
        names.add(timer.thread_name)
        timer.stop()
    assert wait_for(lambda: not _threads_of(names)), (
        f"threads of stopped timers still alive: {_threads_of(names)}"
    )


@pytest.fixture
def timer(make_timer: Callable[..., hwtimer.HashedWheelTimer]) -> hwtimer.HashedWheelTimer:
    """A timer with a 10 ms tick and 64 buckets, stopped after the test."""
    return make_timer()


#: The examples/ directory of the checkout under test.
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
#: The README, whose promises some tests hold the code to.
README = Path(__file__).resolve().parent.parent / "README.rst"


def load_example(name: str) -> Any:
    """Imports examples/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def close_with_a_late_connection(server_class: type, **kwargs: Any) -> None:
    """Makes an example server of `server_class` (its arguments `kwargs`)
    and connects to it; its handler for that connection starts only once
    close() has closed the connections it knew of.  Asserts that close()
    returns all the same and that the connection is closed, not served on
    until a timeout (nor, from 3.12, waited for that long by close())."""
    gate = asyncio.Event()  # made in the loop: 3.9 binds it there
    entered: list[bool] = []

    class LateServer(server_class):  # type: ignore[misc, valid-type]
        async def _serve(self, reader: Any, writer: Any) -> None:
            entered.append(True)
            await gate.wait()  # the loop has yet to start the handler
            await super()._serve(reader, writer)

    server = LateServer(**kwargs)
    await server.start()
    reader, writer = await asyncio.open_connection(*server.address)
    try:
        while not entered:
            await asyncio.sleep(0.001)
        closing = asyncio.ensure_future(server.close())
        for _ in range(5):
            await asyncio.sleep(0)
        gate.set()
        await asyncio.wait_for(closing, DEADLINE)
        assert await asyncio.wait_for(reader.read(), DEADLINE) == b""
    finally:
        writer.close()


#: The event loops the asyncio tests run on, by the names event_loop() takes.
LOOP_KINDS = ["asyncio", "uvloop"]


def give_deadline_holding_loop(
    loop: asyncio.AbstractEventLoop, timer: hwtimer.HashedWheelTimer, what: str
) -> None:
    """Runs `loop` once to give `timer` a deadline 0.01 s away that holds
    the loop, of the kind `what` names: "call_later" (the loop among its
    arguments), "sleep" (an hwtimer.sleep()'s future) or "timeout" (a
    scope's task).  Leaves the loop as it is, unclosed."""

    async def schedule() -> None:
        if what == "call_later":
            timer.call_later(0.01, print, loop)
        elif what == "sleep":
            asyncio.ensure_future(hwtimer.sleep(0.01, timer=timer))
        else:

            async def scope() -> None:
                async with hwtimer.timeout(0.01, timer=timer):
                    await asyncio.sleep(DEADLINE)

            asyncio.ensure_future(scope())
        await asyncio.sleep(0)

    loop.run_until_complete(schedule())


@contextlib.contextmanager
def event_loop(
    kind: str | Callable[[], asyncio.AbstractEventLoop] = "asyncio",
) -> Iterator[asyncio.AbstractEventLoop]:
    """A new event loop, closed when the block ends however it ends: of a
    kind in LOOP_KINDS ("uvloop" skips the test where it is missing), or
    made by `kind` itself.  A test that looks at what happens once its loop
    is closed does so after the block."""
    if kind == "uvloop":
        loop = pytest.importorskip("uvloop").new_event_loop()
    elif kind == "asyncio":
        loop = asyncio.new_event_loop()
    else:
        assert callable(kind), kind
        loop = kind()
    try:
        yield loop
    finally:
        loop.close()


def _asyncio_timeout_follows_current_rules() -> bool:
    """Whether asyncio.timeout() is the reference that hwtimer's scopes are
    checked against.  It is new in 3.11, and 3.11.0-3.11.2 (Debian 12's
    python3 among them) predate some of its rules, which hwtimer follows:
    the TimeoutError's __cause__ is the CancelledError, a scope refuses to
    be entered twice, and reschedule() before entering is a RuntimeError."""
    if sys.version_info < (3, 11):
        return False

    async def probe() -> bool:
        try:
            async with asyncio.timeout(0):
                await asyncio.sleep(1)
        except TimeoutError as e:
            if not isinstance(e.__cause__, asyncio.CancelledError):
                return False
        scope = asyncio.timeout(None)
        try:
            scope.reschedule(1)
        except RuntimeError:
            pass
        except AssertionError:  # 3.11.2: an assert, not a RuntimeError
            return False
        async with scope:
            pass
        try:
            async with scope:
                pass
        except RuntimeError:
            return True
        return False

    with event_loop() as loop:
        return loop.run_until_complete(probe())


#: asyncio.timeout() exists and follows the rules of 3.11.3 and later.
ASYNCIO_TIMEOUT_IS_REFERENCE = _asyncio_timeout_follows_current_rules()


@pytest.fixture(params=LOOP_KINDS)
def run(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Runs a coroutine function to completion (60 s at most) on a new
    event loop: the test runs once on asyncio's, once on uvloop's."""

    def run(main: Callable[[], Any]) -> Any:
        with event_loop(request.param) as loop:
            return loop.run_until_complete(asyncio.wait_for(main(), 60))

    return run


def wake_fds() -> int:
    """The loop sinks' wake fds open in this process: eventfds, or on the
    portable backend pipes (two descriptors each; asyncio's own loops wake
    themselves through sockets)."""
    posix = hwtimer._hwtimer._backend == "posix"
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += target.startswith("pipe:") if posix else target == "anon_inode:[eventfd]"
    return n // 2 if posix else n


def refuse_dispatch_thread(monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], None]) -> None:
    """Has a timer's dispatch thread fail to start as ``Thread.start()`` does
    when no thread can be made, once `meanwhile()` has run in its place (the
    timer's worker runs by then); other threads start as usual."""
    real_start = threading.Thread.start

    def refuse(thread: threading.Thread) -> None:
        if not thread.name.endswith("-dispatch"):
            real_start(thread)
            return
        meanwhile()
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
