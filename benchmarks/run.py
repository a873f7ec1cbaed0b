"""hwtimer's benchmarks against asyncio, uvloop, threading.Timer, sched and
the floors of its own hot paths.

One command runs them all::

    python benchmarks/run.py [--quick] [--only NAME ...] [--readme]
    python benchmarks/run.py --compare REF [--quick] [--only NAME ...]

It needs the extension built in place (``python setup.py build_ext
--inplace``) or hwtimer installed, and the ``bench`` extra (uvloop,
matplotlib; valgrind for the instruction counts, a C compiler for the
floors).  Every measurement is repeated (``--repeats``, 5 by default), the
implementations interleaved round by round, and each figure is printed and
stored as its median with min-max.  The output says when the machine was
busy: other processes' CPU use while a benchmark ran, the CPU time the
hypervisor stole, the load average, and the figures whose runs disagree.
It writes ``benchmarks/results/results.json`` and the chart
``benchmarks/results/growth.png``; ``--readme`` then rewrites the README's
figures from them (``benchmarks/readme.py`` does that alone).

A benchmark that fails (its module raises, a child it runs crashes or
times out) is reported with its traceback, named under ``failed`` in
results.json and in the output, and the run goes on to the next one; the
script then exits with status 1 (and ``--readme`` leaves the README as it
is).  results.json is rewritten after each benchmark, so that a run
stopped part way keeps what the benchmarks before it measured.

``--quick`` uses smaller sizes (about ten minutes instead of tens);
``--size tiny`` is a smoke test of every benchmark in seconds, whose figures
mean nothing.

``--compare REF`` measures a change against git revision REF of this
checkout (``main~3``, a tag, a sha): it builds REF in a temporary directory
(``common.build_revision``) and runs each selected benchmark twice, each
time by this script in a fresh interpreter, once for REF's build ("before",
first on PYTHONPATH) and once for the checkout's ("after", found as above);
the two run back to back, which goes first alternating from benchmark to
benchmark, so that a change in the machine's load hits both alike.  A
benchmark that fails on either build is named beside its rows and under
``failed`` in that build's results; the others are still compared, and
the script exits with status 1.  Then it
prints a table, a row per figure that hwtimer's own code moves (each
module's figure of the release and those ``COMPARED`` names): both builds'
medians with min-max, after/before and the better side, "within noise" when
each median lies within the other's min-max, each build's BUSY and SPREAD
notes, and the figures that got worse by more than the noise.  It writes ``compare.json`` (both
builds' results, each shaped as a results.json, and the table) in
``--out`` and leaves results.json and the chart as they are.

The benchmarks are the modules named in BENCHMARKS, each in this
directory; ``--module NAME`` adds one.  A module has ``run(cfg) -> dict``
(cfg: its ``SIZES[size]`` and ``repeats``), and may have ``SIZES``,
``report(result) -> list of lines``, ``FIGURE`` with ``figure(result)``
(a target of the release and the measured value), and ``plot(result,
machine, path)``.  A module with only ``main()`` is run as a script and its
output kept.  ``--compare`` compares every repeated figure of a module that
``COMPARED`` does not name, with no better side.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import math
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

from common import (
    HERE,
    PYTHONPATH,
    ROOT,
    TICK,
    WHEEL,
    build_revision,
    child_env,
    exit_status,
    fmt,
    spread,
    summary,
    within_noise,
)

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
    "rearm",
    "snapshot",
    "far_deadlines",
    "abi3",
]
REPEATS = 5
# Other processes using, and the hypervisor stealing, more than this many
# cores between them on average while a benchmark ran make its figures
# suspect; so do runs that disagree by more than SPREAD of their median.
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
    import hwtimer

    # not installed (built in place): pyproject.toml's version is dynamic,
    # hwtimer.__version__ is where it is written
    hw_version = version_of("hwtimer") or getattr(hwtimer, "__version__", "unknown")
    valgrind = None
    if shutil.which("valgrind"):
        proc = subprocess.run(["valgrind", "--version"], capture_output=True, text=True)
        valgrind = proc.stdout.strip()
    with open("/proc/meminfo") as f:
        m = re.search(r"MemTotal:\s+(\d+) kB", f.read())
        mem = int(m.group(1)) * 1024 if m else None
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


def wide_spreads(result) -> list[tuple[float, str, dict]]:
    """(spread, path, figure) of every repeated figure in result whose runs
    disagree by more than SPREAD, the widest first; a list's rows (idle's)
    are walked too, each named as figure_paths names it."""
    spreads = ((spread(f), p, f) for p, f in figure_paths(result, False).items())
    return sorted((w for w in spreads if w[0] > SPREAD), key=lambda w: w[:2], reverse=True)


def spread_words(s: float, figure: dict) -> tuple[str, str]:
    """How far apart a figure's runs are, whose spread is s, with the word
    that leads to it: ("by", "26%") of its median, or where no share of it
    says (a median of 0), ("from", "-1 to 2 about a median of 0"), their
    min and max in the figure's unit."""
    if math.isfinite(s):
        return "by", f"{s:.0%}"
    return "from", f"{figure['min']:g} to {figure['max']:g} about a median of 0"


def busy_cores(load: dict) -> float:
    """The cores a benchmark lost on average while it ran: other processes'
    CPU and the hypervisor's steal, time a VM's vCPU did not run at all,
    which takes the CPU from the benchmark as much as another process."""
    return load["other_processes_cores"] + load["steal_cores"]


def busy_notes(load: dict, result: dict) -> list[str]:
    """The lines that warn of a busy machine, or of figures that moved."""
    notes = []
    cores = os.cpu_count() or 1
    if busy_cores(load) > BUSY_CORES:
        notes.append(
            f"BUSY: other processes used {load['other_processes_cores']:.2f} of {cores} cores "
            f"on average (hypervisor steal {load['steal_cores']:.2f}); load average "
            f"{load['load_average_start'][0]:.2f} -> {load['load_average_end'][0]:.2f}"
        )
    spreads = wide_spreads(result)
    if spreads:
        worst = ", ".join(f"{p} {spread_words(s, f)[1]}" for s, p, f in spreads[:3])
        notes.append(
            f"SPREAD: {len(spreads)} figure(s) moved by more than {SPREAD:.0%} of their median "
            f"between runs ({worst})"
        )
    return notes


# ---- the driver ----


def write_results(r: dict, out: str) -> None:
    """Writes results.json in `out` whole: a run stopped while it writes
    leaves the last one there, not half of this one."""
    path = os.path.join(out, "results.json")
    with open(path + ".tmp", "w") as f:
        json.dump(r, f, indent=1)
    os.replace(path + ".tmp", path)


def load_module(name: str):
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    return importlib.import_module(name)


def run_script(module) -> dict:
    """A module with only main(): its output, run as a script."""
    cmd = [sys.executable, module.__file__]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=1800)
    if proc.returncode != 0:
        status = exit_status(proc.returncode)
        raise RuntimeError(f"{module.__name__} failed ({status}):\n{proc.stderr[-4000:]}")
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


def failed(r: dict, name: str, e: Exception, what: str = "") -> None:
    """Notes in `r`, and on stderr with its traceback, that benchmark `name`
    failed with `e` (in `what`, if given)."""
    traceback.print_exc()
    r["failed"][name] = what + "".join(traceback.format_exception_only(type(e), e)).strip()
    print(f"  {name}: FAILED", file=sys.stderr, flush=True)


def print_report(r: dict, modules: dict) -> None:
    m = r["machine"]
    print(f"\nhwtimer {m['versions']['hwtimer']} on {m['cpu']}, {m['cores']} cores, {m['python']}")
    print(
        f"hwtimer timer: tick {TICK * 1e3:g} ms, {WHEEL} buckets; {r['config']['repeats']} "
        f"runs of each figure ({r['config']['size']} sizes)"
    )
    for i, (name, module) in enumerate(modules.items(), 1):
        print(f"\n{i}. {name}")
        if name in r["failed"]:
            print(f"   FAILED: {r['failed'][name].splitlines()[0]}")
        if name not in r["results"]:
            continue
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


# ---- comparing two builds ----

LOWER, HIGHER = "lower", "higher"
# What --compare sets side by side, beside each module's figure of the
# release: the figures of its results that hwtimer's own code moves, by
# their paths in the results (fnmatch patterns), each with the unit it is
# printed in, the way it is better and the scale from the stored value to
# that unit.  A module not named here has every repeated figure compared,
# with no verdict.
COMPARED: dict[str, list[tuple[str, str, str, float]]] = {
    "pair": [
        ("ns_per_pair/hwtimer*", "ns", LOWER, 1),
        ("cpu_ns_per_pair/hwtimer", "CPU ns", LOWER, 1),
        ("vs_floor/hwtimer / floor: essential work", "x", LOWER, 1),
        ("vs_floor_cpu/hwtimer / floor: essential work", "x", LOWER, 1),
    ],
    "memory": [("*/hwtimer/bytes_per_timeout", "bytes", LOWER, 1)],
    "growth": [
        ("hwtimer/ns_per_pair/*", "ns", LOWER, 1),
        ("hwtimer/gc_collect_ms/*", "ms", LOWER, 1),
    ],
    "burst": [
        ("hwtimer*/callbacks_per_s", "M/s", HIGHER, 1e-6),
        ("hwtimer*/callbacks_per_s_first_to_last", "M/s", HIGHER, 1e-6),
        ("hwtimer*/first_late_ms", "ms", LOWER, 1),
        ("vs_floor/*", "x", HIGHER, 1),
    ],
    "producers": [
        ("seconds/*", "ms", LOWER, 1e3),
        ("vs_one_thread/[!1]", "x", LOWER, 1),
    ],
    "lateness": [
        ("hwtimer*/p50_ms", "ms", LOWER, 1),
        ("hwtimer*/p99_ms", "ms", LOWER, 1),
        ("hwtimer*/max_ms", "ms", LOWER, 1),
    ],
    "instructions": [("hwtimer/instructions_per_pair", "instructions", LOWER, 1)],
    "idle": [
        ("*/worker_cpu_us_per_s", "us/s", LOWER, 1),
        ("*/wakeups_per_s", "/s", LOWER, 1),
    ],
    "snapshot": [
        ("snapshot/*_us", "us", LOWER, 1),
        ("stats/*_us", "us", LOWER, 1),
        ("stalls/*_ms", "ms", LOWER, 1),
    ],
    "far_deadlines": [
        ("far/*/worker_cpu_pct", "% of a core", LOWER, 1),
        ("far/*/wakeups_per_s", "/s", LOWER, 1),
        ("far/*/bytes_per_timeout", "bytes", LOWER, 1),
        ("far/*/stop_ms", "ms", LOWER, 1),
        ("turns/*/worker_ns_per_timeout", "ns", LOWER, 1),
    ],
    "rearm": [
        ("rearm_ns/*/*", "ns", LOWER, 1),
        ("loop_rearm_ns/hwtimer*", "ns", LOWER, 1),
        ("periodic_cpu_ns_per_run/*", "CPU ns", LOWER, 1),
    ],
    "bench_asyncio": [
        ("*/hwtimer.*/ns", "ns", LOWER, 1),
        ("*/timer.call_later/ns", "ns", LOWER, 1),
        ("*/hwtimer.*/bytes", "bytes", LOWER, 1),
        ("*/timer.call_later/bytes", "bytes", LOWER, 1),
    ],
}
# Medians that agree to this fraction are the same figure: closer than any
# is printed or means (tracemalloc's bytes move by a few thousandths).
SAME = 0.001
# The way each module's figure of the release is better (its FIGURE).
FIGURE_BETTER = {
    "pair": HIGHER,
    "memory": LOWER,
    "growth": LOWER,
    "burst": HIGHER,
    "producers": LOWER,
}


def figure_paths(result, numbers: bool, path: str = "") -> dict[str, dict]:
    """Every repeated figure (a summary) in a module's result by its path,
    "a/b/c"; with `numbers`, a bare number too, as a summary of its one
    run.  idle's rows are named by their tick, scenario and mode."""
    if isinstance(result, dict) and {"median", "min", "max"} <= result.keys():
        return {path: result}
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        return {path: summary([result])} if numbers else {}
    if isinstance(result, list):
        result = {row_name(row, i): row for i, row in enumerate(result)}
    if not isinstance(result, dict):
        return {}
    out = {}
    for k, v in result.items():
        out.update(figure_paths(v, numbers, f"{path}/{k}" if path else str(k)))
    return out


def row_name(row, i: int) -> str:
    """The name of row i of a list in a result: idle's by what it measures."""
    if isinstance(row, dict) and {"tick_ms", "scenario", "mode"} <= row.keys():
        tick = row["tick_ms"]
        tick = tick["median"] if isinstance(tick, dict) else tick
        return f"{tick:g} ms {row['scenario']} {row['mode']}"
    return str(i)


def scaled(s: dict | None, scale: float) -> dict | None:
    if s is None:
        return None
    return {k: (v * scale if k != "runs" else [x * scale for x in v]) for k, v in s.items()}


def side_by_side(label: str, unit: str, better: str | None, before, after) -> dict:
    """One row of the comparison: both summaries, after/before, the better
    side ("before", "after", "same" when the medians agree to SAME of
    theirs, or None when the way is unknown or a side is missing) and
    whether the difference is within noise: each median lies within the
    other run's min-max."""
    row = {"figure": label, "unit": unit, "better": better, "before": before, "after": after}
    row.update(after_over_before=None, better_side=None, within_noise=None)
    if before is None or after is None:
        return row
    b, a = before["median"], after["median"]
    row["after_over_before"] = a / b if b else None
    row["within_noise"] = within_noise(before, after)
    if abs(a - b) <= SAME * max(abs(a), abs(b)):
        row["better_side"] = "same"
    elif better is not None:
        row["better_side"] = "after" if (a < b) == (better == LOWER) else "before"
    return row


def compared(name: str, before: dict, after: dict) -> list[dict]:
    """The rows of benchmark `name` in the side-by-side table, from the two
    builds' results.json: its figure of the release, then those COMPARED
    names (every repeated figure for a module it does not name)."""
    rows = []
    fig_b, fig_a = before["figures"].get(name), after["figures"].get(name)
    if fig_b or fig_a:
        fig = fig_a or fig_b
        # "x (10,000 pending / 1,000)": the unit "x", all of it in the label
        unit, _, what = fig["unit"].partition(" ")
        label = f"figure, {fig['unit']}" if what else "figure"
        values = [f["value"] if f else None for f in (fig_b, fig_a)]
        rows.append(side_by_side(label, unit, FIGURE_BETTER.get(name), *values))
        rows[-1]["target"] = fig["target"]
    spec = COMPARED.get(name)
    numbers = spec is not None
    paths_b = figure_paths(before["results"].get(name), numbers)
    paths_a = figure_paths(after["results"].get(name), numbers)
    paths = list(paths_b) + [p for p in paths_a if p not in paths_b]
    seen: set[str] = set()
    for pattern, unit, better, scale in spec or [("*", "", None, 1)]:
        for path in paths:
            if path in seen or not fnmatch.fnmatchcase(path, pattern):
                continue
            seen.add(path)
            values = (scaled(p.get(path), scale) for p in (paths_b, paths_a))
            rows.append(side_by_side(path, unit, better, *values))
    return rows


def run_build(side: str, name: str, build: str | None, args, tmp: str) -> dict:
    """Runs benchmark `name` by this script in a fresh interpreter, for
    REF's build (`build`, put first on PYTHONPATH) or for the checkout's
    (None); returns its results.json.  Its progress goes to stderr."""
    out = os.path.join(tmp, side, name)
    cmd = [sys.executable, os.path.abspath(__file__), "--only", name, "--out", out]
    cmd += ["--size", args.size, "--repeats", str(args.repeats)]
    for m in args.module:
        cmd += ["--module", m]
    env = dict(os.environ)
    if build:
        env["PYTHONPATH"] = os.pathsep.join([build, *PYTHONPATH])
    print(f"{name}, {side}:", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    results = os.path.join(out, "results.json")
    if proc.returncode != 0:
        status = exit_status(proc.returncode)
        try:
            # the benchmark's own error, when the script lived to record it
            with open(results) as f:
                error = json.load(f)["failed"][name]
        except (OSError, ValueError, KeyError):
            error = proc.stdout[-4000:]
        raise RuntimeError(f"{name} failed on the {side} build ({status}): {error}")
    with open(results) as f:
        return json.load(f)


def merged(runs: list[dict], failed: dict[str, str]) -> dict:
    """One build's results.json, from its runs of one benchmark each and
    the benchmarks that failed on it (name: error)."""
    r = dict(runs[0], results={}, load={}, figures={}, failed={}, total_seconds=0.0)
    r["config"] = dict(r["config"], benchmarks=[])
    for run in runs:
        r["config"]["benchmarks"] += run["config"]["benchmarks"]
        for k in ("results", "load", "figures", "failed"):
            r[k].update(run.get(k, {}))
        r["total_seconds"] += run["total_seconds"]
    r["failed"].update(failed)
    return r


def run_compare(ref: str, names: list[str], args) -> dict:
    """Builds `ref` and runs every benchmark for it and for the checkout,
    benchmark by benchmark, which goes first alternating; returns what
    compare.json holds."""
    if shutil.which("git") is None or not git("rev-parse", "--git-dir"):
        raise RuntimeError(f"--compare needs git and a git checkout; {ROOT} is not one")
    commit = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if not commit:
        raise RuntimeError(f"{ref!r} names no commit of {ROOT}")
    started = time.monotonic()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    failed: dict[str, dict[str, str]] = {"before": {}, "after": {}}
    tmp = tempfile.mkdtemp(prefix="hwtimer-compare.")
    try:
        build = os.path.join(tmp, "build")
        os.mkdir(build)
        print(f"building {ref} ({commit[:12]}) in {build} ...", file=sys.stderr, flush=True)
        build_revision(commit, build)
        for i, name in enumerate(names):
            for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                try:
                    r = run_build(side, name, build if side == "before" else None, args, tmp)
                except RuntimeError as e:
                    # the other benchmarks are still worth comparing
                    print(e, file=sys.stderr, flush=True)
                    failed[side][name] = str(e)
                    continue
                runs[side].append(r)
        for r in runs["before"]:
            measured = r["machine"]["hwtimer_source"]["extension"]
            if not measured.startswith(build + os.sep):
                raise RuntimeError(f"a before run measured {measured}, not the build of {ref}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for side in ("before", "after"):
        if not runs[side]:
            raise RuntimeError(f"no benchmark ran on the {side} build: nothing to compare")
    before, after = (merged(runs[side], failed[side]) for side in ("before", "after"))
    return {
        "ref": ref,
        "commit": commit,
        "config": {"size": args.size, "repeats": args.repeats, "benchmarks": names},
        "before": before,
        "after": after,
        "comparison": {name: compared(name, before, after) for name in names},
        "total_seconds": time.monotonic() - started,
    }


def verdict(row: dict) -> str:
    if row["better_side"] is None:
        return "" if row["before"] and row["after"] else "measured on one side only"
    if row["better_side"] == "same":
        return "same"
    text = f"{row['better_side']} better"
    return f"{text}, within noise" if row["within_noise"] else text


def spec_for(row: dict) -> str:
    """The format of a row's numbers: about three significant digits."""
    x = max(abs(s["median"]) for s in (row["before"], row["after"]) if s)
    return ",.0f" if x >= 100 or x == 0 else ".1f" if x >= 10 else ".2f" if x >= 0.1 else ".3f"


def comparison_lines(c: dict) -> list[str]:
    """The side-by-side table: a row per figure, then each build's notes."""
    cells = []  # (benchmark, row, before, after, after/before), as printed
    for name, rows in c["comparison"].items():
        for r in rows:
            spec = spec_for(r)
            b, a = (fmt(r[k], spec) if r[k] else "-" for k in ("before", "after"))
            ratio = "-" if r["after_over_before"] is None else f"{r['after_over_before']:.2f}x"
            cells.append((name, r, b, a, ratio))
    label_w = max([len(r["figure"]) for _, r, *_ in cells] + [6]) + 2
    unit_w = max([len(r["unit"]) for _, r, *_ in cells] + [4]) + 2
    num_w = max([len(x) for *_, b, a, _ in cells for x in (b, a)] + [6]) + 2
    head = f"{'unit':<{unit_w}}{'before':>{num_w}}{'after':>{num_w}}{'after/before':>14}"
    lines = [f"   {'':<{label_w}}{head}"]
    for i, name in enumerate(c["comparison"], 1):
        lines.append(f"{i}. {name}")
        rows = [x for x in cells if x[0] == name]
        if not rows:
            lines.append("   no figures to compare")
        for _, r, b, a, ratio in rows:
            lines.append(
                f"   {r['figure']:<{label_w}}{r['unit']:<{unit_w}}{b:>{num_w}}{a:>{num_w}}"
                f"{ratio:>14}  {verdict(r)}"
            )
        for side in ("before", "after"):
            if name in c[side]["failed"]:
                lines.append(f"   {side}: FAILED: {c[side]['failed'][name].splitlines()[0]}")
            for note in c[side]["load"].get(name, {}).get("notes", []):
                lines.append(f"   {side}: {note}")
    return lines


def print_comparison(c: dict) -> None:
    m = c["after"]["machine"]
    source = m["hwtimer_source"]
    modified = ", src/ modified" if source.get("checkout_src_modified") else ""
    print(f"\nhwtimer on {m['cpu']}, {m['cores']} cores, {m['python']}")
    print(f"before: {c['ref']} ({c['commit'][:12]}), built apart")
    print(
        f"after:  the checkout ({source.get('checkout_commit', '?')[:12]}{modified}), "
        f"{source['extension']}"
    )
    print(
        f"{c['config']['repeats']} runs of each figure ({c['config']['size']} sizes), median "
        "(min-max); within noise: each median lies within the other's min-max\n"
    )
    for line in comparison_lines(c):
        print(line)
    rows = [(name, r) for name, rs in c["comparison"].items() for r in rs]
    judged = [(n, r) for n, r in rows if r["better_side"] in ("before", "after")]
    judged = [(n, r) for n, r in judged if not r["within_noise"]]
    worse = [f"{n} {r['figure']}" for n, r in judged if r["better_side"] == "before"]
    print(
        f"\noutside noise, after is better in {len(judged) - len(worse)} figure(s) and worse "
        f"in {len(worse)}{': ' + '; '.join(worse) if worse else ''}"
    )


def compare_main(ref: str, names: list[str], args) -> None:
    try:
        c = run_compare(ref, names, args)
    except RuntimeError as e:
        sys.exit(f"run.py --compare: {e}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "compare.json")
    with open(path, "w") as f:
        json.dump(c, f, indent=1)
    print_comparison(c)
    print(f"\nwrote {os.path.relpath(path)} ({c['total_seconds']:.0f} s)")
    failed = [
        f"{', '.join(c[side]['failed'])} on the {side} build"
        for side in ("before", "after")
        if c[side]["failed"]
    ]
    if failed:
        sys.exit(
            f"run.py --compare: benchmark(s) failed: {'; '.join(failed)} "
            "(compare.json has the others)"
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
    parser.add_argument(
        "--compare", metavar="REF", help="measure git revision REF's build beside the checkout's"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1: a figure is the median of its runs")
    args.size = size = "quick" if args.quick else args.size
    names = [n for n in dict.fromkeys(BENCHMARKS + args.module) if not args.only or n in args.only]
    unknown = set(args.only or []) - set(names)
    if unknown:
        parser.error(f"no benchmark named {', '.join(sorted(unknown))}")
    if args.compare:
        if args.readme:
            parser.error("--readme writes the README from one run, not from a comparison")
        compare_main(args.compare, names, args)
        return
    modules = {}
    for n in names:
        try:
            modules[n] = load_module(n)
        except ModuleNotFoundError as e:
            if e.name != n:
                raise  # the module is there; something it imports is not
            parser.error(f"--module {n}: no {n}.py in {HERE}")

    r: dict = {
        "machine": machine_info(),
        "config": {"size": size, "repeats": args.repeats, "benchmarks": names},
        "results": {},
        "load": {},
        "figures": {},
        "failed": {},
    }
    started = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    for name, module in modules.items():
        print(f"running {name} ...", file=sys.stderr, flush=True)
        meter = LoadMeter()
        try:
            result = run_one(module, size, args.repeats)
        except Exception as e:
            # a crashed or failed child, a timeout, a bug in the module:
            # the others' figures are worth keeping, and the rest to take
            failed(r, name, e)
        else:
            r["results"][name] = result
            try:
                fig = module.figure(result) if hasattr(module, "figure") else None
            except Exception as e:
                failed(r, name, e, "figure(): ")  # what was measured is kept
            else:
                if fig:
                    r["figures"][name] = dict(fig, target=module.FIGURE)
            load = meter.result()
            load["notes"] = busy_notes(load, result)
            r["load"][name] = load
            print(f"  {name}: {load['seconds']:.1f} s", file=sys.stderr, flush=True)
            for note in load["notes"]:
                print(f"  {note}", file=sys.stderr, flush=True)
        r["total_seconds"] = time.monotonic() - started
        write_results(r, args.out)

    wrote = ["results.json"]
    for name, module in modules.items():
        if hasattr(module, "plot") and name in r["results"]:
            try:
                module.plot(r["results"][name], r["machine"], os.path.join(args.out, f"{name}.png"))
                wrote.append(f"{name}.png")
            except ImportError as e:
                print(f"no chart for {name}: {e}", file=sys.stderr)
    print_report(r, modules)
    print(
        f"\nwrote {' and '.join(wrote)} in {os.path.relpath(args.out)} ({r['total_seconds']:.0f} s)"
    )
    if r["failed"]:
        left = "; README.rst left as it is" if args.readme else ""
        sys.exit(
            f"run.py: {len(r['failed'])} benchmark(s) failed: {', '.join(r['failed'])} "
            f"(results.json has the others' figures{left})"
        )
    if args.readme:
        import readme

        readme.main(["--results", os.path.join(args.out, "results.json")])


if __name__ == "__main__":
    main()
