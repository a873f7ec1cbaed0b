"""CPU cost of a timer that has (almost) nothing to do.

Netty's worker wakes at every tick whether or not anything is due, so a
1 ms tick costs a thousand wake-ups a second for ever.  hwtimer's worker
blocks while nothing is pending and otherwise sleeps straight to the next
tick that holds work.  This measures both, side by side: setting
``HWTIMER_WAKE_EVERY_TICK=1`` when a timer is constructed makes its worker
tick like Netty's.

Scenarios, each in a fresh process, at 1 ms and 10 ms ticks:

* ``idle``: a started timer with nothing scheduled;
* ``1/s``: a timer holding one timeout a second (a task that schedules
  the next one, as a heartbeat does).

Reported per second of wall time: CPU time of the worker thread and of the
dispatch thread that runs tasks (from ``/proc/self/task/<tid>/schedstat``,
in ns), of the whole process (``resource.getrusage``; its main thread only
sleeps), the worker's wake-ups (``timer.stats()``) and its voluntary context
switches (``/proc/self/task/<tid>/status``).

Usage::

    python benchmarks/idle.py [--seconds 5]

``benchmarks/run.py`` runs it too, round after round (``run``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREAD_NAME = "idlebench"
TICKS = (0.001, 0.010)
SCENARIOS = ("idle", "1/s")
MODES = ("default", "every-tick")
SIZES = {"full": {"seconds": 2.0}, "quick": {"seconds": 1.0}, "tiny": {"seconds": 0.3}}


def _find_thread(comm: str) -> int | None:
    """Returns the id of this process's thread named `comm`, or None."""
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == comm:
                    return int(tid)
        except OSError:
            continue
    return None


def _thread_cpu_ns(tid: int) -> int:
    """CPU time of thread `tid` in ns (schedstat), or from stat's clock ticks."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        hz = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // hz


def _voluntary_switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    return 0


def _process_cpu_ns() -> int:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return int((ru.ru_utime + ru.ru_stime) * 1e9)


def measure(tick: float, scenario: str, seconds: float) -> dict:
    """Runs one scenario in this process and returns its figures per second."""
    import hwtimer  # PYTHONPATH names the checkout

    timer = hwtimer.HashedWheelTimer(tick, 512, thread_name=THREAD_NAME)
    timer.start()
    if scenario == "1/s":

        def heartbeat(timeout):
            timer.new_timeout(heartbeat, 1.0)

        timer.new_timeout(heartbeat, 1.0)
    time.sleep(0.2)  # let the threads start and settle
    tid = _find_thread(THREAD_NAME)
    if tid is None:
        raise RuntimeError(f"no thread named {THREAD_NAME!r}")
    dispatch = _find_thread(f"{THREAD_NAME}-dispatch"[:15])
    cpu0, sw0 = _thread_cpu_ns(tid), _voluntary_switches(tid)
    disp0, wake0 = _thread_cpu_ns(dispatch), timer.stats()["wakeups"]
    proc0, t0 = _process_cpu_ns(), time.monotonic()
    time.sleep(seconds)
    elapsed, proc1 = time.monotonic() - t0, _process_cpu_ns()
    cpu1, sw1 = _thread_cpu_ns(tid), _voluntary_switches(tid)
    disp1, stats = _thread_cpu_ns(dispatch), timer.stats()
    timer.stop()
    return {
        "tick_ms": tick * 1e3,
        "scenario": scenario,
        "seconds": elapsed,
        "worker_cpu_us_per_s": (cpu1 - cpu0) / 1e3 / elapsed,
        "dispatch_cpu_us_per_s": (disp1 - disp0) / 1e3 / elapsed,
        "process_cpu_us_per_s": (proc1 - proc0) / 1e3 / elapsed,
        "wakeups_per_s": (stats["wakeups"] - wake0) / elapsed,
        "voluntary_switches_per_s": (sw1 - sw0) / elapsed,
        "expired": stats["expired"],
    }


def _run_child(tick: float, scenario: str, mode: str, seconds: float) -> dict:
    env = dict(os.environ)
    env.pop("HWTIMER_WAKE_EVERY_TICK", None)
    if mode == "every-tick":
        env["HWTIMER_WAKE_EVERY_TICK"] = "1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + [ROOT])
    params = json.dumps([tick, scenario, seconds])
    cmd = [sys.executable, os.path.abspath(__file__), "--child", params]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60)
    if out.returncode != 0:
        from common import exit_status

        status = exit_status(out.returncode)
        raise RuntimeError(f"idle child failed ({status}): {out.stderr.strip()}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["mode"] = mode
    return result


def run_all(seconds: float = 5.0, parallel: int = 2) -> list[dict]:
    """Runs every (tick, scenario, mode) in its own process, `parallel` at
    a time (one a core: more would put them in each other's way)."""
    combos = [(t, s, m) for t in TICKS for s in SCENARIOS for m in MODES]
    with ThreadPoolExecutor(parallel) as pool:
        futures = [pool.submit(_run_child, t, s, m, seconds) for t, s, m in combos]
        return [f.result() for f in futures]


def run(cfg: dict) -> dict:
    """Every case, cfg["repeats"] times over; each row's numbers summarized."""
    from common import summarize

    rounds = [run_all(cfg["seconds"]) for _ in range(cfg["repeats"])]
    return {"rows": [summarize(list(case)) for case in zip(*rounds)]}


def report(r: dict) -> list[str]:
    medians = [
        {k: v["median"] if isinstance(v, dict) else v for k, v in row.items()} for row in r["rows"]
    ]
    lines = ["idle cost (per second of wall time), medians", *format_table(medians).splitlines()]
    for row in r["rows"]:
        cpu = row["worker_cpu_us_per_s"]
        if cpu["max"] - cpu["min"] > max(100.0, 0.2 * cpu["median"]):
            lines.append(
                f"  {row['tick_ms']['median']:g} ms {row['scenario']} {row['mode']}: worker CPU "
                f"{cpu['min']:,.0f}-{cpu['max']:,.0f} us/s over the rounds"
            )
    return lines


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'tick':>6}  {'scenario':<8} {'mode':<10} {'worker CPU':>11} {'dispatch CPU':>12} "
        f"{'process CPU':>12} {'wake-ups':>9} {'switches':>9}"
    )
    units = f"{'us/s':>11} {'us/s':>12} {'us/s':>12} {'/s':>9} {'/s':>9}"
    lines = [head, f"{'':>6}  {'':<8} {'':<10} {units}"]
    for r in rows:
        lines.append(
            f"{r['tick_ms']:>4g}ms  {r['scenario']:<8} {r['mode']:<10} "
            f"{r['worker_cpu_us_per_s']:>11.1f} {r['dispatch_cpu_us_per_s']:>12.1f} "
            f"{r['process_cpu_us_per_s']:>12.1f} "
            f"{r['wakeups_per_s']:>9.1f} {r['voluntary_switches_per_s']:>9.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per case")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 < args.seconds < float("inf"):  # NaN included
        parser.error("--seconds must be a number of seconds > 0")
    if args.child:
        tick, scenario, seconds = json.loads(args.child)
        print(json.dumps(measure(tick, scenario, seconds)))
        return
    print(format_table(run_all(args.seconds)))


if __name__ == "__main__":
    main()
