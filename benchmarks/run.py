"""hwtimer's benchmarks against asyncio, uvloop, threading.Timer and sched.

One command runs them all::

    python benchmarks/run.py [--quick] [--only NAME ...]

It needs the extension built in place (``python setup.py build_ext
--inplace``) or hwtimer installed, and the ``bench`` extra (uvloop,
matplotlib; valgrind for the instruction counts).  It prints a table with
ratios against asyncio's ``call_later`` + ``cancel``, writes
``benchmarks/results/results.json`` and the chart
``benchmarks/results/growth.png``.  ``--quick`` uses smaller sizes (about a
minute instead of about three).

Benchmarks, each in a fresh process so that one's heap does not weigh on
the next:

1. pair: schedule then cancel (random delays of 1 to 60 s), ns per pair;
2. memory: RSS bytes per pending timeout with 1M pending, the Python
   object included, the task one shared function; tracemalloc's count too;
3. growth: the pair with 1k ... 5M timeouts pending, and the time of a full
   ``gc.collect()`` with 1M pending;
4. burst: 500k timeouts due in the same tick, callbacks run per second;
5. producers: 1, 2 and 4 threads sharing the same total of pairs;
6. lateness: 100k timeouts spread over 1 s, task start minus deadline;
7. instructions: callgrind's count for one pair, the figure that stays put
   on a noisy machine;
8. idle: CPU time of an idle timer and of one timeout a second, against a
   worker that wakes every tick as Netty's does (``benchmarks/idle.py``).

hwtimer runs with the shared timer's settings (``default_timer()``: 1 ms
tick, 4096 buckets) unless said otherwise.  Times are wall-clock
(``time.perf_counter_ns``); each figure is the median of a few repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
# The checkout's hwtimer (built in place) comes before an installed one, but
# after what PYTHONPATH names, so that another build can be measured.
PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if ROOT not in sys.path:
    sys.path.insert(1 + len(PYTHONPATH), ROOT)

TICK = 0.001
WHEEL = 4096
SEED = 20240611

FULL = {
    "pair_n": 200_000,
    "pair_repeats": 7,
    "thread_timer_n": 2_000,
    "memory_n": 1_000_000,
    "memory_traced_n": 1_000_000,
    "growth_levels": [1_000, 10_000, 100_000, 1_000_000, 5_000_000],
    "growth_pairs": 200_000,
    "growth_repeats": 5,
    "growth_uvloop_max": 1_000_000,
    "gc_live": 1_000_000,
    "burst_n": 500_000,
    "producers_total": 800_000,
    "lateness_n": 100_000,
    "instr_n": {"hwtimer": 50_000, "asyncio": 20_000},
    "idle_seconds": 3.0,
}
QUICK = {
    "pair_n": 50_000,
    "pair_repeats": 3,
    "thread_timer_n": 500,
    "memory_n": 1_000_000,
    "memory_traced_n": 100_000,
    "growth_levels": [1_000, 10_000, 100_000, 1_000_000],
    "growth_pairs": 50_000,
    "growth_repeats": 3,
    "growth_uvloop_max": 100_000,
    "gc_live": 1_000_000,
    "burst_n": 100_000,
    "producers_total": 200_000,
    "lateness_n": 100_000,
    "instr_n": {"hwtimer": 10_000, "asyncio": 3_000},
    "idle_seconds": 1.0,
}

FIGURES = {
    "pair": ">= 15x cheaper than asyncio call_later+cancel",
    "memory": "<= 96 bytes RSS per pending timeout",
    "growth": "pair with 1M live <= 1.5x pair with 1k live",
    "burst": ">= 10x asyncio's callbacks per second",
    "producers": "4 threads take no longer than 1 thread",
}


def delays(n: int = 10_000, low: float = 1.0, high: float = 60.0) -> list[float]:
    """The random delays every implementation gets, the same each run."""
    rng = random.Random(SEED)
    return [rng.uniform(low, high) for _ in range(n)]


def noop(*args) -> None:
    pass


def new_hwtimer(tick: float = TICK, wheel: int = WHEEL):
    import hwtimer

    return hwtimer.HashedWheelTimer(tick, wheel, thread_name="bench-hwtimer")


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def median_ns_per(fn, n: int, repeats: int) -> float:
    """Median over `repeats` of fn(n)'s wall time divided by n."""
    fn(min(n, 10_000))  # warm up
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(n)
        runs.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(runs)


# ---- the schedule + cancel pair, per implementation ----
#
# Each returns a function doing n pairs over the shared delays.  Event loops
# run while they do: every 10000 pairs the loop turns once, so asyncio does
# the clean-up of cancelled handles that a live service pays for.


def pair_hwtimer(timer):
    ds = delays()

    def run(n: int) -> None:
        new_timeout = timer.new_timeout
        for _ in range(n // len(ds)):
            for d in ds:
                new_timeout(noop, d).cancel()
        for d in ds[: n % len(ds)]:
            new_timeout(noop, d).cancel()

    return run


def pair_loop(loop: asyncio.AbstractEventLoop, call_later):
    ds = delays()

    async def pairs(n: int) -> None:
        done = 0
        while done < n:
            for d in ds[: min(len(ds), n - done)]:
                call_later(d, noop).cancel()
            done += min(len(ds), n - done)
            await asyncio.sleep(0)

    return lambda n: loop.run_until_complete(pairs(n))


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


def interleaved(fns: dict, n: int, rounds: int, base: str) -> dict:
    """Runs each fn(n) once per round, in turn, so that a change in the
    machine's load hits every implementation alike.  Returns the median
    wall and CPU (process) ns per call, and the median over rounds of the
    ratio base / fn."""
    for fn in fns.values():
        fn(min(n, 10_000))  # warm up
    wall: dict = {k: [] for k in fns}
    cpu: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            fn(n)
            wall[k].append((time.perf_counter_ns() - t0) / n)
            cpu[k].append((time.process_time_ns() - c0) / n)
    return {
        "ns_per_pair": {k: statistics.median(v) for k, v in wall.items()},
        "cpu_ns_per_pair": {k: statistics.median(v) for k, v in cpu.items()},
        "ratio_vs_asyncio": {
            k: statistics.median(b / x for b, x in zip(wall[base], wall[k])) for k in fns
        },
        "rounds": rounds,
        "n": n,
    }


def child_pair(cfg: dict) -> dict:
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
    out = interleaved(fns, cfg["pair_n"], cfg["pair_repeats"], "asyncio")
    for timer in timers:
        timer.stop()
    for loop in loops.values():
        loop.close()
    n = cfg["thread_timer_n"]
    tt = interleaved({"threading.Timer": pair_threading_timer}, n, 3, "threading.Timer")
    out["ns_per_pair"]["threading.Timer"] = tt["ns_per_pair"]["threading.Timer"]
    out["cpu_ns_per_pair"]["threading.Timer"] = tt["cpu_ns_per_pair"]["threading.Timer"]
    out["ratio_vs_asyncio"]["threading.Timer"] = (
        out["ns_per_pair"]["asyncio"] / out["ns_per_pair"]["threading.Timer"]
    )
    return out


# ---- memory per pending timeout ----


def child_memory(cfg: dict, impl: str, traced: bool) -> dict:
    import tracemalloc

    n = cfg["memory_traced_n" if traced else "memory_n"]
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


def bench_memory(cfg: dict) -> dict:
    """RSS and tracemalloc per implementation, each in its own process.

    They run side by side: a process's RSS does not depend on the others.
    """
    from concurrent.futures import ThreadPoolExecutor

    impls = ("hwtimer", "asyncio", "uvloop")
    with ThreadPoolExecutor(2) as pool:
        rss = {k: pool.submit(run_child, "memory", cfg, k, False) for k in impls}
        traced = {k: pool.submit(run_child, "memory", cfg, k, True) for k in impls}
        return {
            "rss": {k: f.result() for k, f in rss.items()},
            "tracemalloc": {k: f.result() for k, f in traced.items()},
        }


# ---- growth: the pair with many timeouts pending ----


def child_growth(cfg: dict, impl: str) -> dict:
    levels = cfg["growth_levels"]
    if impl == "uvloop":
        levels = [x for x in levels if x <= cfg["growth_uvloop_max"]]
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

    out = {"levels": [], "ns_per_pair": [], "gc_collect_ms": {}}
    out["gc_collect_ms"]["0"] = gc_time()
    for level in levels:
        for i in range(live, level):
            schedule(far[i % len(far)])
        live = level
        if loop is not None:
            loop.run_until_complete(asyncio.sleep(0))
        else:
            time.sleep(0.05)
        out["levels"].append(level)
        out["ns_per_pair"].append(median_ns_per(pair, cfg["growth_pairs"], cfg["growth_repeats"]))
        if level == cfg["gc_live"]:
            out["gc_collect_ms"][str(level)] = gc_time()
        if timer is not None:
            out.setdefault("pending", []).append(timer.pending_timeouts())
    return out


# ---- burst: many timeouts due in one tick ----


def counter(n: int, on_done, takes_arg: bool):
    """Returns a callback counting its calls (with one argument, a task of
    new_timeout; with none, a loop callback), and the times of its first
    and n-th calls, filled in as they happen."""
    times = [0.0, 0.0]
    count = 0
    mono = time.monotonic

    def tick() -> None:
        nonlocal count
        count += 1
        if count == 1:
            times[0] = mono()
        elif count == n:
            times[1] = mono()
            on_done()

    if not takes_arg:
        return tick, times

    def task(timeout) -> None:
        nonlocal count
        count += 1
        if count == 1:
            times[0] = mono()
        elif count == n:
            times[1] = mono()
            on_done()

    return task, times


def burst_result(n: int, times: list[float], target: float, scheduled_at: float) -> dict:
    """The burst's rate from the deadline to its last callback (all the
    work of getting through it), and, apart, while callbacks ran."""
    first, last = times
    return {
        "callbacks_per_s": n / (last - target),
        "callbacks_per_s_first_to_last": (n - 1) / (last - first),
        "first_late_ms": (first - target) * 1e3,
        "all_done_after_deadline_ms": (last - target) * 1e3,
        "scheduling_s": scheduled_at,
    }


def child_burst(cfg: dict, impl: str) -> dict:
    n = cfg["burst_n"]
    lead = 0.5 + n * 4e-6  # time to schedule them all, with room to spare
    if impl == "hwtimer":
        timer = new_hwtimer()
        timer.start()
        done = threading.Event()
        c, times = counter(n, done.set, True)
        t0 = time.monotonic()
        target = t0 + lead
        new_timeout, mono = timer.new_timeout, time.monotonic
        for _ in range(n):
            new_timeout(c, target - mono())
        scheduled = time.monotonic() - t0
        if not done.wait(lead + 60):
            raise RuntimeError("burst did not finish")
        stats = timer.stats()
        timer.stop()
        result = burst_result(n, times, target, scheduled)
        result["max_expired_per_tick"] = stats["max_expired_per_tick"]
        return result
    kind = "uvloop" if "uvloop" in impl else "asyncio"
    loop = new_loop(kind)
    fut = loop.create_future()
    c, times = counter(n, lambda: fut.set_result(None), False)
    if impl.startswith("hwtimer"):
        timer = new_hwtimer()

        def schedule_all(target: float) -> None:
            call_later, mono = timer.call_later, time.monotonic
            for _ in range(n):
                call_later(target - mono(), c, loop=loop)

    elif "call_at" in impl:
        timer = None

        def schedule_all(target: float) -> None:
            # one deadline shared by all: the heap's cheapest case
            call_at = loop.call_at
            for _ in range(n):
                call_at(target, c)

    else:
        timer = None

        def schedule_all(target: float) -> None:
            # as a service would: each with its delay, so their deadlines
            # differ by the time it took to get there
            call_later, now = loop.call_later, loop.time
            for _ in range(n):
                call_later(target - now(), c)

    async def main() -> dict:
        t0 = time.monotonic()
        target = loop.time() + lead
        schedule_all(target)
        scheduled = time.monotonic() - t0
        await fut
        return burst_result(n, times, target, scheduled)

    result = loop.run_until_complete(main())
    if timer is not None:
        timer.stop()
    loop.close()
    return result


# ---- producers: threads sharing the work ----


def child_producers(cfg: dict) -> dict:
    total = cfg["producers_total"]
    timer = new_hwtimer()
    pair_hwtimer(timer)(10_000)
    out = {}
    for k in (1, 2, 4):
        runs = []
        for _ in range(3):
            barrier = threading.Barrier(k + 1)
            work = pair_hwtimer(timer)

            def producer(work=work, barrier=barrier, share=total // k):
                barrier.wait()
                work(share)

            threads = [threading.Thread(target=producer) for _ in range(k)]
            for t in threads:
                t.start()
            barrier.wait()
            t0 = time.perf_counter_ns()
            for t in threads:
                t.join()
            runs.append((time.perf_counter_ns() - t0) / 1e9)
        out[str(k)] = statistics.median(runs)
    timer.stop()
    return {"seconds": out, "total_pairs": total}


# ---- lateness ----


def percentiles(values: list[float]) -> dict:
    v = sorted(values)
    n = len(v)
    return {
        "p50_ms": v[(n - 1) // 2] * 1e3,
        "p99_ms": v[(n - 1) * 99 // 100] * 1e3,
        "max_ms": v[-1] * 1e3,
        "min_ms": v[0] * 1e3,
    }


def child_lateness(cfg: dict, impl: str, tick: float) -> dict:
    n = cfg["lateness_n"]
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

        t0 = mono() + 0.5
        for i in range(n):
            timer.new_timeout(task, t0 + i / n - mono())
        if not done.wait(30):
            raise RuntimeError("lateness run did not finish")
        stats = timer.stats()
        timer.stop()
        out = percentiles(lateness)
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
        t0 = loop.time() + 0.5
        for i in range(n):
            loop.call_at(t0 + i / n, cb, t0 + i / n)
        await fut

    loop.run_until_complete(main())
    loop.close()
    return percentiles(lateness)


# ---- instructions (callgrind) ----


def child_instr(impl: str, n: int) -> dict:
    """Does 1000 warm-up pairs, then n: run under callgrind with n and 0."""
    if impl == "hwtimer":
        timer = new_hwtimer()
        run = pair_hwtimer(timer)
        run(1000)
        run(n)
        timer.stop()
    else:
        loop = new_loop(impl)
        run = pair_loop(loop, loop.call_later)
        run(1000)
        run(n)
        loop.close()
    return {}


def callgrind_total(impl: str, n: int, outdir: str) -> tuple[int, str]:
    out_file = os.path.join(outdir, f"callgrind.{impl}.{n}")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "instr",
        json.dumps([impl, n]),
    ]
    env = child_env()
    env["PYTHONHASHSEED"] = "0"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    m = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"callgrind failed: {proc.stderr[-2000:]}")
    return int(m.group(1)), out_file


def function_counts(out_file: str) -> dict[str, int]:
    """callgrind_annotate's instruction count of every function, by name."""
    cmd = ["callgrind_annotate", "--auto=no", "--threshold=100", out_file]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    counts: dict[str, int] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+)", line)
        if m and ":" in m.group(2):
            name = re.sub(r"'\d+$", "", m.group(2).rsplit("/", 1)[-1])
            counts[name] = counts.get(name, 0) + int(m.group(1).replace(",", ""))
    return counts


def per_pair_profile(base_file: str, out_file: str, n: int, limit: int = 15) -> list[list]:
    """The functions that account for a pair: [name, instructions per pair],
    the difference between the run with n pairs and the one with none."""
    if not shutil.which("callgrind_annotate"):
        return []
    base, full = function_counts(base_file), function_counts(out_file)
    diff = {k: (v - base.get(k, 0)) / n for k, v in full.items()}
    top = sorted(diff.items(), key=lambda kv: -kv[1])[:limit]
    return [[k, round(v, 1)] for k, v in top]


def bench_instructions(cfg: dict) -> dict:
    if not shutil.which("valgrind"):
        return {"skipped": "valgrind not found"}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for impl in ("hwtimer", "asyncio"):
            n = cfg["instr_n"][impl]
            base, base_file = callgrind_total(impl, 0, tmp)
            total, out_file = callgrind_total(impl, n, tmp)
            out[impl] = {
                "instructions_per_pair": (total - base) / n,
                "n": n,
                "functions_per_pair": per_pair_profile(base_file, out_file, n),
            }
    return out


# ---- the driver ----


def child_env() -> dict:
    env = dict(os.environ)
    env.pop("HWTIMER_WAKE_EVERY_TICK", None)
    env["PYTHONPATH"] = os.pathsep.join(PYTHONPATH + [ROOT])
    return env


def run_child(name: str, *args, timeout: float = 600) -> dict:
    """Runs child_<name>(*args) in a fresh interpreter; returns its dict."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, json.dumps(list(args))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark {name} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def version_of(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    hw_version = version_of("hwtimer")
    if hw_version is None:
        with open(os.path.join(ROOT, "pyproject.toml")) as f:
            m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
        hw_version = m.group(1) if m else "unknown"
    valgrind = None
    if shutil.which("valgrind"):
        proc = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
        valgrind = proc.stdout.strip()
    mem = None
    with open("/proc/meminfo") as f:
        m = re.search(r"MemTotal:\s+(\d+) kB", f.read())
        mem = int(m.group(1)) * 1024 if m else None
    import hwtimer

    source = {"extension": os.path.abspath(hwtimer._hwtimer.__file__)}
    if shutil.which("git") and os.path.isdir(os.path.join(ROOT, ".git")):

        def git(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)

        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "src")
        source["checkout_commit"] = head.stdout.strip()
        source["checkout_src_modified"] = bool(dirty.stdout.strip())
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": {
            "hwtimer": hw_version,
            "uvloop": version_of("uvloop"),
            "matplotlib": version_of("matplotlib"),
            "pyperf": version_of("pyperf"),
            "valgrind": valgrind,
        },
        "hwtimer_config": {"tick_duration": TICK, "ticks_per_wheel": WHEEL},
        "hwtimer_source": source,
        "load_average_at_start": os.getloadavg(),
    }


def ratio(base: float, x: float) -> float:
    return base / x if x else float("nan")


BURST_IMPLS = (
    "hwtimer",
    "asyncio call_later",
    "asyncio call_at (one deadline)",
    "uvloop call_later",
    "hwtimer call_later (asyncio loop)",
)


def burst_base(b: dict) -> float:
    """asyncio's better burst rate of its two ways: the ratio's base."""
    return max(b[k]["callbacks_per_s"] for k in b if k.startswith("asyncio"))


def check_figures(r: dict) -> dict:
    """Each figure of issue 3: the measured number, and met or missed."""
    out = {}
    if "pair" in r:
        x = r["pair"]["ratio_vs_asyncio"]["hwtimer"]
        out["pair"] = {"value": x, "unit": "x", "met": x >= 15}
    if "memory" in r:
        x = r["memory"]["rss"]["hwtimer"]["bytes_per_timeout"]
        out["memory"] = {"value": x, "unit": "bytes", "met": x <= 96}
    if "growth" in r:
        g = r["growth"]["hwtimer"]
        by = dict(zip(g["levels"], g["ns_per_pair"]))
        if 1_000 in by and 1_000_000 in by:
            x = by[1_000_000] / by[1_000]
            out["growth"] = {"value": x, "unit": "x", "met": x <= 1.5}
    if "burst" in r:
        b = r["burst"]
        x = b["hwtimer"]["callbacks_per_s"] / burst_base(b)
        out["burst"] = {"value": x, "unit": "x", "met": x >= 10}
    if "producers" in r:
        s = r["producers"]["seconds"]
        x = s["4"] / s["1"]
        out["producers"] = {"value": x, "unit": "x the 1-thread time", "met": x <= 1.0}
    for k, v in out.items():
        v["target"] = FIGURES[k]
    return out


def plot_growth(growth: dict, machine: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for impl, style in (("hwtimer", "o-"), ("asyncio", "s--"), ("uvloop", "^:")):
        g = growth.get(impl)
        if g:
            ax.plot(g["levels"], g["ns_per_pair"], style, label=impl)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("timeouts pending")
    ax.set_ylabel("schedule + cancel (ns per pair)")
    ax.set_title("Pair cost against live timers")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.text(
        0.01, 0.01, f"{machine['cpu']}, {machine['cores']} cores, {machine['python']}", fontsize=7
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def fmt_ns(x: float) -> str:
    return f"{x:,.0f} ns" if x >= 100 else f"{x:.1f} ns"


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"\nhwtimer {m['versions']['hwtimer']} on {m['cpu']}, {m['cores']} cores, {m['python']}")
    print(f"hwtimer timer: tick {TICK * 1e3:g} ms, {WHEEL} buckets\n")
    if "pair" in r:
        p, cpu = r["pair"]["ns_per_pair"], r["pair"]["cpu_ns_per_pair"]
        rat = r["pair"]["ratio_vs_asyncio"]
        print("1. schedule + cancel, random delays 1-60 s (wall; CPU of the whole process)")
        print(f"   {'':<36}{'per pair':>12}{'vs asyncio':>12}{'CPU':>12}")
        for k, v in sorted(p.items(), key=lambda kv: kv[1]):
            print(f"   {k:<36}{fmt_ns(v):>12}{rat[k]:>11.1f}x{fmt_ns(cpu[k]):>12}")
    if "memory" in r:
        mem = r["memory"]
        print("\n2. memory per pending timeout, 1M pending (bytes)")
        print(f"   {'':<12}{'RSS':>10}{'tracemalloc':>13}{'vs asyncio':>12}")
        base = mem["rss"]["asyncio"]["bytes_per_timeout"]
        for k in mem["rss"]:
            rss = mem["rss"][k]["bytes_per_timeout"]
            tm = mem["tracemalloc"].get(k, {}).get("bytes_per_timeout", float("nan"))
            print(f"   {k:<12}{rss:>10.1f}{tm:>13.1f}{ratio(base, rss):>11.1f}x")
    if "growth" in r:
        g = r["growth"]
        print("\n3. schedule + cancel with timeouts pending (ns per pair)")
        levels = g["hwtimer"]["levels"]
        print("   " + f"{'pending':<12}" + "".join(f"{k:>12}" for k in g))
        for i, level in enumerate(levels):
            cells = []
            for k in g:
                v = g[k]["ns_per_pair"]
                cells.append(f"{v[i]:>12,.0f}" if i < len(v) else f"{'-':>12}")
            print(f"   {level:<12,}" + "".join(cells))
        print("   full gc.collect() (ms):")
        for k in g:
            gcm = g[k]["gc_collect_ms"]
            cells = ", ".join(f"{int(n):,} pending: {v:.1f}" for n, v in gcm.items())
            print(f"     {k:<10}{cells}")
    if "burst" in r:
        b = r["burst"]
        base = burst_base(b)
        print(f"\n4. burst: {r['config']['burst_n']:,} timeouts due in one tick")
        print("   callbacks/s from the deadline to the last callback, against asyncio's better")
        print("   way; first: first callback's lateness; run rate: first callback to last")
        cols = f"{'callbacks/s':>12}{'vs asyncio':>11}{'first':>9}{'last':>9}{'run rate':>12}"
        print(f"   {'':<36}{cols}")
        for k, v in b.items():
            print(
                f"   {k:<36}{v['callbacks_per_s']:>12,.0f}{v['callbacks_per_s'] / base:>10.1f}x"
                f"{v['first_late_ms']:>6.0f} ms{v['all_done_after_deadline_ms']:>6.0f} ms"
                f"{v['callbacks_per_s_first_to_last']:>12,.0f}"
            )
    if "producers" in r:
        s = r["producers"]["seconds"]
        print(f"\n5. producers: {r['producers']['total_pairs']:,} pairs shared by k threads")
        for k, v in s.items():
            print(f"   {k} thread(s): {v * 1e3:8.1f} ms  ({v / s['1']:.2f}x the 1-thread time)")
    if "lateness" in r:
        print("\n6. lateness, 100k timeouts over 1 s: task start - deadline (ms)")
        print(f"   {'':<28}{'p50':>8}{'p99':>8}{'max':>8}{'min':>8}")
        for k, v in r["lateness"].items():
            cells = "".join(f"{v[q]:>8.3f}" for q in ("p50_ms", "p99_ms", "max_ms", "min_ms"))
            print(f"   {k:<28}{cells}")
    if "instructions" in r:
        ins = r["instructions"]
        print("\n7. instructions per schedule + cancel (callgrind, all threads)")
        if "skipped" in ins:
            print(f"   skipped: {ins['skipped']}")
        else:
            base = ins["asyncio"]["instructions_per_pair"]
            for k, v in ins.items():
                x = v["instructions_per_pair"]
                print(f"   {k:<12}{x:>10,.0f}{ratio(base, x):>8.1f}x")
    if "idle" in r:
        from idle import format_table

        print("\n8. idle cost (per second of wall time)")
        print("   " + format_table(r["idle"]).replace("\n", "\n   "))
    if r.get("figures"):
        print("\nfigures of issue 3:")
        for k, v in r["figures"].items():
            verdict = "met" if v["met"] else "MISSED"
            print(f"   {k:<10} {v['value']:.2f} {v['unit']:<20} target {v['target']}: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description="hwtimer benchmarks")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, about a minute")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, params = args.child
        print(json.dumps(globals()[f"child_{name}"](*json.loads(params))))
        return

    cfg = QUICK if args.quick else FULL
    names = ["pair", "memory", "growth", "burst", "producers", "lateness", "instructions", "idle"]
    todo = args.only or names
    r: dict = {"machine": machine_info(), "config": dict(cfg, quick=args.quick)}
    started = time.monotonic()

    def step(name: str, fn) -> None:
        if name not in todo:
            return
        t0 = time.monotonic()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        r[name] = fn()
        print(f"  {name}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)

    step("pair", lambda: run_child("pair", cfg))
    step("memory", lambda: bench_memory(cfg))
    impls = ("hwtimer", "asyncio", "uvloop")
    step("growth", lambda: {k: run_child("growth", cfg, k) for k in impls})
    step(
        "burst",
        lambda: {k: run_child("burst", cfg, k) for k in BURST_IMPLS},
    )
    step("producers", lambda: run_child("producers", cfg))
    step(
        "lateness",
        lambda: {
            "hwtimer, tick 1 ms": run_child("lateness", cfg, "hwtimer", 0.001),
            "hwtimer, tick 10 ms": run_child("lateness", cfg, "hwtimer", 0.010),
            "asyncio": run_child("lateness", cfg, "asyncio", 0),
            "uvloop": run_child("lateness", cfg, "uvloop", 0),
        },
    )
    step("instructions", lambda: bench_instructions(cfg))
    if "idle" in todo:
        sys.path.insert(0, HERE)
        import idle

        step("idle", lambda: idle.run_all(cfg["idle_seconds"]))
    r["figures"] = check_figures(r)
    r["total_seconds"] = time.monotonic() - started
    r["resource"] = {"max_rss_children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}

    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "results.json"), "w") as f:
        json.dump(r, f, indent=2)
    if "growth" in r:
        plot_growth(r["growth"], r["machine"], os.path.join(RESULTS, "growth.png"))
    print_report(r)
    wrote = "results.json" + (" and growth.png" if "growth" in r else "")
    print(f"\nwrote {wrote} in {os.path.relpath(RESULTS)} ({r['total_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
