"""Writes README.rst's benchmark figures from results.json, so that none is
typed by hand.

Each generated block sits between two comment lines of the README::

    .. figures:begin NAME
    ...
    .. figures:end NAME

and is rewritten from one run's results.json (``benchmarks/run.py``
writes it; ``run.py --readme`` calls this at the end)::

    python benchmarks/readme.py [--results FILE] [--readme FILE] [--check]

A block whose benchmark is missing from the results is left as it was, and
named on stderr.  ``--check`` changes nothing and exits 1 if the README
differs from what the results give.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap

import memory
from run import BUSY_CORES, SPREAD, busy_cores, spread_words, wide_spreads

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(os.path.dirname(HERE), "README.rst")
RESULTS = os.path.join(HERE, "results", "results.json")
BLOCK = re.compile(
    r"^(\.\. figures:begin (?P<name>[\w-]+)\n)(?P<body>.*?)^(\.\. figures:end (?P=name)\n)",
    re.M | re.S,
)


def num(x: float, spec: str = ",.0f") -> str:
    return f"{x:{spec}}"


def med(s: dict, spec: str = ",.0f") -> str:
    return num(s["median"], spec)


def rng(s: dict, spec: str = ",.0f") -> str:
    return f"{num(s['min'], spec)}-{num(s['max'], spec)}"


def both(s: dict, spec: str = ",.0f") -> str:
    """'142 (138-150)': median, then min-max."""
    return f"{med(s, spec)} ({rng(s, spec)})"


def scaled(s: dict, k: float) -> dict:
    return {q: s[q] * k for q in ("median", "min", "max")}


def para(text: str, indent: str = "") -> str:
    """text filled to the README's width; indent for a list item's lines."""
    return textwrap.fill(
        text, 76, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def times(x: float) -> str:
    """A ratio, with the digits it needs."""
    return f"{x:.3f}x" if x < 0.1 else f"{x:.2f}x"


def table(header: list[str], rows: list[list[str]]) -> str:
    """An RST simple table."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    rule = "  ".join("=" * w for w in widths)

    def line(cells: list[str]) -> str:
        return "  ".join(f"{c:<{w}}" for c, w in zip(cells, widths)).rstrip()

    return "\n".join([rule, line(header), rule, *(line(r) for r in rows), rule])


# ---- one function per block: results -> RST, or None without the figures ----


def block_machine(r: dict) -> str:
    m, c = r["machine"], r["config"]
    v = m["versions"]
    load = [busy_cores(x) for x in r["load"].values()]
    busiest = max(load) if load else 0.0
    uvloop = f"uvloop {v['uvloop']}" if v["uvloop"] else "no uvloop"
    return para(
        f"The figures here are from one run of ``benchmarks/run.py`` ({c['size']} sizes) on "
        f"{m['cpu']}, {m['cores']} cores, Linux {m['kernel'].split('-')[0]}, {m['python']}, "
        f"hwtimer {v['hwtimer']}, {uvloop}, {v['valgrind'] or 'no valgrind'}. "
        f"Each is the median of {c['repeats']} runs, the implementations interleaved, with "
        f"the runs' min-max beside it; while it ran, other processes and the hypervisor took up to "
        f"{busiest:.2f} of the {m['cores']} cores (a benchmark's ``BUSY`` line says when "
        f"this passes {BUSY_CORES:.2f}, its ``SPREAD`` line when runs disagree by more than "
        f"{SPREAD:.0%})."
    )


def block_pair(p: dict, r: dict) -> str:
    ns, vs = p["ns_per_pair"], p["vs_asyncio"]
    rows = [
        [k, med(v), rng(v), times(vs[k]["median"])]
        for k, v in sorted(ns.items(), key=lambda kv: kv[1]["median"])
        if not k.startswith("floor")  # the floors have their own paragraph
    ]
    return table(["implementation", "ns per pair", "min-max", "vs asyncio"], rows)


def block_instructions(ins: dict, r: dict) -> str | None:
    if "skipped" in ins:
        return None
    h, a = ins["hwtimer"]["instructions_per_pair"], ins["asyncio"]["instructions_per_pair"]
    text = (
        "By instructions, which a busy machine does not move (callgrind, all threads, a run of "
        f"N pairs minus a run of none): hwtimer {h:,.0f} per pair, asyncio {a:,.0f}, "
        f"{a / h:.1f}x fewer."
    )
    floor = ins.get("floor: essential work")
    if floor:
        f = floor["instructions_per_pair"]
        text += f" The floor's essential work (below) takes {f:,.0f}: hwtimer {h / f:.2f}x."
    b = ins.get("burst", {})
    loop = b.get("floor: C call-and-free loop")
    if "hwtimer" in b and loop:
        text += (
            f" A callback of a burst of {2 * b['n']:,}, past its first {b['n']:,} (whose "
            "released Timeouts are partly kept for reuse rather than freed), costs the dispatch "
            f"thread {b['hwtimer']:,.0f} instructions, the floor's C loop {loop:,.0f}: "
            f"{b['hwtimer'] / loop:.2f}x its instructions (the wall-clock ratio is below)."
        )
    p = r["results"].get("pair")  # the wall-clock ratio beside it, when measured
    if p:
        x = p["vs_asyncio"]["hwtimer"]
        text += f" By wall clock {med(x, '.1f')}x, the runs {rng(x, '.1f')}x."
    return para(text)


def block_floors(p: dict, b: dict, r: dict) -> str | None:
    if "vs_floor" not in p or "vs_floor" not in b:
        return None
    pf, ns = p["vs_floor"], p["ns_per_pair"]
    essential, calls = ns["floor: essential work"], ns["floor: two no-op C calls"]
    bf = b["vs_floor"]
    limit = scaled(b["floor: C call-and-free loop"]["callbacks_per_s_first_to_last"], 1e-6)
    run_rate = scaled(b["hwtimer"]["callbacks_per_s_first_to_last"], 1e-6)
    first = b["hwtimer"]["first_late_ms"]
    pair = (
        f"- schedule + cancel: hwtimer {med(ns['hwtimer'])} ns a pair against "
        f"{med(essential)} ns for the essential work alone and {med(calls)} ns for two no-op "
        f"C calls: **{both(pf['hwtimer / floor: essential work'], '.2f')}x the floor** "
        f"(target <= 1.2x), {med(pf['hwtimer / floor: two no-op C calls'], '.2f')}x the "
        "bare calls; by CPU time, which leaves out what other processes took, "
        f"{both(p['vs_floor_cpu']['hwtimer / floor: essential work'], '.2f')}x the floor;"
    )
    burst = (
        f"- burst: hwtimer runs {both(run_rate, '.2f')} million callbacks a second from the "
        f"first to the last, against {both(limit, '.2f')} million for the C loop: "
        f"**{both(bf['hwtimer run rate / limit'], '.2f')}x the limit** (target >= 0.9x); "
        "by the process's CPU time, which leaves out what other processes took and "
        "counts the worker's walk of the bucket, "
        f"{both(bf['hwtimer run rate / limit, by CPU time'], '.2f')}x; "
        "from the deadline to the last callback "
        f"{med(bf['hwtimer deadline-to-last rate / limit'], '.2f')}x. The first callback "
        f"started {both(first, '.1f')} ms after the deadline (target: within one tick, "
        f"{r['machine']['hwtimer_config']['tick_duration'] * 1e3:g} ms, at the median; each "
        "round's deadline falls at a random point of a tick, and a tick's timeouts run at "
        "its end)."
    )
    return para(pair, "  ") + "\n" + para(burst, "  ")


def block_memory(mem: dict, r: dict) -> str:
    rss, tm = mem["rss"], mem["tracemalloc"]
    h = rss["hwtimer"]
    return para(
        f"**Memory** per pending timeout with {memory.counts(mem)}, the Python "
        f"object included: hwtimer {med(h['bytes_per_timeout'])} bytes (RSS "
        f"{med(h['bytes_per_timeout'], '.1f')}, runs {rng(h['bytes_per_timeout'], '.1f')}; "
        "tracemalloc "
        f"{med(tm['hwtimer']['bytes_per_timeout'], '.1f')}), asyncio "
        f"{med(rss['asyncio']['bytes_per_timeout'])}, uvloop "
        f"{med(rss['uvloop']['bytes_per_timeout'])}."
    )


def block_growth(g: dict, r: dict) -> str:
    levels = list(g["hwtimer"]["ns_per_pair"])
    impls = [k for k in ("hwtimer", "asyncio", "uvloop") if k in g]
    rows = []
    for level in levels:
        row = [f"{int(level):,}"]
        for k in impls:
            v = g[k]["ns_per_pair"].get(level)
            row.append(both(v) if v else "-")
        rows.append(row)
    gc_h, gc_a = g["hwtimer"]["gc_collect_ms"], g["asyncio"]["gc_collect_ms"]
    live = max(gc_h, key=int)
    text = (
        "**Growth**: the cost of a schedule + cancel against the number of timeouts "
        f"pending, and a full ``gc.collect()``: {med(gc_h[live], '.1f')} ms with "
        f"{int(live):,} hwtimer timeouts pending ({med(gc_h['0'], '.1f')} ms with none) "
        f"against {med(gc_a.get(live, gc_a['0']), '.0f')} ms with {int(live):,} asyncio "
        "handles. ns per pair, median (min-max):"
    )
    return para(text) + "\n\n" + table(["pending", *(f"{k} ns" for k in impls)], rows)


def block_burst(b: dict, r: dict) -> str:

    def m(k: str, key: str = "callbacks_per_s") -> str:
        return med(scaled(b[k][key], 1e-6), ".2f")

    h = b["hwtimer"]
    return para(
        f"**Burst**: {b['n']:,} timeouts due in the same tick. hwtimer runs {m('hwtimer')} "
        f"million callbacks a second from the deadline to the last callback "
        f"(runs {rng(scaled(h['callbacks_per_s'], 1e-6), '.2f')}), "
        f"{both(b['vs_asyncio']['hwtimer'], '.1f')}x asyncio's best in the same round "
        f"(``call_at`` with one shared deadline, {m('asyncio call_at (one deadline)')} million; "
        f"``call_later`` as a service calls it, {m('asyncio call_later')} million); uvloop "
        f"{m('uvloop call_later')} million, hwtimer's ``call_later`` on an asyncio loop "
        f"{m('hwtimer call_later (asyncio loop)')} million. hwtimer's first callback ran "
        f"{med(h['first_late_ms'], '.1f')} ms after the deadline, the last "
        f"{med(h['all_done_after_deadline_ms'])} ms after it; asyncio's first "
        f"(``call_later``) {med(b['asyncio call_later']['first_late_ms'])} ms after."
    )


def block_producers(p: dict, r: dict) -> str:
    s = {k: scaled(v, 1e3) for k, v in p["seconds"].items()}
    text = (
        f"**Producers**: {p['total_pairs']:,} schedule + cancel pairs shared by 1, 2 or 4 "
        f"threads took {med(s['1'], '.1f')}, {med(s['2'], '.1f')} and {med(s['4'], '.1f')} ms "
        f"(runs {rng(s['1'], '.1f')}, {rng(s['2'], '.1f')} and {rng(s['4'], '.1f')} ms)."
    )
    x, f = p["vs_one_thread"]["4"], p.get("floor_vs_one_thread", {}).get("4")
    if f:
        text += (
            f" Four threads took {med(x, '.2f')}x the time of one (runs {rng(x, '.2f')}x); "
            "the floor's essential work, the same pairs in the same rounds, "
            f"{med(f, '.2f')}x (runs {rng(f, '.2f')}x). "
            "With the GIL one thread runs at a time, so more threads cannot be faster, and "
            "handing it over costs them a little, whatever they call."
        )
    return para(text)


def block_lateness(late: dict, r: dict) -> str:
    rows = []
    for k, v in late.items():
        if isinstance(v, dict) and "p50_ms" in v:
            rows.append(
                [
                    k,
                    *(both(v[q], ".2f") for q in ("p50_ms", "p99_ms", "max_ms")),
                    med(v["min_ms"], ".3f"),
                ]
            )
    return (
        para(
            f"**Lateness**, {late['n']:,} timeouts spread over {late['span']:g} s, task start "
            "minus deadline in ms, median (min-max) of the runs' percentiles:"
        )
        + "\n\n"
        + table(["implementation", "p50", "p99", "max", "min"], rows)
    )


def block_idle(idle: dict, r: dict) -> str:
    rows = []
    for row in idle["rows"]:
        mode = "hwtimer" if row["mode"] == "default" else "every tick"
        rows.append(
            [
                f"{row['tick_ms']['median']:g} ms",
                row["scenario"],
                mode,
                both(row["worker_cpu_us_per_s"]),
                med(row["wakeups_per_s"]),
            ]
        )
    return table(["tick", "scenario", "mode", "worker CPU us/s", "wake-ups/s"], rows)


def load_note(name: str, r: dict) -> str:
    """How busy the machine was while benchmark `name` ran, and which of its
    figures moved between runs: the notes run.py prints beside it."""
    load, cores = r["load"][name], r["machine"]["cores"]
    used, steal = load["other_processes_cores"], load["steal_cores"]
    text = f"while it ran, other processes used {used:.2f} of the {cores} cores"
    if steal >= 0.005:
        text += f" and the hypervisor stole {steal:.2f}"
    if busy_cores(load) > BUSY_CORES:
        text += f" (busy: more than {BUSY_CORES:.2f})"
    spreads = wide_spreads(r["results"][name])
    if spreads:
        s, path, figure = spreads[0]
        how, moved = spread_words(s, figure)
        text += (
            f", and {len(spreads)} of its figures moved by more than {SPREAD:.0%} of their "
            f"median between runs (the most, ``{path}``, {how} {moved})"
        )
    return text


# rearm.py's cases, as the README names them
REARM_ROWS = {
    "reset()": "``reset()``",
    "cancel() + new_timeout()": "``cancel()`` + ``new_timeout()``",
    "hwtimer call_later + reset()": "``reset()`` of a ``call_later`` handle, in a loop",
    "asyncio TimerHandle cancel() + call_later()": (
        "asyncio ``TimerHandle`` ``cancel()`` + ``call_later()``"
    ),
    "asyncio Timeout.reschedule()": "asyncio ``Timeout.reschedule()``",
    "new_periodic()": "``new_periodic()``, CPU per run",
    "task re-arming itself with new_timeout()": (
        "a task re-arming itself with ``new_timeout()``, CPU per run"
    ),
}


def block_rearm(rr: dict, r: dict) -> str:
    rows = []
    for pending, cases in rr["rearm_ns"].items():
        rows += [
            [f"{REARM_ROWS[k]}, {int(pending):,} pending", med(v), rng(v)] for k, v in cases.items()
        ]
    for part in ("loop_rearm_ns", "periodic_cpu_ns_per_run"):
        rows += [[REARM_ROWS[k], med(v), rng(v)] for k, v in rr[part].items()]
    p = rr["periodic"]
    lead = para(
        f"One run of ``benchmarks/run.py`` ({r['config']['size']} sizes; the machine is in "
        f"*Performance* below), Python {rr['python']}: the median of {rr['repeats']} runs "
        f"of {rr['ops']:,} re-arms each, with their min-max; in a loop, "
        f"{rr['loop_pending']:,} other handles pending on each; the periodic rows, "
        f"{p['tasks']:,} tasks every {p['period_s'] * 1e3:g} ms "
        f"for {p['seconds']:g} s; {load_note('rearm', r)}:"
    )
    ratios = [
        f"{both(v, '.2f')}x with {int(pending):,} pending"
        for pending, v in rr["reset_vs_cancel_new"].items()
    ]
    loop = rr["loop_rearm_ns"]
    hw, th = (
        loop["hwtimer call_later + reset()"],
        loop["asyncio TimerHandle cancel() + call_later()"],
    )
    after = para(
        "A ``reset()`` over a ``cancel()`` + ``new_timeout()``, round by round, median "
        f"(min-max): {', '.join(ratios)}; in a loop, asyncio's ``cancel()`` + "
        f"``call_later()`` costs {th['median'] / hw['median']:.0f}x a ``reset()`` at the median."
    )
    return lead + "\n\n" + table(["re-arm (ns each)", "median", "min-max"], rows) + "\n\n" + after


def block_abi3(a: dict, r: dict) -> str:
    rows = [
        [
            case,
            both(row["full"]),
            both(row["abi3"]),
            f"{both(row['abi3/full'], '.2f')}x",
            f"{med(a['wall'][case]['abi3/full'], '.2f')}x",
        ]
        for case, row in a["cpu"].items()
    ]
    z = a["sizes"]
    lead = para(
        f"One run of ``benchmarks/run.py`` ({r['config']['size']} sizes: "
        f"{z['pair']:,} pairs, bursts of {z['burst']:,}, {z['scope']:,} scopes; the "
        f"machine is in *Performance* below), Python {a['python']}, {a['rounds']} rounds: ns "
        "per operation by the working thread's CPU time, median (min-max), and the abi3 "
        "build's figure over the full build's in the same round, by CPU time, and by wall "
        "clock at the median; "
        f"{load_note('abi3', r)}:"
    )
    header = ["case", "full API", "abi3", "abi3/full", "by wall"]
    return lead + "\n\n" + table(header, rows)


def block_far(f: dict, r: dict) -> str:
    import far_deadlines

    single = far_deadlines.SINGLE_LEVEL
    far, turns = f["far"], f["turns"]
    rows = []
    for n, x in far.items():
        old = single["far"].get(n, {})
        what = f"{int(n) / 1e6:g}M an hour away" if int(n) >= 1e6 else f"{int(n):,} an hour away"
        cpu = old.get("worker_cpu_pct")
        rows.append(
            [f"{what}: worker CPU, % of a core", both(x["worker_cpu_pct"], ".2f"),
             f"{cpu:g}" if cpu is not None else "-"]
        )  # fmt: skip
        wake = old.get("wakeups_per_s")
        rows.append(
            [f"{what}: wake-ups a second", both(x["wakeups_per_s"], ",.1f"),
             f"{wake:,}" if wake is not None else "-"]
        )  # fmt: skip
        rows.append([f"{what}: bytes per timeout", both(x["bytes_per_timeout"], ".1f"), "-"])
        stop = old.get("stop_ms")
        rows.append(
            [f"{what}: ``stop()``, ms", both(x["stop_ms"]), f"{stop:,}" if stop else "-"]
        )  # fmt: skip
    for k, t in turns.items():
        old = single["turns"].get(k)
        rows.append(
            [f"worker ns per timeout, {int(k):,} turn{'s' if int(k) != 1 else ''}",
             both(t["worker_ns_per_timeout"]),
             f"{old:,}" if old else "-"]
        )  # fmt: skip
    lead = para(
        f"One run of ``benchmarks/run.py`` ({r['config']['size']} sizes), 1 ms x 4096, "
        f"{r['config']['repeats']} runs in fresh interpreters, median (min-max); the worker's "
        "CPU and wake-ups are taken while the timeouts wait, an hour before they are due. "
        "The single-level wheel the hierarchical one replaced is no longer built: its column "
        "is its one measurement then (``far_deadlines.py --baseline-rev 3a23a9c~1``, medians "
        f"of three runs on the same machine); {load_note('far_deadlines', r)}:"
    )
    header = ["figure", "hierarchical", "single level (then)"]
    return lead + "\n\n" + table(header, rows)


def block_snapshot(sn: dict, r: dict) -> str:
    snap, st, stalls = sn["snapshot"], sn["stats"], sn["stalls"]
    calls = ", ".join(
        f"``pending_snapshot({k})`` {both(v['median_us'])} us (at most {both(v['max_us'])})"
        for k, v in snap.items()
    )
    idle, spin, back = (
        stalls["idle"],
        stalls["busy Python loop"],
        stalls["snapshots back to back"],
    )
    text = (
        f"Measured by ``benchmarks/snapshot.py`` (one run of ``benchmarks/run.py``, "
        f"{r['config']['repeats']} runs, each a fresh interpreter; median (min-max) over the "
        f"runs) with {sn['pending']['median']:,.0f} timeouts pending (1 ms x 4096, due 1 min "
        f"to 1 h ahead): {calls}; ``stats()`` with the spread {both(st['median_us'])} us (at "
        f"most {both(st['max_us'])}). The longest ``new_timeout()`` a producer thread saw "
        f"while another thread took snapshots back to back was "
        f"{both(back['schedule_max_ms'], ',.1f')} ms, against "
        f"{both(spin['schedule_max_ms'], ',.1f')} ms while that thread ran a plain busy "
        f"Python loop and {both(idle['schedule_max_ms'], ',.1f')} ms while it slept "
        f"({load_note('snapshot', r)})."
    )
    return para(text)


def block_targets(r: dict) -> str | None:
    f = r.get("figures")
    if not f:
        return None
    says = {
        "pair": "schedule + cancel at least 15x cheaper than asyncio's",
        "memory": "at most 96 bytes per pending timeout",
        "growth": "pair cost with 1M pending at most 1.5x that with 1k",
        "producers": "four producer threads no slower, against one, than the floor's",
        "burst": "burst at least 10x asyncio's callbacks per second",
    }
    if not says.keys() <= f.keys():
        return None  # a run of some benchmarks: the others' targets stay
    lines = []
    for k, v in f.items():
        x, spec = v["value"], (".0f" if v["unit"] == "bytes" else ".2f")
        verdict = "met" if v["met"] else "missed"
        unit = " bytes" if v["unit"] == "bytes" else "x"
        if k == "growth":
            unit += v["unit"][1:]  # which levels it compares
        item = (
            f"- {says.get(k, v['target'])}: **{verdict}** at the median, "
            f"{med(x, spec)}{unit} (runs {rng(x, spec)}{unit});"
        )
        lines.append(para(item, "  "))
    return "\n".join(lines)


def block_scope(s: dict, r: dict) -> str:
    out = []
    for n, rows in s.items():
        if n == "python":
            continue
        base = rows["none (baseline)"]
        out.append(f"    {int(n):,} concurrent requests")
        out.append(
            f"      {'wrapper':<18} {'time/req':>9} {'min-max':>13} {'overhead':>9} "
            f"{'memory/req':>11} {'extra':>7}"
        )
        for name, v in rows.items():
            us = scaled(v["ns"], 1e-3)
            over = us["median"] - base["ns"]["median"] / 1e3
            extra = v["bytes"]["median"] - base["bytes"]["median"]
            is_base = name == "none (baseline)"
            out.append(
                (
                    f"      {name:<18} {us['median']:>7.2f}us {rng(us, '.2f'):>13} "
                    f"{'' if is_base else f'{over:.2f}us':>9} {v['bytes']['median']:>9.0f} B "
                    f"{'' if is_base else f'{extra:.0f} B':>7}"
                ).rstrip()
            )
        out.append("")
    return (
        para(
            f"Python {s['python']}, asyncio's own loop, on the machine of the Performance section "
            f"below (median of {r['config']['repeats']} runs, min-max of the times; overhead and "
            "extra memory are over the baseline)::"
        )
        + "\n\n"
        + "\n".join(out).rstrip()
    )


def block_scope_ratios(s: dict, r: dict) -> str | None:
    sizes = [n for n in s if n != "python"]
    if any("asyncio.timeout" not in s[n] for n in sizes):
        return None  # measured before Python 3.11, which added asyncio.timeout()

    def cost(n: str, name: str, key: str) -> float:
        rows = s[n]
        return rows[name][key]["median"] - rows["none (baseline)"][key]["median"]

    def ratio(n: str, theirs: str, ours: str, key: str = "ns") -> str:
        c = cost(n, ours, key)
        return f"{cost(n, theirs, key) / c:.1f}x" if c > 0 else "n/a"

    small, large = sizes[0], sizes[-1]
    ours, theirs = cost(large, "hwtimer.timeout", "bytes"), cost(large, "asyncio.timeout", "bytes")
    if ours > 0 and theirs > 0 and abs(theirs / ours - 1) < 0.1:
        memory = "about as much memory"  # a ratio would read "1.0x less"
    elif ours > 0 and 0 < theirs < ours:
        memory = f"{ours / theirs:.1f}x more memory"
    else:
        memory = f"{ratio(large, 'asyncio.timeout', 'hwtimer.timeout', 'bytes')} less memory"
    return para(
        f"A ``hwtimer.timeout()`` scope costs {ratio(small, 'asyncio.timeout', 'hwtimer.timeout')} "
        f"less time than ``asyncio.timeout()`` with {int(small):,} requests in flight and "
        f"{ratio(large, 'asyncio.timeout', 'hwtimer.timeout')} less with {int(large):,}, and "
        f"holds {memory} ({ours:.0f} bytes against "
        f"{theirs:.0f}); ``hwtimer.wait_for`` costs "
        f"{ratio(small, 'asyncio.wait_for', 'hwtimer.wait_for')} and "
        f"{ratio(large, 'asyncio.wait_for', 'hwtimer.wait_for')} less than "
        "``asyncio.wait_for``."
    )


# Each block: the benchmarks whose results it is written from (their results
# come first in its arguments, then the whole run), and its function.
BLOCKS = {
    "scope": (("bench_asyncio",), block_scope),
    "scope-ratios": (("bench_asyncio",), block_scope_ratios),
    "machine": ((), block_machine),
    "pair": (("pair",), block_pair),
    "instructions": (("instructions",), block_instructions),
    "floors": (("pair", "burst"), block_floors),
    "memory": (("memory",), block_memory),
    "growth": (("growth",), block_growth),
    "burst": (("burst",), block_burst),
    "producers": (("producers",), block_producers),
    "lateness": (("lateness",), block_lateness),
    "idle": (("idle",), block_idle),
    "rearm": (("rearm",), block_rearm),
    "abi3": (("abi3",), block_abi3),
    "far": (("far_deadlines",), block_far),
    "snapshot": (("snapshot",), block_snapshot),
    "targets": ((), block_targets),
}


def rewrite(text: str, results: dict) -> tuple[str, list[str]]:
    """The README with every block the results give rewritten, and the
    names of the blocks left as they were."""
    found = {m.group("name") for m in BLOCK.finditer(text)}
    missing = set(BLOCKS) - found
    if missing:
        raise ValueError(f"README has no block {', '.join(sorted(missing))}")
    kept: list[str] = []

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in BLOCKS:
            raise ValueError(f"README block {name!r} is not one readme.py writes")
        needs, write = BLOCKS[name]
        got = [results["results"].get(n) for n in needs]
        body = None if None in got else write(*got, results)
        if body is None:
            kept.append(name)
            return m.group(0)
        return f"{m.group(1)}\n{body}\n\n{m.group(4)}"

    return BLOCK.sub(sub, text), kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--readme", default=README)
    parser.add_argument("--check", action="store_true", help="exit 1 if the README is stale")
    args = parser.parse_args(argv)
    try:
        with open(args.results) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        parser.error(f"--results {args.results}: {e}")
    if "results" not in results:
        print(f"{args.results} predates repeated runs: run benchmarks/run.py", file=sys.stderr)
        return 2
    try:
        with open(args.readme) as f:
            text = f.read()
    except OSError as e:
        parser.error(f"--readme {args.readme}: {e}")
    new, kept = rewrite(text, results)
    if kept:
        print(f"not in these results, left as they were: {', '.join(kept)}", file=sys.stderr)
    if args.check:
        if new != text:
            print(f"{args.readme} differs from {args.results}", file=sys.stderr)
            return 1
        return 0
    with open(args.readme, "w") as f:
        f.write(new)
    print(f"rewrote {len(BLOCKS) - len(kept)} block(s) of {os.path.relpath(args.readme)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
