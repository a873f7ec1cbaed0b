"""What far-off deadlines cost: the hierarchical wheel against a single-level one.

A single-level wheel visits every timeout once per turn until it is due, so
a timer holding a million timeouts an hour away keeps its worker busy while
nothing is due.  The hierarchical wheel keeps them on coarser levels until
they come close.  Each scenario runs in a fresh process, once for the
hwtimer under test and once for a baseline build:

* ``far``: N timeouts (1,000,000 and 5,000,000) due in about an hour on a
  1 ms x 4096 timer (the shared timer's settings), measured while nothing
  is due: worker CPU as % of a core, its wake-ups per second, and RSS bytes
  per pending timeout, the Python object included;
* ``pair``: schedule then cancel (random delays of 1 to 60 s), ns per pair;
  and, when valgrind is installed, the instructions of a pair (callgrind,
  all threads: a run of N pairs minus a run of none), the figure a busy
  machine does not move;
* ``turns``: worker CPU time per timeout for timeouts that fire after k
  turns of the wheel, k = 1, 10, 1000 (1 ms x 8: one turn is 8 ms).

Worker CPU comes from ``/proc/self/task/<tid>/schedstat``, wake-ups from
``timer.stats()``, times from ``time.perf_counter_ns``; figures are medians
over ``--repeats`` runs.

Usage::

    python benchmarks/far_deadlines.py [--quick] [--repeats 3]
        [--baseline DIR | --baseline-rev REV]

``benchmarks/run.py`` runs the ``far`` and ``turns`` scenarios of this
hwtimer (``run()``), each of its ``--repeats`` rounds in fresh interpreters,
and prints them beside the single-level wheel's figures, measured once when
the hierarchical wheel replaced it (``SINGLE_LEVEL``).

``--baseline DIR`` names a checkout whose extension is built in place;
``--baseline-rev REV`` exports git revision REV of this repository to a
temporary directory and builds it there (``python setup.py build_ext
--inplace``).  Without either, only the hwtimer that ``import hwtimer``
finds is measured.  ``main()`` is the entry point; ``run_all()`` returns
the rows for another script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

THREAD = "farbench"


def _thread_cpu_ns(name: str) -> int:
    """CPU time in ns of this process's thread named `name`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                return int(f.read().split()[0])
        except OSError:
            continue
    raise RuntimeError(f"no thread named {name!r}")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _noop(timeout: object) -> None:
    pass


def measure_far(n: int, seconds: float) -> dict:
    """n timeouts due in about an hour; the worker while nothing is due."""
    import hwtimer

    timer = hwtimer.HashedWheelTimer(0.001, 4096, thread_name=THREAD)
    timer.start()
    rng = random.Random(n)
    time.sleep(0.2)
    rss0 = _rss_bytes()
    for _ in range(n):  # the timer keeps each Timeout alive while it is pending
        timer.new_timeout(_noop, 3600 + 60 * rng.random())
    rss1 = _rss_bytes()
    time.sleep(2.0)  # the worker moves them into the wheel
    cpu0, wake0, t0 = _thread_cpu_ns(THREAD), timer.stats()["wakeups"], time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    cpu1, wake1 = _thread_cpu_ns(THREAD), timer.stats()["wakeups"]
    t_stop = time.perf_counter_ns()
    returned = len(timer.stop())
    stop_ms = (time.perf_counter_ns() - t_stop) / 1e6
    return {
        "n": n,
        "worker_cpu_pct": (cpu1 - cpu0) / 1e7 / elapsed,
        "wakeups_per_s": (wake1 - wake0) / elapsed,
        "bytes_per_timeout": (rss1 - rss0) / n,
        "stop_ms": stop_ms,
        "returned": returned,
    }


def measure_pair(n: int) -> dict:
    """Schedule then cancel, ns per pair."""
    import hwtimer

    timer = hwtimer.HashedWheelTimer(0.001, 4096, thread_name=THREAD)
    timer.start()
    rng = random.Random(1)
    delays = [1 + 59 * rng.random() for _ in range(1000)]
    new_timeout = timer.new_timeout
    t0 = time.perf_counter_ns()
    for i in range(n):
        new_timeout(_noop, delays[i % 1000]).cancel()
    ns = (time.perf_counter_ns() - t0) / max(n, 1)
    timer.stop()
    return {"n": n, "pair_ns": ns}


def measure_turns(k: int, n: int) -> dict:
    """Worker CPU per timeout for n timeouts that fire after k turns."""
    import threading

    import hwtimer

    wheel, tick = 8, 0.001
    timer = hwtimer.HashedWheelTimer(tick, wheel, thread_name=THREAD)
    timer.start()
    time.sleep(0.1)
    done = threading.Event()
    left = [n]

    def task(timeout: object) -> None:
        left[0] -= 1
        if not left[0]:
            done.set()

    rng = random.Random(k)
    cpu0 = _thread_cpu_ns(THREAD)
    turn = tick * wheel
    for _ in range(n):
        timer.new_timeout(task, k * turn + turn * rng.random())
    if not done.wait(k * turn * 4 + 120):
        raise RuntimeError("the timeouts did not fire")
    cpu = _thread_cpu_ns(THREAD) - cpu0
    timer.stop()
    return {"k": k, "n": n, "worker_ns_per_timeout": cpu / n}


MEASURES = {"far": measure_far, "pair": measure_pair, "turns": measure_turns}

# run.py's sizes: the `far` counts, the seconds the worker is watched, the
# turns and how many timeouts fire after each
SIZES = {
    "full": {
        "far": [1_000_000, 5_000_000],
        "seconds": 3.0,
        "turns": [1, 10, 1000],
        "turns_n": 20_000,
    },
    "quick": {"far": [100_000, 500_000], "seconds": 2.0, "turns": [1, 10, 100], "turns_n": 2_000},
    "tiny": {"far": [10_000], "seconds": 0.3, "turns": [1, 10], "turns_n": 200},
}
# The single-level wheel, measured once with --baseline-rev 3a23a9c~1 (the
# revision before the hierarchical wheel) on the machine of the README's
# figures, 1 ms x 4096, medians of three runs: it is no longer built.
SINGLE_LEVEL = {
    "far": {
        "1000000": {"worker_cpu_pct": 11.2, "wakeups_per_s": 436, "stop_ms": 2700},
        "5000000": {"worker_cpu_pct": 44.2},
    },
    "turns": {"1": 180, "10": 1311, "1000": 78984},
}


def run(cfg: dict) -> dict:
    """run.py's entry: `repeats` rounds of the far and turns scenarios, each
    in a fresh interpreter, folded into medians with min-max."""
    from common import run_child, summarize

    rounds = []
    for _ in range(cfg["repeats"]):
        far = {
            str(n): run_child("far_deadlines", "measure_far", n, cfg["seconds"]) for n in cfg["far"]
        }
        turns = {
            str(k): run_child("far_deadlines", "measure_turns", k, cfg["turns_n"])
            for k in cfg["turns"]
        }
        rounds.append({"far": far, "turns": turns})
    return summarize(rounds)


def report(r: dict) -> list[str]:
    from common import fmt

    lines = ["timeouts due in about an hour, 1 ms x 4096, while nothing is due:"]
    for n, f in r["far"].items():
        lines.append(
            f"  {int(n):>9,}: worker {fmt(f['worker_cpu_pct'], '.2f')} % of a core,"
            f" {fmt(f['wakeups_per_s'], ',.1f')} wake-ups/s,"
            f" {fmt(f['bytes_per_timeout'], '.1f')} bytes each, stop() {fmt(f['stop_ms'])} ms"
        )
    lines.append("worker ns per timeout fired after k turns (1 ms x 8):")
    for k, t in r["turns"].items():
        lines.append(f"  k = {int(k):>4}: {fmt(t['worker_ns_per_timeout'])}")
    return lines


def _env(path: str | None) -> dict:
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(([path] if path else []) + paths)
    return env


def _callgrind_total(path: str | None, n: int, outdir: str) -> int:
    out_file = os.path.join(outdir, f"callgrind.{n}")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}"]
    cmd += [sys.executable, os.path.abspath(__file__), "--child", json.dumps(["pair", [n]])]
    proc = subprocess.run(cmd, env=_env(path), capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind failed: {proc.stderr[-2000:]}")
    with open(out_file) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError("no total in callgrind's output")


def measure_pair_instructions(path: str | None, n: int) -> dict:
    """Instructions of one schedule + cancel, all threads, by callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        base = _callgrind_total(path, 0, tmp)
        total = _callgrind_total(path, n, tmp)
    return {"n": n, "pair_instructions": (total - base) / n}


def _child(path: str | None, name: str, args: list) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps([name, args])]
    out = subprocess.run(cmd, env=_env(path), capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        from common import exit_status

        status = exit_status(out.returncode)
        raise RuntimeError(f"{name} child failed ({status}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_row(rows: list[dict]) -> dict:
    row = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, float):
            row[key] = statistics.median(r[key] for r in rows)
    return row


def run_all(baseline: str | None, quick: bool = False, repeats: int = 3) -> list[dict]:
    """Rows of figures: each scenario for "levels" (the hwtimer found first)
    and, given a baseline directory, for "single" (the baseline)."""
    sizes = [100_000, 500_000] if quick else [1_000_000, 5_000_000]
    seconds = 3.0 if quick else 10.0
    cases = [("far", [n, seconds]) for n in sizes]
    cases += [("pair", [100_000 if quick else 200_000])]
    cases += [("turns", [k, 2_000 if quick else 20_000]) for k in (1, 10, 1000)]
    builds = [("levels", None)] + ([("single", baseline)] if baseline else [])
    rows = []
    for name, args in cases:
        for build, path in builds:
            runs = [_child(path, name, args) for _ in range(repeats)]
            rows.append({"scenario": name, "build": build, **_median_row(runs)})
    if shutil.which("valgrind"):
        for build, path in builds:
            row = measure_pair_instructions(path, 20_000 if quick else 100_000)
            rows.append({"scenario": "pair_instructions", "build": build, **row})
    return rows


def format_table(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        if r["scenario"] == "far":
            what = (
                f"{r['n']:>9,} an hour away: worker {r['worker_cpu_pct']:6.2f} % of a core, "
                f"{r['wakeups_per_s']:7.1f} wake-ups/s, {r['bytes_per_timeout']:5.1f} bytes each, "
                f"stop() {r['stop_ms']:.0f} ms"
            )
        elif r["scenario"] == "pair":
            what = f"schedule + cancel: {r['pair_ns']:.0f} ns a pair"
        elif r["scenario"] == "pair_instructions":
            what = f"schedule + cancel: {r['pair_instructions']:.0f} instructions a pair"
        else:
            ns = r["worker_ns_per_timeout"]
            what = f"fired after {r['k']:>4} turns: {ns:9.0f} worker ns each"
        lines.append(f"{r['build']:<7} {what}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, shorter runs")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--baseline", help="a checkout of the single-level wheel, built in place")
    group.add_argument("--baseline-rev", help="a git revision to build and compare against")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1: a figure is the median of its runs")
    if args.child:
        name, params = json.loads(args.child)
        print(json.dumps(MEASURES[name](*params)))
        return
    # imported here, past the children's return: common puts the checkout on
    # sys.path, and a child (this file with --child) measures the hwtimer
    # that PYTHONPATH or the installed package gives it
    from common import build_revision

    tmp = tempfile.mkdtemp(prefix="hwtimer-baseline.") if args.baseline_rev else None
    try:
        try:
            baseline = build_revision(args.baseline_rev, tmp) if tmp else args.baseline
        except RuntimeError as e:
            parser.error(f"--baseline-rev {args.baseline_rev}: {e}")
        rows = run_all(baseline, args.quick, args.repeats)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
