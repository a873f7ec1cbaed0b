"""Regression tests of reliability under adversarial use: several event
loops in several threads, fork during stop(), stops that wait on each
other, executors whose futures fail, re-entrant Python while the binding
holds a pointer, and the small inconsistencies between the helpers.

The tests that take the `cpu_load` fixture run beside CPU-burning
processes of their own when HWTIMER_TEST_LOAD is set (CI runs them so),
since contention is where the multi-loop and fork failures showed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import DEADLINE, run_python, wait_for

import hwtimer

LOOPS = ["asyncio", "uvloop"]


def _new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """With HWTIMER_TEST_LOAD=N, N busy processes run for the test's
    duration (each gives up after 120 s on its own, so none outlives a
    killed run by long)."""
    n = int(os.environ.get("HWTIMER_TEST_LOAD", "0") or 0)
    burn = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


# ---- 1. scope expiries on loops in several threads ----


class SlowCancelTask(asyncio.Task):  # type: ignore[type-arg]
    """A task whose cancel() lets go of the GIL for a while, as one that
    does I/O would: another loop's expiry then runs meanwhile."""

    def cancel(self, *args: Any, **kwargs: Any) -> bool:
        time.sleep(0.005)
        return super().cancel(*args, **kwargs)


def _slow_cancel_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
    return SlowCancelTask(coro, loop=loop, **kwargs)


@pytest.mark.parametrize("kind", LOOPS)
def test_scope_expiries_on_loops_in_many_threads(kind: str, cpu_load: None) -> None:
    nloops, nscopes = 4, 60
    outcomes: list[list[str]] = [[] for _ in range(nloops)]
    handler_calls: list[dict[str, Any]] = []
    start = threading.Barrier(nloops)

    async def guarded(i: int) -> str:
        try:
            if i % 2:
                async with hwtimer.timeout(0.02):
                    await asyncio.sleep(3)
            else:
                await hwtimer.wait_for(asyncio.sleep(3), 0.02)
        except TimeoutError:
            return "timed out"
        return "lost"

    async def main() -> list[str]:
        start.wait()
        return list(await asyncio.gather(*(guarded(i) for i in range(nscopes))))

    def run_loop(k: int) -> None:
        loop = _new_loop(kind)
        loop.set_task_factory(_slow_cancel_factory)
        loop.set_exception_handler(lambda loop, ctx: handler_calls.append(ctx))
        try:
            outcomes[k] = loop.run_until_complete(main())
        finally:
            loop.close()

    threads = [threading.Thread(target=run_loop, args=(k,)) for k in range(nloops)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert handler_calls == []
    assert all(o == ["timed out"] * nscopes for o in outcomes), outcomes
