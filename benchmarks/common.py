"""What the benchmarks share: the timers and loops they measure, the
workload every implementation gets, and running a measurement in a fresh
interpreter, and building another revision of this checkout to measure
beside it.

``python benchmarks/common.py MODULE FUNCTION JSON`` is that fresh
interpreter: it calls ``MODULE.FUNCTION(*JSON)`` and prints the returned
dict as one line of JSON, which ``run_child`` reads back.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The checkout's hwtimer (built in place) comes before an installed one, but
# after what PYTHONPATH names, so that another build can be measured.
PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if ROOT not in sys.path:
    sys.path.insert(1 + len(PYTHONPATH), ROOT)

TICK = 0.001
WHEEL = 4096
SEED = 20240611


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


# ---- repeated figures ----


def summary(runs: list[float]) -> dict:
    """A figure measured several times: its median, min, max and the runs."""
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs), "runs": runs}


def spread(s: dict) -> float:
    """(max - min) / |median| of a summary: how much the runs disagree (a
    lateness can be below zero: its spread is no less for that).  Runs
    that disagree about a median of 0 are infinitely far apart for it, and
    runs that all agree are 0 apart, a median of 0 or not."""
    if s["median"]:
        return (s["max"] - s["min"]) / abs(s["median"])
    return math.inf if s["max"] != s["min"] else 0.0


def within_noise(a: dict, b: dict) -> bool:
    """Whether two summaries differ by no more than their runs do: each
    median lies within the other's min-max."""
    return a["min"] <= b["median"] <= a["max"] and b["min"] <= a["median"] <= b["max"]


def fmt(s: dict, spec: str = ",.0f") -> str:
    """'142 (138-150)': the median, then min-max."""
    return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def summarize(rounds: list[dict]) -> dict:
    """The runs of a measurement, each a dict (possibly nested) of numbers,
    folded into one dict of the same shape whose numbers are summaries.
    Values that are not numbers are taken from the last run."""
    first = rounds[-1]
    out: dict = {}
    for k, v in first.items():
        if isinstance(v, dict):
            out[k] = summarize([r[k] for r in rounds])
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = summary([r[k] for r in rounds])
        else:
            out[k] = v
    return out


def per_round(fn, *series: list[float]) -> dict:
    """summary of fn(a, b, ...) taken round by round over the series: a
    ratio of two implementations measured in the same round."""
    return summary([fn(*xs) for xs in zip(*series)])


# ---- the schedule + cancel pair ----
#
# Each returns a function doing n pairs over the shared delays.  Event loops
# run while they do: every 10000 pairs the loop turns once, so asyncio does
# the clean-up of cancelled handles that a live service pays for.


def pair_hwtimer(timer):
    """n pairs of timer.new_timeout(noop, d).cancel(); anything with the
    same two calls (the floor extension's) can stand in for the timer."""
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


# ---- fresh interpreters ----


def exit_status(returncode: int) -> str:
    """How a process ended, for an error: a crash in C (a signal) leaves
    nothing on stderr but this."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit status {returncode}"


def child_env() -> dict:
    env = dict(os.environ)
    env.pop("HWTIMER_WAKE_EVERY_TICK", None)
    env["PYTHONPATH"] = os.pathsep.join(PYTHONPATH + [ROOT])
    return env


def child_command(module: str, function: str, *args) -> list[str]:
    """The command that runs module.function(*args) in a fresh interpreter."""
    return [sys.executable, os.path.abspath(__file__), module, function, json.dumps(list(args))]


def run_child(module: str, function: str, *args, timeout: float = 600) -> dict:
    """Runs module.function(*args) in a fresh interpreter; returns its dict."""
    cmd = child_command(module, function, *args)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"benchmark {module}.{function} failed ({exit_status(proc.returncode)}):\n"
            f"{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- another revision ----


def build_revision(rev: str, into: str) -> str:
    """Exports git revision `rev` of this checkout into `into` and builds its
    extension in place; returns the directory to put on PYTHONPATH.  Raises
    RuntimeError with git's, tar's or the build's message when one fails."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True)
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {rev} failed: {archive.stderr.decode().strip()}")
    tar = subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, capture_output=True)
    if tar.returncode != 0:
        raise RuntimeError(f"extracting {rev} into {into} failed: {tar.stderr.decode().strip()}")
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=into,
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        raise RuntimeError(f"building {rev} failed:\n{build.stderr[-4000:]}")
    return into


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    name, func, params = sys.argv[1:4]
    print(json.dumps(getattr(importlib.import_module(name), func)(*json.loads(params))))
