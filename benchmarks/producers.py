"""Producers: 1, 2 and 4 threads sharing the same total of schedule +
cancel pairs on one timer, in one fresh process; each round runs the three
in turn.
"""

from __future__ import annotations

import threading
import time

from common import fmt, new_hwtimer, pair_hwtimer, per_round, run_child, summary

SIZES = {"full": {"total": 800_000}, "quick": {"total": 200_000}, "tiny": {"total": 8_000}}
FIGURE = "4 threads take no longer than 1 thread"
THREADS = (1, 2, 4)


def one_run(timer, k: int, total: int) -> float:
    """Seconds for k threads to do total // k pairs each."""
    barrier = threading.Barrier(k + 1)
    work = pair_hwtimer(timer)

    def producer() -> None:
        barrier.wait()
        work(total // k)

    threads = [threading.Thread(target=producer) for _ in range(k)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter_ns()
    for t in threads:
        t.join()
    return (time.perf_counter_ns() - t0) / 1e9


def child(cfg: dict) -> dict:
    timer = new_hwtimer()
    pair_hwtimer(timer)(10_000)
    runs: dict = {str(k): [] for k in THREADS}
    for _ in range(cfg["repeats"]):
        for k in THREADS:
            runs[str(k)].append(one_run(timer, k, cfg["total"]))
    timer.stop()
    return {
        "seconds": {k: summary(v) for k, v in runs.items()},
        "vs_one_thread": {k: per_round(lambda x, b: x / b, v, runs["1"]) for k, v in runs.items()},
        "total_pairs": cfg["total"],
    }


def run(cfg: dict) -> dict:
    return run_child("producers", "child", cfg)


def figure(r: dict) -> dict:
    x = r["vs_one_thread"]["4"]
    return {"value": x, "unit": "x the 1-thread time", "met": x["median"] <= 1.0}


def report(r: dict) -> list[str]:
    lines = [f"producers: {r['total_pairs']:,} pairs shared by k threads, ms, median (min-max)"]
    for k, v in r["seconds"].items():
        ms = {q: x * 1e3 for q, x in v.items() if q != "runs"}
        ratio = r["vs_one_thread"][k]["median"]
        lines.append(f"{k} thread(s): {fmt(ms, '.1f'):>24}  ({ratio:.2f}x the 1-thread time)")
    return lines
