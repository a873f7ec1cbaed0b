"""Burst limits: what the C call-and-free loop that ``burst.py`` measures
hwtimer's burst against is spared, each measured as a variant of it.

``python benchmarks/run.py --module burst_limits`` runs it after the
default set, which it is not in; ``--only burst_limits`` added runs it
alone.  Each round runs, each in a fresh process, one after the other:

- ``floor: main thread``: ``burst.py``'s limit, the floor extension's loop
  on the main thread;
- ``floor: own thread``: the same loop on a thread of its own, as a timer's
  callbacks run (the main thread waits for it);
- ``floor: whole argument``: the loop on the main thread, reading and
  writing each argument's last bytes before its call, as a dispatch reads
  and writes the whole of a ``Timeout`` (the loop alone touches its first
  16 bytes);
- ``floor: GC argument``: the loop on the main thread, each argument an
  object with the cyclic GC's header (80 bytes with it, as a ``Timeout``),
  untracked, as a ``Timeout`` that only the wheel holds is, and freed as
  a GC object is: what any handle that may sit in a reference cycle costs
  to release;
- ``hwtimer``: ``burst.py``'s hwtimer burst.

Each rate is from the first callback to the last (``burst.py``'s run
rate); the ratios to the main-thread loop, and hwtimer's to the loop on a
thread and to the loop with GC arguments, are taken round by round.
"""

from __future__ import annotations

import threading
import time

import burst
from common import fmt, per_round, run_child, summarize

SIZES = burst.SIZES
MAIN, THREAD, WHOLE = "floor: main thread", "floor: own thread", "floor: whole argument"
GC = "floor: GC argument"
IMPLS = (MAIN, THREAD, WHOLE, GC, "hwtimer")
RATE = "callbacks_per_s_first_to_last"


def child_floor(n: int, variant: str) -> dict:
    import floor

    ext = floor.load()
    task, times = burst.counter(n, lambda: None)
    args = ext.make_gc_args(n) if variant == GC else ext.make_args(n)
    touch = variant == WHOLE
    t0 = time.monotonic()
    if variant == THREAD:
        thread = threading.Thread(target=ext.burst, args=(task, args, touch))
        thread.start()
        thread.join()
    else:
        ext.burst(task, args, touch)
    return burst.burst_result(n, times, t0, 0.0)


def child(cfg: dict, impl: str) -> dict:
    if impl == "hwtimer":
        return burst.child(cfg, "hwtimer")
    return child_floor(cfg["n"], impl)


def run(cfg: dict) -> dict:
    import floor

    if not floor.buildable():
        return {"skipped": "the floor extension does not build here"}
    runs = [
        {k: run_child("burst_limits", "child", cfg, k) for k in IMPLS}
        for _ in range(cfg["repeats"])
    ]
    out = summarize(runs)

    def ratio(a: str, b: str) -> dict:
        return per_round(lambda x, y: x / y, [r[a][RATE] for r in runs], [r[b][RATE] for r in runs])

    out["ratios"] = {
        f"{THREAD} / {MAIN}": ratio(THREAD, MAIN),
        f"{WHOLE} / {MAIN}": ratio(WHOLE, MAIN),
        f"{GC} / {MAIN}": ratio(GC, MAIN),
        f"hwtimer / {MAIN}": ratio("hwtimer", MAIN),
        f"hwtimer / {THREAD}": ratio("hwtimer", THREAD),
        f"hwtimer / {GC}": ratio("hwtimer", GC),
    }
    out["n"] = cfg["n"]
    return out


def report(r: dict) -> list[str]:
    if "skipped" in r:
        return [f"skipped: {r['skipped']}"]
    lines = [f"burst of {r['n']:,}, millions of callbacks a second, first to last"]
    for k in IMPLS:
        millions = {s: v / 1e6 for s, v in r[k][RATE].items() if s != "runs"}
        lines.append(f"  {k:44s} {fmt(millions, '.2f'):>20}")
    lines.append("round by round")
    lines += [f"  {k:44s} {fmt(v, '.2f'):>20}" for k, v in r["ratios"].items()]
    return lines
