"""Instructions: callgrind's count for one schedule + cancel pair (all
threads), the figure that stays put on a busy machine: a run of N pairs
minus a run of none, each under callgrind in a fresh process.  It is the
same from run to run, so it is measured once, whatever ``--repeats`` says.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from common import child_command, child_env, new_hwtimer, new_loop, pair_hwtimer, pair_loop

SIZES = {
    "full": {"n": {"hwtimer": 50_000, "asyncio": 20_000}},
    "quick": {"n": {"hwtimer": 10_000, "asyncio": 3_000}},
    "tiny": {"n": {"hwtimer": 1_000, "asyncio": 300}},
}
IMPLS = ("hwtimer", "asyncio")


def child(impl: str, n: int) -> dict:
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
        *child_command("instructions", "child", impl, n),
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


def run(cfg: dict) -> dict:
    if not shutil.which("valgrind"):
        return {"skipped": "valgrind not found"}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for impl in IMPLS:
            n = cfg["n"][impl]
            base, base_file = callgrind_total(impl, 0, tmp)
            total, out_file = callgrind_total(impl, n, tmp)
            out[impl] = {
                "instructions_per_pair": (total - base) / n,
                "n": n,
                "functions_per_pair": per_pair_profile(base_file, out_file, n),
            }
    return out


def report(r: dict) -> list[str]:
    lines = [
        "instructions per schedule + cancel (callgrind, all threads; one run: it does not move)"
    ]
    if "skipped" in r:
        return lines + [f"skipped: {r['skipped']}"]
    base = r["asyncio"]["instructions_per_pair"]
    for k, v in r.items():
        x = v["instructions_per_pair"]
        vs = f"{base / x:>8.1f}x fewer than asyncio" if k != "asyncio" else ""
        lines.append(f"{k:<12}{x:>10,.0f}{vs}")
    return lines
