"""Growth: the schedule + cancel pair with 1k ... 5M timeouts pending, and
the time of a full ``gc.collect()`` with 1M pending.  Each implementation
runs in its own process, one after the other, round after round; the chart
(``growth.png``) plots the medians with the min-max of the rounds.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time

from common import (
    delays,
    fmt,
    new_hwtimer,
    new_loop,
    noop,
    pair_hwtimer,
    pair_loop,
    run_child,
    summarize,
    summary,
)

SIZES = {
    "full": {
        "levels": [1_000, 10_000, 100_000, 1_000_000, 5_000_000],
        "pairs": 200_000,
        "uvloop_max": 1_000_000,
        "gc_live": 1_000_000,
    },
    "quick": {
        "levels": [1_000, 10_000, 100_000, 1_000_000],
        "pairs": 50_000,
        "uvloop_max": 100_000,
        "gc_live": 1_000_000,
    },
    "tiny": {"levels": [1_000, 10_000], "pairs": 5_000, "uvloop_max": 10_000, "gc_live": 10_000},
}
FIGURE = "pair with 1M live <= 1.5x pair with 1k live"
IMPLS = ("hwtimer", "asyncio", "uvloop")


def child(cfg: dict, impl: str) -> dict:
    levels = cfg["levels"]
    if impl == "uvloop":
        levels = [x for x in levels if x <= cfg["uvloop_max"]]
    far = delays(100_000, 600.0, 3600.0)  # pending for the whole run
    # The timer (the loop) keeps its timeouts alive; holding them in a list
    # here would make gc.collect() walk the list, which is not its cost.
    live = 0
    loop = timer = None
    if impl == "hwtimer":
        timer = new_hwtimer()
        pair = pair_hwtimer(timer)

        def schedule(d):
            return timer.new_timeout(noop, d)

    else:
        loop = new_loop(impl)
        pair = pair_loop(loop, loop.call_later)

        def schedule(d):
            return loop.call_later(d, noop)

    def gc_time() -> float:
        runs = []
        for _ in range(3):
            t0 = time.perf_counter_ns()
            gc.collect()
            runs.append((time.perf_counter_ns() - t0) / 1e6)
        return statistics.median(runs)

    def pair_ns(n: int) -> float:
        pair(min(n, 10_000))  # warm up
        t0 = time.perf_counter_ns()
        pair(n)
        return (time.perf_counter_ns() - t0) / n

    # pending: [level, timer.pending_timeouts()], a check that they are there
    out: dict = {"ns_per_pair": {}, "gc_collect_ms": {"0": gc_time()}, "pending": []}
    for level in levels:
        for i in range(live, level):
            schedule(far[i % len(far)])
        live = level
        if loop is not None:
            loop.run_until_complete(asyncio.sleep(0))
        else:
            time.sleep(0.05)
        out["ns_per_pair"][str(level)] = pair_ns(cfg["pairs"])
        if level == cfg["gc_live"]:
            out["gc_collect_ms"][str(level)] = gc_time()
        if timer is not None:
            out["pending"].append([level, timer.pending_timeouts()])
    if timer is not None:
        timer.stop()
    return out


def run(cfg: dict) -> dict:
    runs = [{k: run_child("growth", "child", cfg, k) for k in IMPLS} for _ in range(cfg["repeats"])]
    return summarize(runs)


def figure(r: dict) -> dict | None:
    """The pair with 1M pending over the pair with 1k: the largest level up
    to 1M over the smallest, on smaller sizes."""
    by = r["hwtimer"]["ns_per_pair"]
    levels = sorted(int(k) for k in by if int(k) <= 1_000_000)
    if len(levels) < 2:
        return None
    top, low = by[str(levels[-1])]["runs"], by[str(levels[0])]["runs"]
    x = summary([a / b for a, b in zip(top, low)])
    unit = f"x ({levels[-1]:,} pending / {levels[0]:,})"
    return {"value": x, "unit": unit, "met": x["median"] <= 1.5}


def report(r: dict) -> list[str]:
    levels = list(r["hwtimer"]["ns_per_pair"])
    lines = [
        "schedule + cancel with timeouts pending: ns per pair, median (min-max)",
        f"{'pending':<12}" + "".join(f"{k:>24}" for k in r),
    ]
    for level in levels:
        cells = []
        for k in r:
            v = r[k]["ns_per_pair"].get(level)
            cells.append(f"{fmt(v) if v else '-':>24}")
        lines.append(f"{int(level):<12,}" + "".join(cells))
    lines.append("full gc.collect() (ms):")
    for k in r:
        cells = ", ".join(
            f"{int(n):,} pending: {fmt(v, '.1f')}" for n, v in r[k]["gc_collect_ms"].items()
        )
        lines.append(f"  {k:<10}{cells}")
    return lines


def plot(r: dict, machine: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for impl, style in (("hwtimer", "o-"), ("asyncio", "s--"), ("uvloop", "^:")):
        g = r.get(impl)
        if not g:
            continue
        xs = [int(k) for k in g["ns_per_pair"]]
        s = list(g["ns_per_pair"].values())
        med = [v["median"] for v in s]
        err = [[m - v["min"] for m, v in zip(med, s)], [v["max"] - m for m, v in zip(med, s)]]
        ax.errorbar(xs, med, yerr=err, fmt=style, capsize=3, label=impl)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("timeouts pending")
    ax.set_ylabel("schedule + cancel (ns per pair)")
    ax.set_title("Pair cost against live timers (median, min-max)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.text(
        0.01, 0.01, f"{machine['cpu']}, {machine['cores']} cores, {machine['python']}", fontsize=7
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
