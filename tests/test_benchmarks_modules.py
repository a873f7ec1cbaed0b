"""benchmarks/rearm.py and benchmarks/abi3.py through benchmarks/run.py on
tiny sizes: each gives its figures as summaries of the runs, and
benchmarks/readme.py writes the README's tables of them.  Nothing here
asserts speed."""

from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig

import pytest
from benchsupport import BENCHMARKS, CHECKOUT, REPEATS, SKIPS, bench, is_summary, run_tiny

# abi3.py builds the extension twice (about half a minute of the run)
MODULES = ["rearm", "abi3"]

pytestmark = [
    *SKIPS,
    pytest.mark.skipif(
        shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) is None,
        reason="abi3.py builds the extension: no C compiler",
    ),
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, str]:
    modules = [arg for name in MODULES for arg in ("--module", name)]
    return run_tiny(str(tmp_path_factory.mktemp("bench-modules")), MODULES, *modules)


def test_run_takes_the_modules_at_their_tiny_sizes(tiny_run: tuple[dict, str, str]) -> None:
    r, _, _ = tiny_run
    assert r["config"] == {"size": "tiny", "repeats": REPEATS, "benchmarks": MODULES}
    assert list(r["results"]) == MODULES
    for name in MODULES:
        assert r["load"][name]["other_processes_cores"] >= 0
    assert r["results"]["rearm"]["ops"] == 2_000
    assert r["results"]["abi3"]["sizes"] == {"pair": 2_000, "burst": 1_000, "scope": 500}


def test_rearm_figures_are_summaries(tiny_run: tuple[dict, str, str]) -> None:
    r, stdout, _ = tiny_run
    rearm = r["results"]["rearm"]
    assert rearm["repeats"] == REPEATS
    assert list(rearm["rearm_ns"]) == ["100", "1000"]
    for pending, cases in rearm["rearm_ns"].items():
        assert list(cases) == ["reset()", "cancel() + new_timeout()"]
        assert all(is_summary(v, nonnegative=True) for v in cases.values()), pending
        assert is_summary(rearm["reset_vs_cancel_new"][pending], nonnegative=True), pending
    loop = rearm["loop_rearm_ns"]
    want = ["hwtimer call_later + reset()", "asyncio TimerHandle cancel() + call_later()"]
    if sys.version_info >= (3, 11):
        want.append("asyncio Timeout.reschedule()")
    assert list(loop) == want
    assert all(is_summary(v, nonnegative=True) for v in loop.values())
    periodic = rearm["periodic_cpu_ns_per_run"]
    assert list(periodic) == ["new_periodic()", "task re-arming itself with new_timeout()"]
    assert all(is_summary(v, nonnegative=True) for v in periodic.values())
    assert re.search(r"\n +reset\(\) +[\d,]+ \([\d,]+-[\d,]+\)\n", stdout)


def test_abi3_figures_are_summaries_of_both_builds(tiny_run: tuple[dict, str, str]) -> None:
    r, stdout, _ = tiny_run
    abi3 = r["results"]["abi3"]
    assert abi3["rounds"] == REPEATS
    assert abi3["modules"]["abi3"].endswith(".abi3.so")
    assert not abi3["modules"]["full"].endswith(".abi3.so")
    for clock in ("wall", "cpu"):
        assert list(abi3[clock]) == ["pair", "burst", "loop burst", "scope"]
        for case, row in abi3[clock].items():
            for key in ("full", "abi3", "abi3/full"):
                assert is_summary(row[key], nonnegative=True), (clock, case, key)
            ratios = [a / f for a, f in zip(row["abi3"]["runs"], row["full"]["runs"])]
            assert row["abi3/full"]["runs"] == pytest.approx(ratios)
    assert re.search(r"\n +pair +[\d,]+ \([\d,]+-[\d,]+\) +[\d,]+ \(", stdout)


def test_readme_tables_come_from_results(tiny_run: tuple[dict, str, str], tmp_path) -> None:
    r, _, out = tiny_run
    readme = tmp_path / "README.rst"
    shutil.copy(os.path.join(CHECKOUT, "README.rst"), readme)
    generator = os.path.join(BENCHMARKS, "readme.py")
    args = ["--results", os.path.join(out, "results.json"), "--readme", str(readme)]
    assert bench(generator, *args, "--check").returncode == 1  # not these figures yet
    proc = bench(generator, *args)
    assert proc.returncode == 0, proc.stderr
    kept = re.search(r"left as they were: (.*)", proc.stderr).group(1).split(", ")
    assert "rearm" not in kept and "abi3" not in kept and "pair" in kept
    text = readme.read_text()
    rearm = text.split(".. figures:begin rearm\n")[1].split(".. figures:end rearm\n")[0]
    assert f"the median of {REPEATS} runs of 2,000 re-arms each" in " ".join(rearm.split())
    reset = r["results"]["rearm"]["rearm_ns"]["1000"]["reset()"]
    assert re.search(
        rf"``reset\(\)``, 1,000 pending +{reset['median']:,.0f} +{reset['min']:,.0f}-", rearm
    )
    abi3 = text.split(".. figures:begin abi3\n")[1].split(".. figures:end abi3\n")[0]
    assert "(tiny sizes: 2,000 pairs, bursts of 1,000, 500 scopes;" in " ".join(abi3.split())
    scope = r["results"]["abi3"]["cpu"]["scope"]["abi3"]
    assert f"{scope['median']:,.0f} ({scope['min']:,.0f}-{scope['max']:,.0f})" in abi3
    for block in (rearm, abi3):
        assert "other processes used" in " ".join(block.split())
    assert bench(generator, *args, "--check").returncode == 0


def test_burst_limits_measures_each_variant_of_the_floor(tmp_path) -> None:
    """benchmarks/burst_limits.py: each variant's rate as a summary of the
    runs, and each ratio taken round by round from them."""
    r, stdout, _ = run_tiny(str(tmp_path), ["burst_limits"], "--module", "burst_limits")
    limits = r["results"]["burst_limits"]
    rate = "callbacks_per_s_first_to_last"
    names = [
        "floor: main thread",
        "floor: own thread",
        "floor: whole argument",
        "floor: GC argument",
        "hwtimer",
    ]
    for name in names:
        assert is_summary(limits[name][rate], nonnegative=True), name
        assert len(limits[name][rate]["runs"]) == REPEATS
    for key, (a, b) in {
        "floor: own thread / floor: main thread": (names[1], names[0]),
        "floor: whole argument / floor: main thread": (names[2], names[0]),
        "floor: GC argument / floor: main thread": (names[3], names[0]),
        "hwtimer / floor: own thread": (names[4], names[1]),
        "hwtimer / floor: GC argument": (names[4], names[3]),
    }.items():
        ratios = [x / y for x, y in zip(limits[a][rate]["runs"], limits[b][rate]["runs"])]
        assert limits["ratios"][key]["runs"] == pytest.approx(ratios), key
    assert "hwtimer / floor: own thread" in stdout
    assert "hwtimer / floor: GC argument" in stdout
