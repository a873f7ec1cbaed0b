"""What a timeout costs an asyncio request: hwtimer against asyncio.

N requests are in flight at once on one event loop (N = 10,000 and
100,000).  Each request is a task that awaits a future, wrapped in

* nothing (the baseline the other rows are measured against),
* ``hwtimer.timeout()`` and ``hwtimer.wait_for()``,
* ``asyncio.timeout()`` (Python 3.11+) and ``asyncio.wait_for()``,
* a bare ``timer.call_later()`` / ``loop.call_later()`` cancelled when the
  request is done: the deadline alone, without a scope around it,

with a deadline far enough away that it never fires: the common case of a
request that finishes in time.  All futures are resolved once every request
is waiting, so the time covers entering the scope (scheduling the deadline),
waking up, and leaving it (cancelling the deadline).

Reported per request: wall time (``time.perf_counter_ns``), its overhead
over the baseline, and the memory held while the request waits (Python heap
as ``tracemalloc`` sees it; a hwtimer Timeout, wheel node included, is a
Python object).  Timing and memory are measured in separate runs, because
tracemalloc slows everything down.  Each figure is the median of several
runs, with the wrappers interleaved in a rotating order so that drift hits
all alike.

    python benchmarks/bench_asyncio.py
    python benchmarks/bench_asyncio.py --uvloop --sizes 10000 --repeat 9
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Coroutine
from typing import Any, Callable

import hwtimer

DEADLINE = 600.0  # seconds: never reached during a run

Wrapper = Callable[["asyncio.Future[None]"], Coroutine[Any, Any, None]]


async def bare(fut: asyncio.Future[None]) -> None:
    await fut


async def with_hwtimer_timeout(fut: asyncio.Future[None]) -> None:
    async with hwtimer.timeout(DEADLINE):
        await fut


async def with_hwtimer_wait_for(fut: asyncio.Future[None]) -> None:
    await hwtimer.wait_for(fut, DEADLINE)


async def with_asyncio_wait_for(fut: asyncio.Future[None]) -> None:
    await asyncio.wait_for(fut, DEADLINE)


def _nothing() -> None:
    pass


async def with_bare_call_later(fut: asyncio.Future[None]) -> None:
    handle = hwtimer.default_timer().call_later(DEADLINE, _nothing)
    try:
        await fut
    finally:
        handle.cancel()


async def with_bare_loop_call_later(fut: asyncio.Future[None]) -> None:
    handle = asyncio.get_running_loop().call_later(DEADLINE, _nothing)
    try:
        await fut
    finally:
        handle.cancel()


WRAPPERS: dict[str, Wrapper] = {"none (baseline)": bare, "hwtimer.timeout": with_hwtimer_timeout}
if sys.version_info >= (3, 11):

    async def with_asyncio_timeout(fut: asyncio.Future[None]) -> None:
        async with asyncio.timeout(DEADLINE):
            await fut

    WRAPPERS["asyncio.timeout"] = with_asyncio_timeout
WRAPPERS["hwtimer.wait_for"] = with_hwtimer_wait_for
WRAPPERS["asyncio.wait_for"] = with_asyncio_wait_for
# The deadline alone, without a scope: what the timers themselves cost.
WRAPPERS["timer.call_later"] = with_bare_call_later
WRAPPERS["loop.call_later"] = with_bare_loop_call_later


async def one_run(n: int, wrap: Wrapper, measure_memory: bool) -> int:
    """Runs n concurrent wrapped requests.  Returns the elapsed nanoseconds,
    or with measure_memory the bytes of Python heap held while they wait."""
    loop = asyncio.get_running_loop()
    # Everything but the requests themselves exists before the clock starts.
    futures = [loop.create_future() for _ in range(n)]
    await asyncio.sleep(0)
    if measure_memory:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    start = time.perf_counter_ns()
    tasks = [loop.create_task(wrap(fut)) for fut in futures]
    await asyncio.sleep(0)  # every request is now waiting, its deadline set
    if measure_memory:
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
    for fut in futures:
        fut.set_result(None)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter_ns() - start
    return held if measure_memory else elapsed


def measure(
    new_loop: Callable[[], asyncio.AbstractEventLoop], n: int, repeat: int, memory: bool
) -> dict[str, list[float]]:
    """Returns each wrapper's per-request figure of every run."""
    samples: dict[str, list[float]] = {name: [] for name in WRAPPERS}
    names = list(WRAPPERS)
    for run in range(repeat):
        # A different order each run: no wrapper always follows the same one.
        order = names[run % len(names) :] + names[: run % len(names)]
        for name in order:
            wrap = WRAPPERS[name]
            loop = new_loop()
            try:
                gc.collect()
                value = loop.run_until_complete(one_run(n, wrap, memory))
            finally:
                loop.close()
            samples[name].append(value / n)
    return samples


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def ratio(numerator: float, denominator: float) -> str:
    if denominator <= 0:
        return "n/a"
    return f"{numerator / denominator:.1f}x"


def print_size(n: int, times: dict[str, float], memory: dict[str, float]) -> None:
    base_time = times["none (baseline)"]
    base_memory = memory["none (baseline)"]
    print(f"\n{n:,} concurrent requests")
    print(f"  {'wrapper':<18} {'time/req':>10} {'overhead':>10} {'memory/req':>11} {'extra':>8}")
    for name in WRAPPERS:
        overhead = times[name] - base_time
        extra = memory[name] - base_memory
        is_base = name == "none (baseline)"
        line = (
            f"  {name:<18} {times[name] / 1000:>8.2f}us "
            f"{'' if is_base else f'{overhead / 1000:.2f}us':>10} "
            f"{memory[name]:>9.0f} B {'' if is_base else f'{extra:.0f} B':>8}"
        )
        print(line.rstrip())

    def cost(name: str) -> tuple[float, float]:
        return times[name] - base_time, memory[name] - base_memory

    ours_time, ours_memory = cost("hwtimer.timeout")
    for theirs in ("asyncio.timeout", "asyncio.wait_for"):
        if theirs in WRAPPERS:
            their_time, their_memory = cost(theirs)
            print(
                f"  {theirs} / hwtimer.timeout: time overhead {ratio(their_time, ours_time)}, "
                f"memory {ratio(their_memory, ours_memory)}"
            )
    for theirs, ours in (
        ("asyncio.wait_for", "hwtimer.wait_for"),
        ("loop.call_later", "timer.call_later"),
    ):
        their_time, their_memory = cost(theirs)
        ours_time, ours_memory = cost(ours)
        print(
            f"  {theirs} / {ours}: time overhead {ratio(their_time, ours_time)}, "
            f"memory {ratio(their_memory, ours_memory)}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    args = parser.parse_args(argv)
    if args.repeat < 1 or min(args.sizes) < 1:
        parser.error("--repeat and --sizes must be at least 1: a figure is per request")

    if args.uvloop:
        try:
            import uvloop
        except ImportError as e:
            parser.error(f"--uvloop needs uvloop (pip install uvloop): {e}")
        new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        loop_name = f"uvloop {importlib.metadata.version('uvloop')}"
    else:
        new_loop = asyncio.new_event_loop
        loop_name = "asyncio"
    timer = hwtimer.default_timer()
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {loop_name} loop; "
        f"hwtimer.default_timer(): tick {timer.tick_duration * 1000:g} ms, "
        f"{timer.ticks_per_wheel} buckets"
    )
    print(f"median of {args.repeat} runs; overhead and extra memory are over the baseline")
    for n in args.sizes:
        times = medians(measure(new_loop, n, args.repeat, memory=False))
        memory = medians(measure(new_loop, n, max(1, args.repeat // 2), memory=True))
        print_size(n, times, memory)
    return 0


# ---- as one of benchmarks/run.py's benchmarks ----

SIZES = {
    "full": {"sizes": [10_000, 100_000]},
    "quick": {"sizes": [10_000]},
    "tiny": {"sizes": [500]},
}


def child(cfg: dict) -> dict:
    """Every size on asyncio's loop: time per request (cfg["repeats"] runs)
    and Python heap per request (tracemalloc counts bytes, which do not
    move from run to run: half as many runs, at least two)."""
    from common import summary

    out: dict = {"python": platform.python_version()}
    for n in cfg["sizes"]:
        times = measure(asyncio.new_event_loop, n, cfg["repeats"], memory=False)
        memory = measure(asyncio.new_event_loop, n, max(2, cfg["repeats"] // 2), memory=True)
        out[str(n)] = {
            name: {"ns": summary(times[name]), "bytes": summary(memory[name])} for name in WRAPPERS
        }
    return out


def run(cfg: dict) -> dict:
    from common import run_child

    return run_child("bench_asyncio", "child", cfg)


def report(r: dict) -> list[str]:
    lines = []
    for n, rows in r.items():
        if n == "python":
            continue
        lines.append(f"{int(n):,} concurrent requests (asyncio loop): us/request, median (min-max)")
        base = rows["none (baseline)"]
        for name, v in rows.items():
            us = {q: x / 1e3 for q, x in v["ns"].items() if q != "runs"}
            over = (v["ns"]["median"] - base["ns"]["median"]) / 1e3
            extra = v["bytes"]["median"] - base["bytes"]["median"]
            lines.append(
                f"  {name:<18} {us['median']:>7.2f} ({us['min']:.2f}-{us['max']:.2f})"
                f"  overhead {over:>5.2f}  memory {v['bytes']['median']:>5.0f} B (+{extra:.0f})"
            )
    return lines


if __name__ == "__main__":
    sys.exit(main())
