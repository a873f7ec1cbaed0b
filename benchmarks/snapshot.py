"""What looking costs: pending_snapshot() and stats() with a million pending.

A timer on the shared timer's settings (1 ms x 4096) holds ``--pending``
timeouts (1,000,000 by default) due 1 min to 1 h ahead, all moved into the
wheel.  Then:

* the time one ``pending_snapshot(limit)`` call takes (limits 10, 100 and
  1,000) and one ``stats()`` call, the wheel's spread included: median and
  max of ``--calls`` calls, in microseconds.  A snapshot holds the GIL and
  the wheel's lock for that long: the worker waits that long at most;
* the longest a ``new_timeout()`` or a ``cancel()`` takes on another thread
  (a producer doing schedule + cancel pairs for ``--seconds``) while this
  thread (a) sleeps, (b) runs a busy pure-Python loop, (c) takes snapshots
  back to back.  (b) is what any busy Python thread costs a producer (the
  GIL's switch interval, ``sys.getswitchinterval()``); what (c) adds to it
  is the snapshot's own share.

Times come from ``time.perf_counter_ns``.  Run on an idle machine for
figures worth publishing.  Usage::

    python benchmarks/snapshot.py [--pending N] [--seconds S] [--calls K] [--quick]

``benchmarks/run.py`` runs it too (``run()``): each of its ``--repeats``
runs is a fresh interpreter, and each figure is the median of the runs'
with their min-max.  ``measure(pending, seconds, calls)`` returns one
run's figures as a dict.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time

from common import fmt, run_child, summarize

LIMITS = (10, 100, 1000)
SIZES = {
    "full": {"pending": 1_000_000, "seconds": 3.0, "calls": 200},
    "quick": {"pending": 100_000, "seconds": 1.0, "calls": 50},
    "tiny": {"pending": 10_000, "seconds": 0.3, "calls": 20},
}


def _noop(_timeout: object) -> None:
    pass


def _call_us(fn, calls: int) -> dict:
    """Median and max microseconds of `calls` calls of fn()."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return {"median_us": statistics.median(times), "max_us": max(times)}


def _producer_stalls(timer, seconds: float, busy) -> dict:
    """The longest new_timeout() and cancel() a producer thread sees for
    `seconds` while this thread runs busy(stop_event), and how many pairs
    it made."""
    stop = threading.Event()
    out = {"schedule_max_ms": 0.0, "cancel_max_ms": 0.0, "pairs": 0}

    def producer() -> None:
        rng = random.Random(1)
        worst_s = worst_c = 0
        pairs = 0
        while not stop.is_set():
            t0 = time.perf_counter_ns()
            to = timer.new_timeout(_noop, rng.uniform(1.0, 3600.0))
            t1 = time.perf_counter_ns()
            to.cancel()
            t2 = time.perf_counter_ns()
            worst_s, worst_c = max(worst_s, t1 - t0), max(worst_c, t2 - t1)
            pairs += 1
        out.update(schedule_max_ms=worst_s / 1e6, cancel_max_ms=worst_c / 1e6, pairs=pairs)

    thread = threading.Thread(target=producer)
    thread.start()
    end = time.monotonic() + seconds
    busy(lambda: time.monotonic() >= end)
    stop.set()
    thread.join()
    return out


def _sleep(done) -> None:
    while not done():
        time.sleep(0.01)


def _spin(done) -> None:
    n = 0
    while not done():
        for _ in range(1000):
            n += 1


def measure(pending: int, seconds: float, calls: int) -> dict:
    import hwtimer

    timer = hwtimer.HashedWheelTimer(0.001, 4096, thread_name="snapbench")
    rng = random.Random(pending)
    held = [timer.new_timeout(_noop, rng.uniform(60.0, 3600.0)) for _ in range(pending)]

    def in_wheel() -> int:
        s = timer.stats()
        return sum(lv["timeouts"] for lv in s["levels"])

    deadline = time.monotonic() + 60
    while in_wheel() < pending and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        stats = timer.stats()
        result: dict = {
            "pending": stats["pending"],
            "in_wheel": in_wheel(),
            "switch_interval_ms": sys.getswitchinterval() * 1e3,
            "snapshot": {
                str(limit): _call_us(lambda limit=limit: timer.pending_snapshot(limit), calls)
                for limit in LIMITS
            },
            "stats": _call_us(timer.stats, calls),
            "fullest_bucket": stats["fullest_bucket"],
            "levels": [
                (lv["bucket_seconds"], lv["timeouts"], lv["occupied"]) for lv in stats["levels"]
            ],
        }

        def snapshots(done) -> None:
            while not done():
                timer.pending_snapshot(100)

        result["stalls"] = {
            "idle": _producer_stalls(timer, seconds, _sleep),
            "busy Python loop": _producer_stalls(timer, seconds, _spin),
            "snapshots back to back": _producer_stalls(timer, seconds, snapshots),
        }
    finally:
        timer.stop()
        del held
    return result


def format_lines(r: dict) -> list[str]:
    lines = [
        f"{r['pending']:,} pending ({r['in_wheel']:,} in the wheel), 1 ms x 4096;"
        f" fullest bucket {r['fullest_bucket']:,}",
        "levels (bucket s, timeouts, occupied): "
        + "; ".join(f"{b:g} s: {t:,} in {o:,}" for b, t, o in r["levels"] if t),
    ]
    for limit, t in r["snapshot"].items():
        lines.append(
            f"pending_snapshot({limit}): median {t['median_us']:,.0f} us, max {t['max_us']:,.0f} us"
        )
    t = r["stats"]
    lines.append(f"stats(): median {t['median_us']:,.0f} us, max {t['max_us']:,.0f} us")
    lines.append(
        f"longest schedule / cancel on another thread (switch interval"
        f" {r['switch_interval_ms']:g} ms), while this thread:"
    )
    for what, s in r["stalls"].items():
        lines.append(
            f"  {what}: schedule {s['schedule_max_ms']:.2f} ms, cancel"
            f" {s['cancel_max_ms']:.2f} ms ({s['pairs']:,} pairs)"
        )
    return lines


def run(cfg: dict) -> dict:
    """run.py's entry: `repeats` runs of measure(), each in a fresh
    interpreter, folded into medians with min-max."""
    args = (cfg["pending"], cfg["seconds"], cfg["calls"])
    return summarize([run_child("snapshot", "measure", *args) for _ in range(cfg["repeats"])])


def report(r: dict) -> list[str]:
    lines = [
        f"{r['pending']['median']:,.0f} pending, 1 ms x 4096, due 1 min to 1 h ahead;"
        " us per call, median (min-max) over the runs of each run's median and max"
    ]
    for limit, t in r["snapshot"].items():
        lines.append(
            f"pending_snapshot({limit}): median {fmt(t['median_us'])}, max {fmt(t['max_us'])}"
        )
    t = r["stats"]
    lines.append(f"stats(): median {fmt(t['median_us'])}, max {fmt(t['max_us'])}")
    lines.append("longest schedule / cancel (ms) on another thread, while this thread:")
    for what, s in r["stalls"].items():
        lines.append(
            f"  {what}: schedule {fmt(s['schedule_max_ms'], ',.1f')},"
            f" cancel {fmt(s['cancel_max_ms'], ',.1f')}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="10,000 pending, short runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.pending, args.seconds, args.calls = 10_000, 0.3, 20
    if args.pending <= 0 or args.seconds <= 0 or args.calls <= 0:
        parser.error("--pending, --seconds and --calls must be > 0")
    print("\n".join(format_lines(measure(args.pending, args.seconds, args.calls))))


if __name__ == "__main__":
    main()
