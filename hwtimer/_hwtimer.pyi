"""Types of the C extension hwtimer._hwtimer."""

import contextvars
from asyncio import AbstractEventLoop
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, Protocol, SupportsFloat, SupportsIndex, final

from typing_extensions import Self, TypeVarTuple, Unpack, disjoint_base

from ._stats import Stats

_Seconds = float | SupportsFloat | SupportsIndex | timedelta
_Missed = Literal["skip", "delay", "burst"]
_Ts = TypeVarTuple("_Ts")

class _Executor(Protocol):
    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any: ...

class RejectedExecutionError(RuntimeError): ...

@disjoint_base
class Timeout:
    @property
    def timer(self) -> HashedWheelTimer: ...
    @property
    def task(self) -> Callable[..., object]: ...
    @property
    def deadline(self) -> float: ...
    def cancel(self) -> bool: ...
    def reset(self, /, delay: _Seconds) -> bool: ...
    def is_cancelled(self) -> bool: ...
    def is_expired(self) -> bool: ...

@disjoint_base
class HashedWheelTimer:
    def __new__(
        cls,
        tick_duration: _Seconds = 0.1,
        ticks_per_wheel: SupportsIndex = 512,
        *,
        max_pending_timeouts: SupportsIndex = 0,
        thread_name: str | None = None,
        executor: _Executor | None = None,
    ) -> Self: ...
    # takes what __new__ takes (and applied): for a subclass's super().__init__()
    def __init__(
        self,
        tick_duration: _Seconds = 0.1,
        ticks_per_wheel: SupportsIndex = 512,
        *,
        max_pending_timeouts: SupportsIndex = 0,
        thread_name: str | None = None,
        executor: _Executor | None = None,
    ) -> None: ...
    @property
    def tick_duration(self) -> float: ...
    @property
    def ticks_per_wheel(self) -> int: ...
    @property
    def max_pending_timeouts(self) -> int: ...
    @property
    def thread_name(self) -> str: ...
    def start(self) -> None: ...
    def stop(self) -> list[Timeout]: ...
    def new_timeout(self, /, task: Callable[[Timeout], object], delay: _Seconds) -> Timeout: ...
    def call_later(
        self,
        delay: _Seconds,
        callback: Callable[[Unpack[_Ts]], object],
        /,
        *args: Unpack[_Ts],
        loop: AbstractEventLoop | None = None,
        context: contextvars.Context | None = None,
    ) -> Timeout: ...
    def _call_later_on_stop(
        self,
        on_stop: Callable[[float], object],
        delay: _Seconds,
        callback: Callable[[Unpack[_Ts]], object],
        /,
        *args: Unpack[_Ts],
    ) -> Timeout: ...
    def new_periodic(
        self,
        /,
        task: Callable[[Timeout], object],
        period: _Seconds,
        *,
        delay: _Seconds | None = None,
        missed: _Missed = "skip",
    ) -> Timeout: ...
    def call_every(
        self,
        period: _Seconds,
        callback: Callable[[Unpack[_Ts]], object],
        /,
        *args: Unpack[_Ts],
        loop: AbstractEventLoop | None = None,
        context: contextvars.Context | None = None,
        delay: _Seconds | None = None,
        missed: _Missed = "skip",
    ) -> Timeout: ...
    def pending_timeouts(self) -> int: ...
    def stats(self) -> Stats: ...
    def pending_snapshot(self, /, limit: SupportsIndex = 100) -> list[Timeout]: ...
    def __enter__(self) -> Self: ...
    # stops the timer and returns False: never swallows the exception; None
    # too, so that a subclass's override may return None, as most do
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> Literal[False] | None: ...

class _ManualTimer(HashedWheelTimer):
    def __new__(
        cls,
        tick_duration: _Seconds = 0.001,
        ticks_per_wheel: SupportsIndex = 4096,
        *,
        max_pending_timeouts: SupportsIndex = 0,
    ) -> Self: ...
    def time(self) -> float: ...
    def advance(self, /, seconds: _Seconds) -> int: ...
    def advance_to_next(self) -> float | None: ...
    def _target(self, seconds: _Seconds, /) -> tuple[int, float, float]: ...
    def _advance_until(
        self, target_ns: int, carry: float, loop: AbstractEventLoop, /
    ) -> tuple[int, bool]: ...
    def _now_ns(self) -> int: ...
    def _holds(self, loop: AbstractEventLoop, /) -> bool: ...

_backend: str  # "futex" (Linux's futex and eventfd) or "posix" (condition variable and pipe)

def _run_task(timeout: Timeout, /) -> None: ...
def _follow_loop_time(on: bool | None, /) -> bool: ...
def _mark_shared(timer: HashedWheelTimer, /) -> None: ...
def _stop_all() -> None: ...
def _threads_exiting() -> None: ...

@final
class TimeoutScope:
    def __init__(self, when: float | None, *, timer: HashedWheelTimer | None = None) -> None: ...
    @classmethod
    def _after(cls, seconds: float, timer: HashedWheelTimer | None, /) -> TimeoutScope: ...
    def when(self) -> float | None: ...
    def expired(self) -> bool: ...
    def reschedule(self, when: float | None) -> None: ...
    # C methods whose awaitables have send(), throw() and close() as a
    # coroutine has: typed as asyncio.Timeout's async defs, which is what
    # makes the scope an AbstractAsyncContextManager (for AsyncExitStack)
    async def __aenter__(self) -> TimeoutScope: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...
    def _on_timeout(self) -> None: ...
    # the scope is its own expiry task on the wheel (_on_timeout() is the
    # callback of a deadline on the loop's clock); the slot takes any
    # arguments and refuses all of them with TypeError
    def __call__(self, *args: object, **kwargs: object) -> None: ...

def _setup_scopes(
    default_timer: Callable[[], HashedWheelTimer],
    current_task: Callable[..., Any],
    cancelling: Callable[[Any], int] | None,
    cancel_task: Callable[[Any], None] | None,
    exit_expired: Callable[..., None],
    /,
) -> None: ...
