"""The C core on its own: builds tests/c/model_test.c (the core against a
reference model, on a fake clock) and tests/c/stress_core.c (the real
worker thread under concurrent producers and stop races) with the system C
compiler, warnings as errors, and runs them.

HWTIMER_MODEL_SEED fixes the model test's seed; otherwise it is random and
a failure prints the command that reproduces it.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
CDIR = ROOT / "tests" / "c"
CFLAGS = ["-Wall", "-Wextra", "-Werror", "-O1", "-g", "-pthread"]


def compiler() -> str:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no C compiler found")


def build(tmp_path: Path, source: str) -> Path:
    if not (SRC / "hwt.c").exists():
        pytest.skip("the C sources are not beside this test (installed elsewhere)")
    exe = tmp_path / Path(source).stem
    cmd = [
        compiler(),
        *CFLAGS,
        f"-I{SRC}",
        f"-I{CDIR}",
        str(CDIR / source),
        str(SRC / "hwt.c"),
        "-o",
        str(exe),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return exe


def run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(args)} exited {proc.returncode}\n{proc.stdout[-4000:]}{proc.stderr[-8000:]}"
    )
    return proc


def test_core_agrees_with_model(tmp_path: Path) -> None:
    exe = build(tmp_path, "model_test.c")
    seed = os.environ.get("HWTIMER_MODEL_SEED") or str(random.randrange(2**32))
    proc = run([str(exe), seed], timeout=300)
    assert "runs agree with the model" in proc.stdout


def test_model_test_reports_a_mismatch(tmp_path: Path) -> None:
    """The harness fails loudly: a core that delivers a tick early is caught."""
    broken = tmp_path / "hwt.c"
    source = (SRC / "hwt.c").read_text()
    needle = "if (to->deadline >= tick_end)"
    if needle not in source:
        pytest.skip("expiry test in hwt.c has changed shape")
    broken.write_text(source.replace(needle, "if (to->deadline > tick_end + 1)"))
    exe = tmp_path / "model_test_broken"
    cmd = [compiler(), "-O1", "-pthread", f"-I{SRC}", f"-I{CDIR}"]
    cmd += [str(CDIR / "model_test.c"), str(broken), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    proc = subprocess.run([str(exe), "1", "200"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "MODEL MISMATCH" in proc.stderr
    assert "reproduce with: model_test" in proc.stderr


def test_core_under_concurrent_use(tmp_path: Path) -> None:
    exe = build(tmp_path, "stress_core.c")
    proc = run([str(exe), str(random.randrange(2**32)), "6"], timeout=600)
    assert "all rounds passed" in proc.stdout
