"""What a pending timeout weighs: a one-shot Timeout fits pymalloc's 80-byte
size class with its GC header, as the README says."""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

from conftest import run_python

import hwtimer

README = Path(__file__).resolve().parent.parent / "README.rst"
GC_HEADER = 2 * struct.calcsize("P")


def noop(timeout: hwtimer.Timeout) -> None:
    pass


def test_pending_one_shot_timeout_is_80_bytes_as_the_readme_says(timer) -> None:
    t = timer.new_timeout(noop, 1000.0)
    size = type(t).__basicsize__ + GC_HEADER
    assert sys.getsizeof(t) == size  # getsizeof counts the GC header
    assert size <= 80
    said = re.search(r"A ``Timeout`` is (\d+) bytes", README.read_text())
    assert said and int(said[1]) == size
    p = timer.new_periodic(noop, 1000.0)
    assert isinstance(p, hwtimer.Timeout)  # a subtype that carries the period
    assert t.cancel() and p.cancel()


def test_100k_pending_timeouts_cost_80_bytes_each() -> None:
    # a fresh interpreter: no released Timeouts kept for reuse
    proc = run_python(
        """
        import gc, tracemalloc, hwtimer
        def noop(t): pass
        timer = hwtimer.HashedWheelTimer(0.001, 4096)
        timer.new_timeout(noop, 1.0).cancel()
        n = 100_000
        keep = [None] * n
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            keep[i] = timer.new_timeout(noop, 1000.0 + (i % 60000) * 0.05)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        print((after - before) / n)
        timer.stop()
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) <= 80.5
