"""Schedule then cancel, the request-timeout pattern: random delays of 1 to
60 s, each timeout cancelled at once; ns per pair, against asyncio's
``call_later`` + ``cancel``, uvloop, ``sched`` and ``threading.Timer``.

All the implementations run in one fresh process, interleaved: each round
runs every one of them once, in turn, so that a change in the machine's load
hits them alike.
"""

from __future__ import annotations

import threading
import time

from common import (
    delays,
    fmt,
    new_hwtimer,
    new_loop,
    noop,
    pair_hwtimer,
    pair_loop,
    per_round,
    run_child,
    summary,
)

SIZES = {
    "full": {"n": 200_000, "thread_timer_n": 2_000},
    "quick": {"n": 50_000, "thread_timer_n": 500},
    "tiny": {"n": 5_000, "thread_timer_n": 50},
}
FIGURE = ">= 15x cheaper than asyncio call_later+cancel"


def pair_threading_timer(n: int) -> None:
    ds = delays()
    for i in range(n):
        t = threading.Timer(ds[i % len(ds)], noop)
        t.start()
        t.cancel()
        t.join()


def pair_sched():
    import sched

    s = sched.scheduler(time.monotonic, time.sleep)
    ds = delays()

    def run(n: int) -> None:
        enter, cancel = s.enter, s.cancel
        for _ in range(n // len(ds)):
            for d in ds:
                cancel(enter(d, 0, noop))
        for d in ds[: n % len(ds)]:
            cancel(enter(d, 0, noop))

    return run


def interleaved(fns: dict, n: int, rounds: int, sizes: dict | None = None) -> tuple[dict, dict]:
    """Runs each fn(n) once per round, in turn, so that a change in the
    machine's load hits every implementation alike, starting one further
    each round so that none always follows the same one; `sizes` gives some
    of them an n of their own.  Returns the wall and the CPU (process) ns
    per pair of every round, by implementation."""
    size = {k: (sizes or {}).get(k, n) for k in fns}
    for k, fn in fns.items():
        fn(min(size[k], 10_000))  # warm up
    wall: dict = {k: [] for k in fns}
    cpu: dict = {k: [] for k in fns}
    names = list(fns)
    for i in range(rounds):
        for k in names[i % len(names) :] + names[: i % len(names)]:
            fn, m = fns[k], size[k]
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            fn(m)
            wall[k].append((time.perf_counter_ns() - t0) / m)
            cpu[k].append((time.process_time_ns() - c0) / m)
    return wall, cpu


def floor_fns() -> dict:
    """The floor extension's pairs, or none where it cannot be built."""
    import types

    import floor

    ext = floor.load_or_none("pair")
    if ext is None:
        return {}
    return {
        "floor: essential work": pair_hwtimer(ext),
        "floor: two no-op C calls": pair_hwtimer(types.SimpleNamespace(new_timeout=ext.nothing)),
    }


def child(cfg: dict) -> dict:
    fns = {}
    timers = [new_hwtimer(), new_hwtimer(0.1, 512)]
    fns["hwtimer"] = pair_hwtimer(timers[0])
    fns["hwtimer (tick 100 ms, 512)"] = pair_hwtimer(timers[1])
    loops = {k: new_loop(k) for k in ("asyncio", "uvloop")}
    for kind, loop in loops.items():
        fns[kind] = pair_loop(loop, loop.call_later)
        timer = new_hwtimer()
        timers.append(timer)

        def call_later(delay, cb, _cl=timer.call_later, _loop=loop):
            return _cl(delay, cb, loop=_loop)

        # call_later's own signature, bound to this loop, as a service would
        fns[f"hwtimer call_later ({kind} loop)"] = pair_loop(loop, call_later)
    fns["sched"] = pair_sched()
    # threading.Timer starts a thread a pair: a few thousand are enough
    fns["threading.Timer"] = pair_threading_timer
    fns.update(floor_fns())
    sizes = {"threading.Timer": cfg["thread_timer_n"]}
    wall, cpu = interleaved(fns, cfg["n"], cfg["repeats"], sizes)
    for timer in timers:
        timer.stop()
    for loop in loops.values():
        loop.close()
    out = {
        "n": cfg["n"],
        "rounds": cfg["repeats"],
        "ns_per_pair": {k: summary(v) for k, v in wall.items()},
        "cpu_ns_per_pair": {k: summary(v) for k, v in cpu.items()},
        # the ratio of each round, so that both sides saw the same load
        "vs_asyncio": {
            k: per_round(lambda b, x: b / x, wall["asyncio"], v) for k, v in wall.items()
        },
    }
    if "floor: essential work" in wall:
        # by CPU time too: it leaves out the time other processes took the
        # core, so it holds better on a busy machine (hwtimer's worker
        # thread is in it: work the floor has no thread for)
        for key, series in (("vs_floor", wall), ("vs_floor_cpu", cpu)):
            out[key] = {
                f"{k} / {f}": per_round(lambda x, b: x / b, series[k], series[f])
                for k in ("hwtimer", "hwtimer call_later (asyncio loop)")
                for f in ("floor: essential work", "floor: two no-op C calls")
            }
    return out


def run(cfg: dict) -> dict:
    return run_child("pair", "child", cfg)


def figure(r: dict) -> dict:
    x = r["vs_asyncio"]["hwtimer"]
    return {"value": x, "unit": "x", "met": x["median"] >= 15}


def report(r: dict) -> list[str]:
    p, cpu, rat = r["ns_per_pair"], r["cpu_ns_per_pair"], r["vs_asyncio"]
    lines = [
        "schedule + cancel, random delays 1-60 s: ns per pair, median (min-max) of "
        f"{r['rounds']} interleaved rounds; CPU of the whole process",
        f"{'':<34}{'per pair':>22}{'vs asyncio':>12}{'CPU':>10}",
    ]
    for k, v in sorted(p.items(), key=lambda kv: kv[1]["median"]):
        lines.append(f"{k:<34}{fmt(v):>22}{rat[k]['median']:>11.2f}x{cpu[k]['median']:>10,.0f}")
    for k, v in r.get("vs_floor", {}).items():
        cpu_ratio = r["vs_floor_cpu"][k]
        lines.append(f"{k}: {fmt(v, '.2f')}x, by CPU time {fmt(cpu_ratio, '.2f')}x")
    return lines
