"""Producers: 1, 2 and 4 threads sharing the same total of schedule +
cancel pairs on one timer, in one fresh process; each round runs the three
in turn, then the same for the floor extension's essential work.

With the GIL one thread runs at a time, so more threads cannot be faster,
and handing the GIL over costs them a little: the floor pays it too, and
hwtimer's threads are measured against the floor's, round by round.
"""

from __future__ import annotations

import threading
import time

from common import fmt, new_hwtimer, pair_hwtimer, per_round, run_child, summary, within_noise

SIZES = {"full": {"total": 800_000}, "quick": {"total": 200_000}, "tiny": {"total": 8_000}}
FIGURE = "4 threads take no longer than 1 thread, against the floor's"
FLOOR = "floor: essential work"
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


# A round takes a few tenths of a second: each repeat is this many rounds,
# so that the median of a ratio a few hundredths from 1 holds from run to run.
ROUNDS_PER_REPEAT = 3


def child(cfg: dict) -> dict:
    impls = {"hwtimer": new_hwtimer()}
    import floor

    ext = floor.load_or_none("producers")  # a pair's essential work, same two calls
    if ext is not None:
        impls[FLOOR] = ext
    for timer in impls.values():
        pair_hwtimer(timer)(10_000)
    runs: dict = {name: {str(k): [] for k in THREADS} for name in impls}
    for _ in range(cfg["repeats"] * ROUNDS_PER_REPEAT):
        for name, timer in impls.items():
            for k in THREADS:
                runs[name][str(k)].append(one_run(timer, k, cfg["total"]))
    impls["hwtimer"].stop()

    def vs_one_thread(name: str) -> dict:
        r = runs[name]
        return {k: per_round(lambda x, b: x / b, v, r["1"]) for k, v in r.items()}

    out = {
        "seconds": {k: summary(v) for k, v in runs["hwtimer"].items()},
        "vs_one_thread": vs_one_thread("hwtimer"),
        "total_pairs": cfg["total"],
    }
    if FLOOR in runs:
        out["floor_vs_one_thread"] = vs_one_thread(FLOOR)
    return out


def run(cfg: dict) -> dict:
    return run_child("producers", "child", cfg)


def no_slower(x: dict, floor: dict | None) -> bool:
    """Whether 4 threads cost hwtimer no more, against 1, than the floor:
    its median no higher, or the two within noise (each median within the
    other's min-max).  Without the floor, no slower than 1 thread."""
    if floor is None:
        return x["median"] <= 1.0
    return x["median"] <= floor["median"] or within_noise(x, floor)


def figure(r: dict) -> dict:
    x = r["vs_one_thread"]["4"]
    floor = r.get("floor_vs_one_thread", {}).get("4")
    return {"value": x, "unit": "x the 1-thread time", "met": no_slower(x, floor)}


def report(r: dict) -> list[str]:
    lines = [f"producers: {r['total_pairs']:,} pairs shared by k threads, ms, median (min-max)"]
    for k, v in r["seconds"].items():
        ms = {q: x * 1e3 for q, x in v.items() if q != "runs"}
        ratio = r["vs_one_thread"][k]["median"]
        line = f"{k} thread(s): {fmt(ms, '.1f'):>24}  ({ratio:.2f}x the 1-thread time"
        floor = r.get("floor_vs_one_thread", {}).get(k)
        lines.append(line + (f"; floor {floor['median']:.2f}x)" if floor else ")"))
    return lines
