"""Memory per pending timeout: RSS bytes with 1M timeouts pending, the Python
object included, every task the same shared function; tracemalloc's count
too (in two runs: it counts bytes, which do not move).  Each implementation
and each way of counting runs in its own process, round after round; two at
a time, since a process's RSS does not depend on the others'.
"""

from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor

from common import fmt, new_hwtimer, new_loop, noop, rss_bytes, run_child, summarize

SIZES = {
    "full": {"n": 1_000_000, "traced_n": 1_000_000},
    "quick": {"n": 1_000_000, "traced_n": 100_000},
    "tiny": {"n": 20_000, "traced_n": 5_000},
}
FIGURE = "<= 96 bytes RSS per pending timeout"
IMPLS = ("hwtimer", "asyncio", "uvloop")


def child(cfg: dict, impl: str, traced: bool) -> dict:
    import tracemalloc

    n = cfg["traced_n" if traced else "n"]
    keep = [None] * n  # the caller's handles: not the timer's cost
    if impl == "hwtimer":
        timer = new_hwtimer()
        timer.new_timeout(noop, 1.0).cancel()  # threads started, sinks made

        def schedule(d):
            return timer.new_timeout(noop, d)

    else:
        loop = new_loop(impl)
        loop.call_later(1.0, noop).cancel()

        def schedule(d):
            return loop.call_later(d, noop)

    gc.collect()
    time.sleep(0.05)
    if traced:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if traced else rss_bytes()
    for i in range(n):
        keep[i] = schedule(1000.0 + (i % 60_000) * 0.05)
    gc.collect()
    time.sleep(0.05)  # let the worker move them into buckets
    after = tracemalloc.get_traced_memory()[0] if traced else rss_bytes()
    if traced:
        tracemalloc.stop()
    return {"bytes_per_timeout": (after - before) / n, "n": n}


def run(cfg: dict) -> dict:
    # tracemalloc counts bytes, which do not move from run to run, and is
    # slow: two runs of it are enough
    counts = {"rss": cfg["repeats"], "tracemalloc": min(cfg["repeats"], 2)}
    with ThreadPoolExecutor(2) as pool:
        futures: dict = {kind: [] for kind in counts}
        for i in range(cfg["repeats"]):
            for kind, rounds in counts.items():
                if i < rounds:
                    args = (run_child, "memory", "child", cfg)
                    traced = kind == "tracemalloc"
                    futures[kind].append({k: pool.submit(*args, k, traced) for k in IMPLS})
        return {
            kind: summarize([{k: f.result() for k, f in r.items()} for r in rounds])
            for kind, rounds in futures.items()
        }


def figure(r: dict) -> dict:
    x = r["rss"]["hwtimer"]["bytes_per_timeout"]
    return {"value": x, "unit": "bytes", "met": x["median"] <= 96}


def counts(r: dict) -> str:
    """How many timeouts were pending: the RSS runs', and the tracemalloc
    runs' where they took fewer (the smaller sizes)."""
    n = r["rss"]["hwtimer"]["n"]["median"]
    traced = r["tracemalloc"]["hwtimer"]["n"]["median"]
    return f"{n:,.0f} pending" + ("" if traced == n else f" (tracemalloc {traced:,.0f})")


def report(r: dict) -> list[str]:
    lines = [
        f"memory per pending timeout, {counts(r)}: bytes, median (min-max)",
        f"{'':<12}{'RSS':>22}{'tracemalloc':>22}{'vs asyncio':>12}",
    ]
    base = r["rss"]["asyncio"]["bytes_per_timeout"]["median"]
    for k in r["rss"]:
        rss = r["rss"][k]["bytes_per_timeout"]
        tm = r["tracemalloc"][k]["bytes_per_timeout"]
        lines.append(
            f"{k:<12}{fmt(rss, '.1f'):>22}{fmt(tm, '.1f'):>22}{base / rss['median']:>11.1f}x"
        )
    return lines
