"""What the tests of benchmarks/ share: where the benchmarks are, how many
runs the tests ask for, how to run a benchmark script, and the shape of a
repeated figure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(CHECKOUT, "benchmarks")
REPEATS = 2

SKIPS = [
    pytest.mark.skipif(
        not os.path.exists(os.path.join(BENCHMARKS, "run.py")), reason="no benchmarks/ in this tree"
    ),
    # scripts/sanitize.sh: minutes of benchmarks whose figures mean nothing
    # there, over calls the rest of the suite makes already
    pytest.mark.skipif("san.so" in os.environ.get("LD_PRELOAD", ""), reason="under a sanitizer"),
]


def has_c_compiler() -> bool:
    """Whether the compiler that built this interpreter is here, to build
    the floor extension (the dist checks run with none)."""
    cc = (sysconfig.get_config_var("CC") or "").split()
    return bool(cc) and shutil.which(cc[0]) is not None


def is_summary(x: object, runs: int = REPEATS, nonnegative: bool = False) -> bool:
    """Whether x is a figure measured `runs` times: median, min, max, runs."""
    return (
        isinstance(x, dict)
        and {"median", "min", "max", "runs"} <= x.keys()
        and len(x["runs"]) == runs
        and x["min"] <= x["median"] <= x["max"]
        and (not nonnegative or x["min"] >= 0)
    )


def bench(*args: str, timeout: float = 600, **env_vars: str) -> subprocess.CompletedProcess[str]:
    """Runs a benchmark script with this interpreter, its output captured."""
    env = dict(os.environ, **env_vars)
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def run_tiny(out: str, only: list[str], *args: str) -> tuple[dict, str, str]:
    """Runs benchmarks/run.py on tiny sizes, REPEATS times, for the
    benchmarks `only` names, writing to the folder out; returns its
    results.json, its output and out."""
    cmd = ["--size", "tiny", "--repeats", str(REPEATS), "--out", out, *args, "--only", *only]
    proc = bench(os.path.join(BENCHMARKS, "run.py"), *cmd)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f), proc.stdout, out
