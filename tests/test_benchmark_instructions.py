"""benchmarks/instructions.py on tiny sizes, where valgrind is installed:
callgrind's counts for a pair and for a burst's callback, hwtimer's and the
floor's, and the README sentence made of them.  Nothing here asserts speed
or a count's size: only that each is counted and reported."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from benchsupport import BENCHMARKS, CHECKOUT, SKIPS, bench, has_c_compiler

pytestmark = [
    *SKIPS,
    pytest.mark.skipif(shutil.which("valgrind") is None, reason="no valgrind"),
    pytest.mark.skipif(shutil.which("callgrind_annotate") is None, reason="no callgrind_annotate"),
]

FLOOR = "floor: essential work"
BURST_FLOOR = "floor: C call-and-free loop"


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> tuple[dict, str, str]:
    """One tiny run of the instructions benchmark: results, stdout, its directory."""
    out = tmp_path_factory.mktemp("instructions") / "out"
    args = ["--size", "tiny", "--repeats", "1", "--out", str(out), "--only", "instructions"]
    proc = bench(os.path.join(BENCHMARKS, "run.py"), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), proc.stdout, str(out)


def test_pair_and_burst_are_counted_for_hwtimer_and_asyncio(counted) -> None:
    ins = counted[0]["results"]["instructions"]
    for impl in ("hwtimer", "asyncio"):
        assert ins[impl]["instructions_per_pair"] > 0, impl
        assert ins[impl]["functions_per_pair"], impl
    burst = ins["burst"]
    assert burst["n"] == 1_000
    assert burst["hwtimer"] > 0
    # counted past a burst's first n, in one of 2n
    assert "burst of 2,000, per callback past the first 1,000: hwtimer's" in counted[1]


def test_the_floors_are_counted_and_written_into_the_readme(counted, tmp_path) -> None:
    if not has_c_compiler():
        pytest.skip("no C compiler for the floor extension")
    results, stdout, out = counted
    ins = results["results"]["instructions"]
    assert ins[FLOOR]["instructions_per_pair"] > 0
    assert ins[FLOOR]["functions_per_pair"]
    burst = ins["burst"]
    assert burst[BURST_FLOOR] > 0
    assert "hwtimer / floor:" in stdout

    readme = tmp_path / "README.rst"
    shutil.copy(os.path.join(CHECKOUT, "README.rst"), readme)
    generator = os.path.join(BENCHMARKS, "readme.py")
    results_file = os.path.join(out, "results.json")
    gen = bench(generator, "--results", results_file, "--readme", str(readme))
    assert gen.returncode == 0, gen.stderr[-3000:]
    text = " ".join(readme.read_text().split())
    assert f"takes {ins[FLOOR]['instructions_per_pair']:,.0f}: hwtimer" in text
    assert f"A callback of a burst of {2 * burst['n']:,}, past its first {burst['n']:,}" in text
    assert f"costs the dispatch thread {burst['hwtimer']:,.0f} instructions" in text
