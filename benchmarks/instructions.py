"""Instructions: callgrind's count for one schedule + cancel pair (all
threads), the figure that stays put on a busy machine: a run of N pairs
minus a run of none, each under callgrind in a fresh process.  It is the
same from run to run, so it is measured once, whatever ``--repeats`` says.
The floor extension's pair (``floor.c``, the essential work) is counted
the same way where it can be built.

The burst's count per callback: the dispatch thread's instructions for a
burst of 2N timeouts due in one tick, less its count for a burst of N, over
N: what each callback past a burst's first N costs.  A burst's first 16,384
released Timeouts are kept for reuse, not freed; past them (the full size's
N is 50,000) each is freed, as nearly all of a large burst's are, and as
the floor's C call-and-free loop frees its argument.  The loop's count is
its ``burst()`` over N, with all it calls.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

from common import child_command, child_env, new_hwtimer, new_loop, pair_hwtimer, pair_loop

FLOOR = "floor: essential work"
SIZES = {
    "full": {"n": {"hwtimer": 50_000, "asyncio": 20_000, FLOOR: 50_000}, "burst": 50_000},
    "quick": {"n": {"hwtimer": 10_000, "asyncio": 3_000, FLOOR: 10_000}, "burst": 10_000},
    "tiny": {"n": {"hwtimer": 1_000, "asyncio": 300, FLOOR: 1_000}, "burst": 1_000},
}
BURST_FLOOR = "floor: C call-and-free loop"


def child(impl: str, n: int) -> dict:
    """Does 1000 warm-up pairs, then n: run under callgrind with n and 0."""
    if impl == FLOOR:
        import floor

        run = pair_hwtimer(floor.load())
        run(1000)
        run(n)
    elif impl == "hwtimer":
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


def burst_child(impl: str, n: int) -> dict:
    """A burst of n timeouts due in one tick, or the floor's loop over n."""
    import burst

    if impl == BURST_FLOOR:
        import floor

        ext = floor.load()
        task, _ = burst.counter(n, lambda: None)
        ext.burst(task, ext.make_args(n))
        return {}
    timer = new_hwtimer()
    timer.start()
    done = threading.Event()
    task, _ = burst.counter(n, done.set)
    # callgrind runs this tens of times slower: room for the schedules
    target = time.monotonic() + 1.0 + n * 2e-4
    new_timeout, mono = timer.new_timeout, time.monotonic
    for _ in range(n):
        new_timeout(task, target - mono())
    if n and not done.wait(600):
        raise RuntimeError("burst did not finish")
    timer.stop()
    return {}


def callgrind(function: str, impl: str, n: int, outdir: str, *options: str) -> tuple[str, str]:
    """Runs instructions.function(impl, n) under callgrind; returns its
    output file (the first of them with --separate-threads) and stderr."""
    out_file = os.path.join(outdir, f"callgrind.{function}.{impl.split(':')[0]}.{n}")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        *options,
        *child_command("instructions", function, impl, n),
    ]
    env = child_env()
    env["PYTHONHASHSEED"] = "0"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0 or "Collected" not in proc.stderr:
        raise RuntimeError(f"callgrind failed: {proc.stderr[-2000:]}")
    return out_file, proc.stderr


def callgrind_total(impl: str, n: int, outdir: str) -> tuple[int, str]:
    out_file, err = callgrind("child", impl, n, outdir)
    return int(re.search(r"Collected\s*:\s*(\d+)", err).group(1)), out_file


def dispatch_thread_total(n: int, outdir: str) -> int:
    """The instructions of the dispatch thread of a burst of n."""
    out_file, _ = callgrind("burst_child", "hwtimer", n, outdir, "--separate-threads=yes")
    for name in sorted(os.listdir(outdir)):
        if not name.startswith(os.path.basename(out_file) + "-"):
            continue
        with open(os.path.join(outdir, name)) as f:
            text = f.read()
        if "dispatch_run" in text:
            return int(re.search(r"^summary:\s*(\d+)", text, re.M).group(1))
    raise RuntimeError("no dispatch thread in callgrind's output")


def inclusive_count(out_file: str, function: str) -> int:
    """callgrind_annotate's inclusive instruction count of `function`."""
    cmd = ["callgrind_annotate", "--inclusive=yes", "--auto=no", "--threshold=100", out_file]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+)", line)
        if m and m.group(2).endswith(":" + function) and "floor.c" in m.group(2):
            return int(m.group(1).replace(",", ""))
    raise RuntimeError(f"no {function} in callgrind's output")


def burst_counts(n: int, outdir: str, with_floor: bool, submit) -> dict:
    """Instructions per callback: of hwtimer's dispatch thread, past the
    first n of a burst of 2n (its count for a burst of 2n less its count for
    one of n, over n), and, where it builds, of the floor's loop over n;
    `submit` (an executor's) runs each callgrind process."""
    out = {"n": n}
    hwtimer = [submit(dispatch_thread_total, k, outdir) for k in (2 * n, n)] if n else []
    floor = None
    if with_floor and shutil.which("callgrind_annotate"):
        floor = submit(callgrind, "burst_child", BURST_FLOOR, n, outdir)
    if hwtimer:
        out["hwtimer"] = (hwtimer[0].result() - hwtimer[1].result()) / n
    if floor is not None:
        out[BURST_FLOOR] = inclusive_count(floor.result()[0], "burst") / n
    return out


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


def impls() -> tuple[str, ...]:
    """hwtimer and asyncio, and the floor where it can be built."""
    import floor

    return ("hwtimer", "asyncio", FLOOR) if floor.buildable() else ("hwtimer", "asyncio")


def run(cfg: dict) -> dict:
    if not shutil.which("valgrind"):
        return {"skipped": "valgrind not found"}
    out = {}
    # Each count is a process of its own, run in a fresh interpreter under
    # callgrind, which counts the same however busy the machine: they run
    # side by side, one a core, two at most.
    jobs = min(2, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        pairs = {
            impl: [pool.submit(callgrind_total, impl, k, tmp) for k in (0, cfg["n"][impl])]
            for impl in impls()
        }
        burst = burst_counts(cfg["burst"], tmp, FLOOR in pairs, pool.submit)
        for impl, (base_run, full_run) in pairs.items():
            (base, base_file), (total, out_file) = base_run.result(), full_run.result()
            n = cfg["n"][impl]
            out[impl] = {
                "instructions_per_pair": (total - base) / n,
                "n": n,
                "functions_per_pair": per_pair_profile(base_file, out_file, n),
            }
        out["burst"] = burst
    return out


def report(r: dict) -> list[str]:
    lines = [
        "instructions per schedule + cancel (callgrind, all threads; one run: it does not move)"
    ]
    if "skipped" in r:
        return lines + [f"skipped: {r['skipped']}"]
    base = r["asyncio"]["instructions_per_pair"]
    for k, v in r.items():
        if k == "burst":
            continue
        x = v["instructions_per_pair"]
        vs = f"{base / x:>8.1f}x fewer than asyncio" if k != "asyncio" else ""
        lines.append(f"{k:<24}{x:>10,.0f}{vs}")
    if FLOOR in r:
        ratio = r["hwtimer"]["instructions_per_pair"] / r[FLOOR]["instructions_per_pair"]
        lines.append(f"hwtimer / floor: {ratio:.2f}x the essential work's instructions")
    b = r.get("burst", {})
    if "hwtimer" in b:
        lines.append(
            f"burst of {2 * b['n']:,}, per callback past the first {b['n']:,}: "
            f"hwtimer's dispatch thread {b['hwtimer']:,.0f}"
        )
    if "hwtimer" in b and BURST_FLOOR in b:
        ratio = b["hwtimer"] / b[BURST_FLOOR]
        lines.append(
            f"  the floor's C loop {b[BURST_FLOOR]:,.0f}: hwtimer {ratio:.2f}x its instructions"
        )
    return lines
