"""What the stable-ABI (abi3) build costs against the full-API build.

One command builds both from this checkout and measures them side by side::

    python benchmarks/abi3.py [--repeats 9] [--quick | --size tiny] [--json PATH]

It builds the extension twice into temporary directories, as pip installs
it (``HWTIMER_LIMITED_API=0`` and ``=1``), then runs the cases below in
fresh interpreters, one build after the other, alternating which goes
first, for ``--repeats`` rounds.  Each figure is the median over the rounds
with the minimum and maximum beside it, and the last column is the abi3
build's figure over the full build's in the same round, median (min-max).
``--quick`` runs smaller sizes; ``--size tiny`` is a smoke test whose
figures mean nothing (the two builds take most of its time).
``benchmarks/run.py --module abi3`` runs it with the other benchmarks.

Cases, each in ns per operation, on two clocks: wall time
(``time.perf_counter_ns``) and the CPU time of the thread doing the work
(``time.thread_time_ns``), the steadier one on a machine shared with other
work:

1. pair: ``new_timeout`` then ``cancel()`` (random delays of 1 to 60 s);
2. burst: 100k ``new_timeout`` tasks due in the same tick, per task from
   the first call to the last on the dispatch thread;
3. loop burst: the same with ``call_later`` callbacks on an asyncio loop;
4. scope: ``async with hwtimer.timeout(10): pass`` in one task.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import glob
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILDS = {"full": "0", "abi3": "1"}  # name: HWTIMER_LIMITED_API
CASES = ["pair", "burst", "loop burst", "scope"]
CLOCKS = ["wall", "cpu"]  # the order of a case's two figures
# operations of each case: the pair's, the bursts' tasks, the scopes
SIZES = {
    "full": {"pair": 200_000, "burst": 100_000, "scope": 100_000},
    "quick": {"pair": 50_000, "burst": 20_000, "scope": 20_000},
    "tiny": {"pair": 2_000, "burst": 1_000, "scope": 500},
}

# ---- the cases, run in a worker process ----


def noop(*args) -> None:
    pass


def clocks() -> tuple[int, int]:
    return time.perf_counter_ns(), time.thread_time_ns()


def per_op(start: tuple[int, int], end: tuple[int, int], n: int) -> list[float]:
    """[wall, cpu] ns per operation from two clocks() readings."""
    return [(e - s) / n for s, e in zip(start, end)]


def median_of(runs: list[list[float]]) -> list[float]:
    return [statistics.median(r[i] for r in runs) for i in range(2)]


def case_pair(n: int) -> list[float]:
    import hwtimer

    with hwtimer.HashedWheelTimer(0.001, 4096) as timer:
        new_timeout = timer.new_timeout
        delays = [random.uniform(1.0, 60.0) for _ in range(1000)]
        for d in delays * 10:  # warm the free list and the caches
            new_timeout(noop, d).cancel()
        runs = []
        for _ in range(3):
            t0 = clocks()
            for i in range(n):
                new_timeout(noop, delays[i % 1000]).cancel()
            runs.append(per_op(t0, clocks(), n))
        return median_of(runs)


def counting(n: int, on_done):
    """A callback that counts its calls and notes the clocks() of the first
    and the n-th: the burst's span, all on the thread that runs them."""
    times = [(0, 0), (0, 0)]
    count = 0

    def callback(*args) -> None:
        nonlocal count
        count += 1
        if count == 1:
            times[0] = clocks()
        elif count == n:
            times[1] = clocks()
            on_done()

    return callback, times


def case_burst(n: int) -> list[float]:
    import hwtimer

    with hwtimer.HashedWheelTimer(0.001, 4096) as timer:
        done = threading.Event()
        task, times = counting(n, done.set)
        target = time.monotonic() + 0.2 + n * 4e-6
        new_timeout, mono = timer.new_timeout, time.monotonic
        for _ in range(n):
            new_timeout(task, target - mono())
        if not done.wait(120):
            raise RuntimeError("burst did not finish")
    return per_op(times[0], times[1], n - 1)


def case_loop_burst(n: int) -> list[float]:
    import hwtimer

    loop = asyncio.new_event_loop()
    with hwtimer.HashedWheelTimer(0.001, 4096) as timer:
        fut = loop.create_future()
        callback, times = counting(n, lambda: fut.set_result(None))

        async def main() -> None:
            target = time.monotonic() + 0.2 + n * 6e-6
            call_later, mono = timer.call_later, time.monotonic
            for _ in range(n):
                call_later(target - mono(), callback)
            await asyncio.wait_for(fut, 120)

        loop.run_until_complete(main())
    loop.close()
    return per_op(times[0], times[1], n - 1)


def case_scope(n: int) -> list[float]:
    import hwtimer

    loop = asyncio.new_event_loop()
    with hwtimer.HashedWheelTimer(0.001, 4096) as timer:

        async def scopes(k: int) -> list[float]:
            t0 = clocks()
            for _ in range(k):
                async with hwtimer.timeout(10, timer=timer):
                    pass
            return per_op(t0, clocks(), k)

        loop.run_until_complete(scopes(n // 10))  # warm up
        runs = [loop.run_until_complete(scopes(n)) for _ in range(3)]
    loop.close()
    return median_of(runs)


def worker(sizes: dict) -> dict:
    import hwtimer._hwtimer as ext

    random.seed(15)
    return {
        "module": os.path.basename(ext.__file__),
        "pair": case_pair(sizes["pair"]),
        "burst": case_burst(sizes["burst"]),
        "loop burst": case_loop_burst(sizes["burst"]),
        "scope": case_scope(sizes["scope"]),
    }


# ---- the driver ----
#
# It takes common.py's helpers where it needs them, not at the top: importing
# common.py puts the checkout on sys.path, and the worker must import the
# build it is given, or the installed one, never the checkout's.


def copy_checkout(dest: str) -> None:
    """Copies the checkout without its build products, so that no stale
    extension of the other build slips into this one."""
    ignore = shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", "*.so", ".*_cache", "results"
    )
    shutil.copytree(ROOT, dest, ignore=ignore)


def build(name: str, limited: str, tmp: str) -> str:
    """Installs the package built with HWTIMER_LIMITED_API=`limited` into a
    directory of its own; returns that directory."""
    src, target = os.path.join(tmp, f"src-{name}"), os.path.join(tmp, name)
    copy_checkout(src)
    env = dict(os.environ, HWTIMER_LIMITED_API=limited)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir"]
    subprocess.run(cmd + ["--target", target, src], check=True, env=env)
    found = [os.path.basename(p) for p in glob.glob(os.path.join(target, "hwtimer", "*.so"))]
    want_abi3 = limited == "1"
    if len(found) != 1 or found[0].endswith(".abi3.so") != want_abi3:
        raise RuntimeError(f"the {name} build holds {found}, not one {name} extension")
    return target


def run_worker(path: str, sizes: dict, cwd: str) -> dict:
    env = dict(os.environ, PYTHONPATH=path)
    env.pop("HWTIMER_WAKE_EVERY_TICK", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(sizes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=900)
    if proc.returncode != 0:
        from common import exit_status

        raise RuntimeError(
            f"worker failed ({exit_status(proc.returncode)}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table_of(rounds: dict, clock: int) -> dict:
    """Per case, each build's summary of one clock (0: wall, 1: CPU) over
    the rounds, and the abi3 build's figure over the full build's, round by
    round."""
    from common import per_round, summary

    out = {}
    for case in CASES:
        series = {name: [r[case][clock] for r in rounds[name]] for name in BUILDS}
        row = {name: summary(v) for name, v in series.items()}
        row["abi3/full"] = per_round(lambda a, f: a / f, series["abi3"], series["full"])
        out[case] = row
    return out


def run(cfg: dict) -> dict:
    """Both builds, measured for cfg["repeats"] rounds on cfg's sizes: a
    table per clock, of ns per operation."""
    sizes = {k: cfg[k] for k in SIZES["full"]}
    rounds: dict[str, list[dict]] = {name: [] for name in BUILDS}
    with tempfile.TemporaryDirectory(prefix="hwtimer-abi3-") as tmp:
        # the two builds at once: most of a small run's time
        with concurrent.futures.ThreadPoolExecutor(len(BUILDS)) as pool:
            jobs = {name: pool.submit(build, name, lim, tmp) for name, lim in BUILDS.items()}
            paths = {name: job.result() for name, job in jobs.items()}
        for r in range(cfg["repeats"]):
            order = list(BUILDS) if r % 2 == 0 else list(reversed(BUILDS))
            for name in order:
                rounds[name].append(run_worker(paths[name], sizes, tmp))
            print(f"round {r + 1}/{cfg['repeats']} done", file=sys.stderr)
    out: dict = {
        "python": sys.version.split()[0],
        "sizes": sizes,
        "rounds": cfg["repeats"],
        "modules": {name: rounds[name][-1]["module"] for name in BUILDS},
    }
    for i, clock in enumerate(CLOCKS):
        out[clock] = table_of(rounds, i)
    return out


def report(r: dict) -> list[str]:
    from common import fmt

    lines = []
    for clock in CLOCKS:
        lines += [
            f"{clock} ns per operation, median (min-max) of {r['rounds']} interleaved rounds, "
            f"Python {r['python']}",
            f"{'case':<12} {'full API':>22} {'abi3':>22} {'abi3/full':>20}",
        ]
        for case, row in r[clock].items():
            cells = [f"{fmt(row[n]):>22}" for n in BUILDS]
            lines.append(f"{case:<12} {' '.join(cells)} {fmt(row['abi3/full'], '.2f'):>19}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--quick", action="store_true", help="--size quick, a quick check")
    parser.add_argument("--size", choices=list(SIZES), default="full")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1: a figure is the median of its rounds")
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    size = "quick" if args.quick else args.size
    r = run(dict(SIZES[size], repeats=args.repeats))
    print("\n".join(report(r)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
