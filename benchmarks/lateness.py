"""Lateness: 100k timeouts spread over 1 s, task start minus deadline, in
ms; each implementation in its own process, one after the other, round
after round.  The percentiles are those of each run; the table gives their
median (min-max) over the rounds.
"""

from __future__ import annotations

import threading
import time

from common import WHEEL, fmt, new_hwtimer, new_loop, run_child, summarize

# span: the seconds the deadlines are spread over, lead: from the first
# schedule to the first deadline
SIZES = {
    "full": {"n": 100_000, "span": 1.0, "lead": 0.5},
    "quick": {"n": 100_000, "span": 1.0, "lead": 0.5},
    "tiny": {"n": 2_000, "span": 0.1, "lead": 0.05},
}
IMPLS = {
    "hwtimer, tick 1 ms": ("hwtimer", 0.001),
    "hwtimer, tick 10 ms": ("hwtimer", 0.010),
    "asyncio": ("asyncio", 0),
    "uvloop": ("uvloop", 0),
}
QUANTILES = ("p50_ms", "p99_ms", "max_ms", "min_ms")


def percentiles(values: list[float]) -> dict:
    v = sorted(values)
    n = len(v)
    return {
        "p50_ms": v[(n - 1) // 2] * 1e3,
        "p99_ms": v[(n - 1) * 99 // 100] * 1e3,
        "max_ms": v[-1] * 1e3,
        "min_ms": v[0] * 1e3,
    }


def child(cfg: dict, impl: str, tick: float) -> dict:
    n, span, lead = cfg["n"], cfg["span"], cfg["lead"]
    lateness: list[float] = []
    mono = time.monotonic
    if impl == "hwtimer":
        timer = new_hwtimer(tick, WHEEL)
        timer.start()
        done = threading.Event()

        def task(to) -> None:
            lateness.append(mono() - to.deadline)
            if len(lateness) == n:
                done.set()

        t0 = mono() + lead
        for i in range(n):
            timer.new_timeout(task, t0 + span * i / n - mono())
        if not done.wait(30 + span):
            raise RuntimeError("lateness run did not finish")
        stats = timer.stats()
        timer.stop()
        out = percentiles(lateness)
        # what the timer's own statistics say of the same run
        out["stats"] = {k: stats[k] * 1e3 for k in ("late_p50", "late_p99", "late_max")}
        out["tick_ms"] = tick * 1e3
        return out
    loop = new_loop(impl)
    fut = loop.create_future()

    def cb(when: float) -> None:
        lateness.append(mono() - when)
        if len(lateness) == n:
            fut.set_result(None)

    async def main() -> None:
        t0 = loop.time() + lead
        for i in range(n):
            loop.call_at(t0 + span * i / n, cb, t0 + span * i / n)
        await fut

    loop.run_until_complete(main())
    loop.close()
    return percentiles(lateness)


def run(cfg: dict) -> dict:
    runs = [
        {k: run_child("lateness", "child", cfg, *args) for k, args in IMPLS.items()}
        for _ in range(cfg["repeats"])
    ]
    out = summarize(runs)
    out["n"], out["span"] = cfg["n"], cfg["span"]
    return out


def report(r: dict) -> list[str]:
    lines = [
        f"lateness, {r['n']:,} timeouts over {r['span']:g} s: task start - deadline (ms), "
        "median (min-max)",
        f"{'':<22}" + "".join(f"{q[:-3]:>24}" for q in QUANTILES),
    ]
    for k in IMPLS:
        v = r[k]
        lines.append(f"{k:<22}" + "".join(f"{fmt(v[q], '.3f'):>24}" for q in QUANTILES))
    return lines
