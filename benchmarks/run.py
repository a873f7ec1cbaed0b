"""hwtimer's benchmarks against asyncio, uvloop, threading.Timer, sched and
the floors of its own hot paths.

One command runs them all::

    python benchmarks/run.py [--quick] [--only NAME ...] [--readme]

It needs the extension built in place (``python setup.py build_ext
--inplace``) or hwtimer installed, and the ``bench`` extra (uvloop,
matplotlib; valgrind for the instruction counts, a C compiler for the
floors).  Every measurement is repeated (``--repeats``, 5 by default), the
implementations interleaved round by round, and each figure is printed and
stored as its median with min-max.  The output says when the machine was
busy: other processes' CPU use while a benchmark ran, the load average, and
the figures whose runs disagree.  It writes
``benchmarks/results/results.json`` and the chart
``benchmarks/results/growth.png``; ``--readme`` then rewrites the README's
figures from them (``benchmarks/readme.py`` does that alone).

``--quick`` uses smaller sizes (about ten minutes instead of tens);
``--size tiny`` is a smoke test of every benchmark in seconds, whose figures
mean nothing.

The benchmarks are the modules named in BENCHMARKS, each in this
directory; ``--module NAME`` adds one.  A module has ``run(cfg) -> dict``
(cfg: its ``SIZES[size]`` and ``repeats``), and may have ``SIZES``,
``report(result) -> list of lines``, ``FIGURE`` with ``figure(result)``
(a target of the release and the measured value), and ``plot(result,
machine, path)``.  A module with only ``main()`` is run as a script and its
output kept.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time

from common import HERE, ROOT, TICK, WHEEL, child_env, spread

RESULTS = os.path.join(HERE, "results")
BENCHMARKS = [
    "pair",
    "memory",
    "growth",
    "burst",
    "producers",
    "lateness",
    "instructions",
    "idle",
    "bench_asyncio",
]
REPEATS = 5
# Other processes using more than this many cores on average while a
# benchmark ran make its figures suspect; so do runs that disagree by more
# than SPREAD of their median.
BUSY_CORES = 0.25
SPREAD = 0.2


def version_of(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)
    return proc.stdout.strip()


def machine_info() -> dict:
    cpu = platform.processor() or "unknown"
    with open("/proc/cpuinfo") as f:
        m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        cpu = m.group(1).strip() if m else cpu
    hw_version = version_of("hwtimer")
    if hw_version is None:
        with open(os.path.join(ROOT, "pyproject.toml")) as f:
            m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
        hw_version = m.group(1) if m else "unknown"
    valgrind = None
    if shutil.which("valgrind"):
        proc = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
        valgrind = proc.stdout.strip()
    with open("/proc/meminfo") as f:
        m = re.search(r"MemTotal:\s+(\d+) kB", f.read())
        mem = int(m.group(1)) * 1024 if m else None
    import hwtimer

    source = {"extension": os.path.abspath(hwtimer._hwtimer.__file__)}
    if shutil.which("git") and os.path.exists(os.path.join(ROOT, ".git")):
        source["checkout_commit"] = git("rev-parse", "HEAD")
        source["checkout_src_modified"] = bool(git("status", "--porcelain", "src"))
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
    }


# ---- how busy the machine was ----


def cpu_seconds() -> tuple[float, float, float]:
    """(busy, steal, ours): seconds of CPU the whole machine has been busy
    and stolen by the hypervisor since boot (/proc/stat), and this process's
    and its waited-for children's own."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    ours = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        ours += ru.ru_utime + ru.ru_stime
    return (user + nice + system + irq + softirq) / hz, steal / hz, ours


class LoadMeter:
    """What else the machine did while a benchmark ran."""

    def __init__(self) -> None:
        self.load_start = os.getloadavg()
        self.cpu_start = cpu_seconds()
        self.t0 = time.monotonic()

    def result(self) -> dict:
        wall = time.monotonic() - self.t0
        busy, steal, ours = (b - a for a, b in zip(self.cpu_start, cpu_seconds()))
        return {
            "seconds": wall,
            "load_average_start": self.load_start,
            "load_average_end": os.getloadavg(),
            "other_processes_cores": max(0.0, busy - ours) / wall if wall else 0.0,
            "steal_cores": steal / wall if wall else 0.0,
        }


def wide_spreads(result, path: str = "") -> list[tuple[float, str]]:
    """(spread, path) of every repeated figure in result whose runs
    disagree by more than SPREAD."""
    out = []
    if isinstance(result, dict):
        if {"median", "min", "max"} <= result.keys():
            s = spread(result)
            return [(s, path)] if s > SPREAD else []
        for k, v in result.items():
            out += wide_spreads(v, f"{path}/{k}" if path else str(k))
    return out


def busy_notes(load: dict, result: dict) -> list[str]:
    """The lines that warn of a busy machine, or of figures that moved."""
    notes = []
    cores = os.cpu_count() or 1
    if load["other_processes_cores"] > BUSY_CORES or load["steal_cores"] > BUSY_CORES:
        notes.append(
            f"BUSY: other processes used {load['other_processes_cores']:.2f} of {cores} cores "
            f"on average (hypervisor steal {load['steal_cores']:.2f}); load average "
            f"{load['load_average_start'][0]:.2f} -> {load['load_average_end'][0]:.2f}"
        )
    spreads = sorted(wide_spreads(result), reverse=True)
    if spreads:
        worst = ", ".join(f"{p} {s:.0%}" for s, p in spreads[:3])
        notes.append(
            f"SPREAD: {len(spreads)} figure(s) moved by more than {SPREAD:.0%} of their median "
            f"between runs ({worst})"
        )
    return notes


# ---- the driver ----


def load_module(name: str):
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    return importlib.import_module(name)


def run_script(module) -> dict:
    """A module with only main(): its output, run as a script."""
    cmd = [sys.executable, module.__file__]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{module.__name__} failed:\n{proc.stderr[-4000:]}")
    return {"output": proc.stdout}


def run_one(module, size: str, repeats: int) -> dict:
    if not hasattr(module, "run"):
        return run_script(module)
    cfg = dict(getattr(module, "SIZES", {}).get(size, {}), repeats=repeats)
    return module.run(cfg)


def report_lines(module, result: dict) -> list[str]:
    if hasattr(module, "report"):
        return module.report(result)
    return result.get("output", json.dumps(result, indent=1)).splitlines()


def print_report(r: dict, modules: dict) -> None:
    m = r["machine"]
    print(f"\nhwtimer {m['versions']['hwtimer']} on {m['cpu']}, {m['cores']} cores, {m['python']}")
    print(
        f"hwtimer timer: tick {TICK * 1e3:g} ms, {WHEEL} buckets; {r['config']['repeats']} "
        f"runs of each figure ({r['config']['size']} sizes)"
    )
    for i, (name, module) in enumerate(modules.items(), 1):
        if name not in r["results"]:
            continue
        print(f"\n{i}. {name}")
        for line in report_lines(module, r["results"][name]):
            print(f"   {line}")
        for note in r["load"][name]["notes"]:
            print(f"   {note}")
    if r["figures"]:
        print("\nfigures of the release (medians):")
        for k, v in r["figures"].items():
            verdict = "met" if v["met"] else "MISSED"
            x = v["value"]
            print(
                f"   {k:<10} {x['median']:.2f} ({x['min']:.2f}-{x['max']:.2f}) {v['unit']:<20} "
                f"target {v['target']}: {verdict}"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="hwtimer benchmarks")
    parser.add_argument("--quick", action="store_true", help="--size quick")
    parser.add_argument("--size", choices=("full", "quick", "tiny"), default="full")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs of each figure")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--module", action="append", default=[], help="add a benchmark module")
    parser.add_argument("--out", default=RESULTS, help="where results.json and the chart go")
    parser.add_argument("--readme", action="store_true", help="then rewrite README.rst's figures")
    args = parser.parse_args(argv)
    size = "quick" if args.quick else args.size
    names = [n for n in BENCHMARKS + args.module if not args.only or n in args.only]
    unknown = set(args.only or []) - set(names)
    if unknown:
        parser.error(f"no benchmark named {', '.join(sorted(unknown))}")
    modules = {n: load_module(n) for n in names}

    r: dict = {
        "machine": machine_info(),
        "config": {"size": size, "repeats": args.repeats, "benchmarks": names},
        "results": {},
        "load": {},
    }
    started = time.monotonic()
    for name, module in modules.items():
        print(f"running {name} ...", file=sys.stderr, flush=True)
        meter = LoadMeter()
        r["results"][name] = run_one(module, size, args.repeats)
        load = meter.result()
        load["notes"] = busy_notes(load, r["results"][name])
        r["load"][name] = load
        print(f"  {name}: {load['seconds']:.1f} s", file=sys.stderr, flush=True)
        for note in load["notes"]:
            print(f"  {note}", file=sys.stderr, flush=True)
    r["figures"] = {}
    for name, module in modules.items():
        fig = module.figure(r["results"][name]) if hasattr(module, "figure") else None
        if fig:
            r["figures"][name] = dict(fig, target=module.FIGURE)
    r["total_seconds"] = time.monotonic() - started

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(r, f, indent=1)
    wrote = ["results.json"]
    for name, module in modules.items():
        if hasattr(module, "plot"):
            try:
                module.plot(r["results"][name], r["machine"], os.path.join(args.out, f"{name}.png"))
                wrote.append(f"{name}.png")
            except ImportError as e:
                print(f"no chart for {name}: {e}", file=sys.stderr)
    print_report(r, modules)
    print(
        f"\nwrote {' and '.join(wrote)} in {os.path.relpath(args.out)} ({r['total_seconds']:.0f} s)"
    )
    if args.readme:
        import readme

        readme.main(["--results", os.path.join(args.out, "results.json")])


if __name__ == "__main__":
    main()
