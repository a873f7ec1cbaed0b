"""benchmarks/run.py on tiny sizes: every benchmark runs, results.json has
the shape the README generator reads, the README's figures can be
rewritten from it, and --compare sets two builds side by side.  Nothing
here asserts speed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from benchsupport import (
    BENCHMARKS,
    CHECKOUT,
    REPEATS,
    SKIPS,
    bench,
    has_c_compiler,
    is_summary,
    run_tiny,
)

# producers.py's ROUNDS_PER_REPEAT: its rounds are short, three to a repeat
PRODUCER_ROUNDS = REPEATS * 3
# callgrind takes most of a minute even on tiny sizes; the rest run here
ONLY = [
    "pair",
    "memory",
    "growth",
    "burst",
    "producers",
    "lateness",
    "idle",
    "bench_asyncio",
    "snapshot",
    "far_deadlines",
]

pytestmark = SKIPS


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, str]:
    pytest.importorskip("uvloop")
    return run_tiny(str(tmp_path_factory.mktemp("bench")), ONLY)


def test_every_benchmark_gives_repeated_figures(tiny_run: tuple[dict, str, str]) -> None:
    r, stdout, _ = tiny_run
    assert r["config"] == {"size": "tiny", "repeats": REPEATS, "benchmarks": ONLY}
    assert list(r["results"]) == ONLY
    res = r["results"]
    pair = res["pair"]
    for impl in ("hwtimer", "asyncio", "uvloop", "sched", "threading.Timer"):
        assert is_summary(pair["ns_per_pair"][impl]), impl
        assert is_summary(pair["vs_asyncio"][impl]), impl
    assert is_summary(res["memory"]["rss"]["hwtimer"]["bytes_per_timeout"])
    assert is_summary(res["growth"]["hwtimer"]["ns_per_pair"]["10000"])
    assert is_summary(res["growth"]["asyncio"]["gc_collect_ms"]["0"])
    assert is_summary(res["burst"]["hwtimer"]["first_late_ms"])
    assert is_summary(res["burst"]["vs_asyncio"]["hwtimer"])
    assert is_summary(res["producers"]["vs_one_thread"]["4"], runs=PRODUCER_ROUNDS)
    for impl in ("hwtimer, tick 1 ms", "asyncio", "uvloop"):
        assert is_summary(res["lateness"][impl]["p99_ms"]), impl
    assert len(res["idle"]["rows"]) == 8
    assert all(is_summary(row["wakeups_per_s"]) for row in res["idle"]["rows"])
    assert is_summary(res["bench_asyncio"]["500"]["hwtimer.timeout"]["ns"])
    for limit in ("10", "100", "1000"):
        assert is_summary(res["snapshot"]["snapshot"][limit]["median_us"]), limit
    assert is_summary(res["snapshot"]["stalls"]["busy Python loop"]["schedule_max_ms"])
    assert is_summary(res["far_deadlines"]["far"]["10000"]["worker_cpu_pct"])
    assert is_summary(res["far_deadlines"]["turns"]["10"]["worker_ns_per_timeout"])
    for name in ONLY:
        load = r["load"][name]
        assert load["other_processes_cores"] >= 0 and len(load["load_average_start"]) == 3
    assert set(r["figures"]) == {"pair", "memory", "growth", "burst", "producers"}
    for name, f in r["figures"].items():
        assert is_summary(f["value"], PRODUCER_ROUNDS if name == "producers" else REPEATS), name
    # the printed report gives medians with min-max
    assert re.search(r"\n +hwtimer\s+[\d,]+ \([\d,]+-[\d,]+\)", stdout)


def test_floors_are_measured_in_the_same_run(tiny_run: tuple[dict, str, str]) -> None:
    if not has_c_compiler():
        pytest.skip("no C compiler for the floor extension")
    res = tiny_run[0]["results"]
    pair, burst = res["pair"], res["burst"]
    assert is_summary(pair["ns_per_pair"]["floor: essential work"])
    assert is_summary(pair["vs_floor"]["hwtimer / floor: essential work"])
    assert is_summary(pair["vs_floor_cpu"]["hwtimer / floor: essential work"])
    assert is_summary(burst["floor: C call-and-free loop"]["callbacks_per_s_first_to_last"])
    assert is_summary(burst["vs_floor"]["hwtimer run rate / limit"])
    assert is_summary(burst["vs_floor"]["hwtimer run rate / limit, by CPU time"])
    assert is_summary(burst["hwtimer"]["cpu_ns_per_callback"])
    # the producers' threads against the floor's, round by round
    producers = res["producers"]
    for k in ("1", "2", "4"):
        assert is_summary(producers["floor_vs_one_thread"][k], runs=PRODUCER_ROUNDS), k


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="the README compares with asyncio.timeout(), which Python 3.11 added",
)
def test_readme_figures_come_from_results(tiny_run: tuple[dict, str, str], tmp_path) -> None:
    r, _, out = tiny_run
    readme = tmp_path / "README.rst"
    shutil.copy(os.path.join(CHECKOUT, "README.rst"), readme)
    results = os.path.join(out, "results.json")
    generator = os.path.join(BENCHMARKS, "readme.py")
    args = ["--results", results, "--readme", str(readme)]
    assert bench(generator, *args, "--check").returncode == 1  # not these figures yet
    proc = bench(generator, *args)
    assert proc.returncode == 0, proc.stderr
    # only what the run left out (callgrind; rearm and abi3, which
    # test_benchmarks_modules.py runs; the floors where no compiler built
    # the floor extension) keeps its old text
    left_out = {"instructions", "rearm", "abi3"}
    if "vs_floor" not in r["results"]["pair"]:
        left_out.add("floors")
    kept = re.search(r"left as they were: (.*)", proc.stderr).group(1).split(", ")
    assert set(kept) == left_out
    text = readme.read_text()
    assert "**Burst**: 5,000 timeouts due in the same tick" in text
    assert f"Each is the median of {REPEATS} runs" in text
    assert "10,000 an hour away: worker CPU, % of a core" in text
    assert re.search(r"with\s+10,000\s+timeouts\s+pending\s+\(1\s+ms\s+x\s+4096", text)
    assert bench(generator, *args, "--check").returncode == 0


def test_a_module_with_only_main_joins_the_run(tmp_path) -> None:
    (tmp_path / "extra_bench.py").write_text(
        'def main():\n    print("extra figure: 42")\n\n\nif __name__ == "__main__":\n    main()\n'
    )
    out = tmp_path / "out"
    args = ["--module", "extra_bench", "--only", "extra_bench", "--out", str(out)]
    proc = bench(os.path.join(BENCHMARKS, "run.py"), *args, PYTHONPATH=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "extra figure: 42" in proc.stdout
    with open(out / "results.json") as f:
        assert json.load(f)["results"] == {"extra_bench": {"output": "extra figure: 42\n"}}


def cannot_build_a_revision() -> str | None:
    """Why run.py --compare cannot build a revision here, or None."""
    if shutil.which("git") is None:
        return "no git"
    head = ["git", "-C", CHECKOUT, "rev-parse", "--verify", "HEAD"]
    if subprocess.run(head, capture_output=True).returncode != 0:
        return "not a git checkout"
    if not has_c_compiler():
        return "no C compiler"
    if importlib.util.find_spec("setuptools") is None:
        return "no setuptools to build with"
    return None


def test_compare_says_why_a_revision_cannot_be_extracted(tmp_path) -> None:
    # tar's own message, as git's and the build's are: not a traceback
    why = cannot_build_a_revision()
    if why:
        pytest.skip(why)
    missing = str(tmp_path / "missing")
    code = f"""if True:
        import common
        try:
            common.build_revision("HEAD", {missing!r})
        except RuntimeError as e:
            print(e)
        """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"extracting HEAD into {missing} failed: "), proc.stdout
    assert "missing" in proc.stdout.split("failed: ", 1)[1], proc.stdout


def file_state(path: str) -> tuple[int, bytes] | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return os.stat(path).st_mtime_ns, f.read()


def test_compare_runs_both_builds_side_by_side(tmp_path) -> None:
    pytest.importorskip("uvloop")
    why = cannot_build_a_revision()
    if why:
        pytest.skip(why)
    results = os.path.join(BENCHMARKS, "results", "results.json")
    results_before = file_state(results)
    out = tmp_path / "out"
    args = ["--compare", "HEAD", "--only", "memory", "pair", "--size", "tiny"]
    args += ["--repeats", str(REPEATS), "--out", str(out)]
    proc = bench(os.path.join(BENCHMARKS, "run.py"), *args)
    assert proc.returncode == 0, proc.stderr
    assert file_state(results) == results_before
    assert sorted(os.listdir(out)) == ["compare.json"]
    with open(out / "compare.json") as f:
        c = json.load(f)
    head = subprocess.run(["git", "-C", CHECKOUT, "rev-parse", "HEAD"], capture_output=True)
    assert c["commit"] == head.stdout.decode().strip()
    for side in ("before", "after"):
        r = c[side]
        assert r["config"] == {"size": "tiny", "repeats": REPEATS, "benchmarks": ["pair", "memory"]}
        assert is_summary(r["results"]["pair"]["ns_per_pair"]["hwtimer"])
        assert is_summary(r["results"]["memory"]["rss"]["hwtimer"]["bytes_per_timeout"])
        assert set(r["figures"]) == {"pair", "memory"}
        assert set(r["load"]) == {"pair", "memory"}
    # each side measured its own build: REF's was built outside the checkout
    before_ext = c["before"]["machine"]["hwtimer_source"]["extension"]
    after_ext = c["after"]["machine"]["hwtimer_source"]["extension"]
    assert before_ext != after_ext and not before_ext.startswith(CHECKOUT + os.sep)
    rows = c["comparison"]
    assert list(rows) == ["pair", "memory"]
    labels = {name: [r["figure"] for r in rs] for name, rs in rows.items()}
    assert {"figure", "ns_per_pair/hwtimer", "cpu_ns_per_pair/hwtimer"} <= set(labels["pair"])
    assert {"figure", "rss/hwtimer/bytes_per_timeout"} <= set(labels["memory"])
    assert [r["better"] for r in rows["pair"] if r["figure"] == "figure"] == ["higher"]
    assert all(r["better"] == "lower" for r in rows["memory"])
    for name, rs in rows.items():
        for r in rs:
            assert is_summary(r["before"]) and is_summary(r["after"]), (name, r["figure"])
            assert r["better_side"] in ("before", "after", "same")
            assert isinstance(r["within_noise"], bool)
            # the printed table: the row with both sides' median (min-max)
            side = r"[\d.,]+ \([\d.,]+-[\d.,]+\)"
            row = rf"^   {re.escape(r['figure'])} +{re.escape(r['unit'])} +{side} +{side} +[\d.]+x"
            assert re.search(row, proc.stdout, re.M), (name, r["figure"])


def test_producers_target_is_against_the_floors_threads() -> None:
    # producers.figure() on made-up ratios (4 threads' time / 1 thread's),
    # in a fresh interpreter, as above
    code = """if True:
        import json, producers
        def s(lo, med, hi):
            return {"median": med, "min": lo, "max": hi, "runs": [lo, med, hi]}
        cases = [
            (s(0.95, 0.98, 1.02), None),
            (s(1.0, 1.03, 1.1), None),
            (s(0.99, 1.03, 1.08), s(0.99, 1.02, 1.07)),
            (s(1.0, 1.01, 1.04), s(0.98, 1.03, 1.09)),
            (s(1.08, 1.12, 1.2), s(0.99, 1.02, 1.07)),
        ]
        print(json.dumps([
            producers.figure(
                {"vs_one_thread": {"4": x}, **({"floor_vs_one_thread": {"4": f}} if f else {})}
            )["met"]
            for x, f in cases
        ]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [
        True,  # no floor: no slower than 1 thread
        False,
        True,  # within noise of the floor's
        True,  # faster than the floor's
        False,  # hwtimer's median beyond the floor's runs: slower
    ]


def test_compare_judges_by_the_way_a_figure_is_better() -> None:
    # run.py's side_by_side() on made-up figures, in a fresh interpreter:
    # importing benchmarks/ here would put the checkout's hwtimer first
    code = """if True:
        import json, run
        def s(lo, med, hi):
            return {"median": med, "min": lo, "max": hi, "runs": [lo, med, hi]}
        cases = [
            ("lower", s(100, 110, 120), s(80, 85, 90)),
            ("higher", s(100, 110, 120), s(80, 85, 90)),
            ("lower", s(100, 110, 120), s(95, 105, 115)),
            ("higher", s(100, 110, 120), s(60, 130, 135)),
            ("lower", s(80, 80, 80), s(80, 80.01, 80.02)),
            (None, s(1, 2, 3), s(4, 5, 6)),
        ]
        rows = [run.side_by_side("f", "ns", *case) for case in cases]
        print(json.dumps([(r["better_side"], r["within_noise"]) for r in rows]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [
        ["after", False],
        ["before", False],
        ["after", True],
        # after's median lies outside before's min-max: not noise
        ["after", False],
        ["same", False],
        [None, False],
    ]


def test_snapshot_benchmark_runs() -> None:
    proc = bench(os.path.join(BENCHMARKS, "snapshot.py"), "--quick", timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "10,000 pending (10,000 in the wheel)" in out
    for limit in (10, 100, 1000):
        assert re.search(rf"pending_snapshot\({limit}\): median [\d,]+ us, max [\d,]+ us", out)
    assert re.search(r"stats\(\): median [\d,]+ us", out)
    for what in ("idle", "busy Python loop", "snapshots back to back"):
        assert re.search(rf"  {what}: schedule [\d.]+ ms, cancel [\d.]+ ms \([\d,]+ pairs\)", out)


def test_abi3_benchmark_cases_run_on_the_installed_build(tmp_path) -> None:
    # benchmarks/abi3.py's worker, on tiny sizes, against the build the suite
    # tests (its driver builds both from the checkout: minutes, not for here)
    sizes = {"pair": 2000, "burst": 1000, "scope": 500}
    worker = ["--worker", json.dumps(sizes)]
    proc = bench(os.path.join(BENCHMARKS, "abi3.py"), *worker, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    import hwtimer._hwtimer as ext

    assert r["module"] == os.path.basename(ext.__file__)
    for case in ("pair", "burst", "loop burst", "scope"):
        wall, cpu = r[case]
        assert wall > 0 and cpu >= 0, (case, r[case])


def test_far_deadlines_pair_spreads_its_delays() -> None:
    # far_deadlines.measure_pair() on a stand-in timer that notes each
    # delay: "random delays of 1 to 60 s", not one delay a thousand times
    code = """if True:
        import json, sys, types
        seen = []
        class Timer:
            def __init__(self, *args, **kwargs): pass
            def start(self): pass
            def stop(self): return []
            def new_timeout(self, task, delay):
                seen.append(delay)
                return types.SimpleNamespace(cancel=lambda: True)
        sys.modules["hwtimer"] = types.SimpleNamespace(HashedWheelTimer=Timer)
        import far_deadlines
        far_deadlines.measure_pair(1000)
        print(json.dumps([len(seen), len(set(seen)), min(seen), max(seen)]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    n, distinct, low, high = json.loads(proc.stdout)
    assert n == 1000
    assert distinct > 900, distinct
    assert 1.0 <= low < 5.0 and 56.0 < high <= 60.0, (low, high)


@pytest.mark.parametrize(
    "script, args",
    [
        ("run.py", ["--repeats", "0", "--only", "producers"]),
        ("rearm.py", ["--size", "tiny", "--repeat", "0"]),
        ("rearm.py", ["--size", "tiny", "--pending", "-5"]),
        ("bench_asyncio.py", ["--sizes", "0", "--repeat", "1"]),
        ("bench_asyncio.py", ["--sizes", "100", "--repeat", "0"]),
        ("abi3.py", ["--repeats", "0", "--size", "tiny"]),
        ("far_deadlines.py", ["--repeats", "0"]),
        ("far_deadlines.py", ["--baseline-rev", "no-such-revision"]),
        ("idle.py", ["--seconds", "0"]),
        ("idle.py", ["--seconds", "nan"]),
        ("run.py", ["--module", "no_such_benchmark", "--only", "no_such_benchmark"]),
        ("readme.py", ["--results", "/no/such/results.json"]),
        ("readme.py", ["--readme", "/no/such/README.rst"]),
    ],
)
def test_benchmark_scripts_refuse_a_command_line_that_gives_no_figure(
    script: str, args: list[str]
) -> None:
    # each stops with its usage line before measuring anything, not with a
    # traceback from the statistics of no runs
    proc = bench(os.path.join(BENCHMARKS, script), *args, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "error:" in proc.stderr.splitlines()[-1], proc.stderr


def test_runs_that_disagree_are_noted_whatever_the_sign_of_their_median() -> None:
    # run.py's SPREAD note on made-up figures: a lateness below zero (a
    # uvloop callback run before time.monotonic() reaches its deadline)
    # whose runs disagree is as much a moved figure as one above zero
    code = """if True:
        import json, run
        def s(lo, med, hi):
            return {"median": med, "min": lo, "max": hi, "runs": [lo, med, hi]}
        result = {
            "late": {"min_ms": s(-0.9, -0.4, 0.1), "max_ms": s(1.0, 2.0, 3.0)},
            "steady": {"min_ms": s(-0.41, -0.4, -0.39)},
        }
        print(json.dumps(sorted(p for _, p, _ in run.wide_spreads(result))))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["late/max_ms", "late/min_ms"]


def test_bench_asyncio_says_when_uvloop_is_missing(tmp_path) -> None:
    # a uvloop.py that fails to import stands in for no uvloop
    (tmp_path / "uvloop.py").write_text('raise ImportError("no uvloop here")\n')
    args = ["--uvloop", "--sizes", "10", "--repeat", "1"]
    proc = bench(os.path.join(BENCHMARKS, "bench_asyncio.py"), *args, PYTHONPATH=str(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--uvloop needs uvloop" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_results_name_the_version_of_an_uninstalled_build() -> None:
    # run.py's machine_info() with hwtimer built in place and not installed
    # (version_of finds no distribution): the version hwtimer itself says,
    # not "unknown" from a pyproject.toml whose version is dynamic
    code = """if True:
        import json, run
        real = run.version_of
        run.version_of = lambda dist: None if dist == "hwtimer" else real(dist)
        import hwtimer
        print(json.dumps([run.machine_info()["versions"]["hwtimer"], hwtimer.__version__]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    reported, actual = json.loads(proc.stdout)
    assert reported == actual


def test_pair_interleaves_threading_timer_with_the_others() -> None:
    # pair.child() on stand-ins that note their calls: threading.Timer (on
    # its own, smaller n) takes its turn in every round, as the others do,
    # so that its ratio to asyncio is taken under the same load
    code = """if True:
        import json, types
        import pair
        calls = []
        def maker(label):
            return lambda *args: (lambda n: calls.append([label, n]))
        thing = types.SimpleNamespace(stop=lambda: [], close=lambda: None,
                                      call_later=None)
        pair.new_hwtimer = lambda *args: thing
        pair.new_loop = lambda kind: types.SimpleNamespace(
            call_later=None, close=lambda: None)
        pair.pair_hwtimer = maker("hwtimer")
        pair.pair_loop = maker("loop")
        pair.pair_sched = maker("sched")
        pair.floor_fns = lambda: {}
        pair.pair_threading_timer = lambda n: calls.append(["threading.Timer", n])
        out = pair.child({"n": 50, "thread_timer_n": 5, "repeats": 3})
        print(json.dumps([calls, out["rounds"], sorted(out["ns_per_pair"])]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    calls, rounds, names = json.loads(proc.stdout)
    assert "threading.Timer" in names and rounds == 3
    assert all(n == 5 for label, n in calls if label == "threading.Timer")
    timed = [label for label, _ in calls]  # the warm-ups, then the rounds
    per_round = len(names)
    assert len(timed) == per_round * (rounds + 1)
    for r in range(rounds + 1):
        assert timed[r * per_round : (r + 1) * per_round].count("threading.Timer") == 1


def test_memory_names_the_count_each_way_of_counting_took() -> None:
    # the smaller sizes trace fewer timeouts than they count by RSS: the
    # report and the README's sentence name both counts
    code = """if True:
        import json, memory, readme
        def s(x):
            return {"median": x, "min": x, "max": x, "runs": [x]}
        def runs(n):
            return {k: {"bytes_per_timeout": s(80.0), "n": s(n)} for k in memory.IMPLS}
        r = {"rss": runs(20_000), "tracemalloc": runs(5_000)}
        print(json.dumps([memory.report(r)[0], readme.block_memory(r, {})]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    header, sentence = json.loads(proc.stdout)
    assert "20,000 pending (tracemalloc 5,000)" in header
    assert "20,000 pending (tracemalloc 5,000)" in " ".join(sentence.split())


def test_readme_from_a_run_before_asyncio_timeout_leaves_its_ratios(tmp_path) -> None:
    # results.json as a run on Python 3.10 writes it: bench_asyncio has no
    # asyncio.timeout() row.  The ratios to it are left as they were and
    # named, not a KeyError; the rest is rewritten.
    with open(os.path.join(BENCHMARKS, "results", "results.json")) as f:
        r = json.load(f)
    for n, rows in r["results"]["bench_asyncio"].items():
        if n != "python":
            del rows["asyncio.timeout"]
    results = tmp_path / "results.json"
    results.write_text(json.dumps(r))
    readme = tmp_path / "README.rst"
    shutil.copy(os.path.join(CHECKOUT, "README.rst"), readme)
    generator = os.path.join(BENCHMARKS, "readme.py")
    proc = bench(generator, "--results", str(results), "--readme", str(readme))
    assert proc.returncode == 0, proc.stderr
    assert "left as they were: scope-ratios" in proc.stderr
    scope = readme.read_text().split(".. figures:begin scope\n")[1].split(".. figures:end")[0]
    assert "hwtimer.timeout" in scope and "asyncio.timeout" not in scope


def test_readme_targets_of_a_partial_run_are_left_as_they_were(tmp_path) -> None:
    # run.py --only pair --readme: results.json holds the pair's figure of
    # the release and no other.  The targets block is left whole, as the
    # blocks of the benchmarks not run are, not cut down to the pair's line.
    with open(os.path.join(BENCHMARKS, "results", "results.json")) as f:
        r = json.load(f)
    r["results"] = {"pair": r["results"]["pair"]}
    r["load"] = {"pair": r["load"]["pair"]}
    r["figures"] = {"pair": r["figures"]["pair"]}
    results = tmp_path / "results.json"
    results.write_text(json.dumps(r))
    readme = tmp_path / "README.rst"
    shutil.copy(os.path.join(CHECKOUT, "README.rst"), readme)
    before = readme.read_text().split(".. figures:begin targets\n")[1]
    generator = os.path.join(BENCHMARKS, "readme.py")
    proc = bench(generator, "--results", str(results), "--readme", str(readme))
    assert proc.returncode == 0, proc.stderr
    kept = re.search(r"left as they were: (.*)", proc.stderr).group(1).split(", ")
    assert "targets" in kept and "pair" not in kept
    after = readme.read_text().split(".. figures:begin targets\n")[1]
    assert after.split(".. figures:end targets")[0] == before.split(".. figures:end targets")[0]
    assert "at most 96 bytes per pending timeout" in after.split(".. figures:end targets")[0]


def test_a_benchmark_child_killed_by_a_signal_says_so(tmp_path) -> None:
    # a crash in C (here a SIGSEGV the child sends itself) leaves no Python
    # traceback on stderr: the error names the signal, not just "failed"
    (tmp_path / "crashing_bench.py").write_text(
        "import os, signal\n\n\ndef child():\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    code = """if True:
        import common
        try:
            common.run_child("crashing_bench", "child")
        except RuntimeError as e:
            print(e)
    """
    proc = bench("-c", code, PYTHONPATH=f"{tmp_path}{os.pathsep}{BENCHMARKS}")
    assert proc.returncode == 0, proc.stderr
    assert "crashing_bench.child failed" in proc.stdout
    assert "SIGSEGV" in proc.stdout, proc.stdout


def test_readme_machine_line_says_when_uvloop_was_not_there() -> None:
    # a run of the benchmarks that need no uvloop (idle, snapshot, ...) on
    # a machine without it: machine_info() records its version as None,
    # which the README's machine block is not to print as "uvloop None"
    code = """if True:
        import json, readme
        with open("results/results.json") as f:
            r = json.load(f)
        r["machine"]["versions"]["uvloop"] = None
        print(json.dumps(" ".join(readme.block_machine(r).split())))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    text = json.loads(proc.stdout)
    assert "None" not in text and "no uvloop" in text, text


def test_readme_scope_ratios_say_how_the_memory_compares() -> None:
    # the scope's extra memory against asyncio.timeout()'s: a ratio within
    # a tenth of 1 reads "about as much", and one below 1 "more", never
    # "1.0x less" or "0.8x less"
    code = """if True:
        import json, readme
        with open("results/results.json") as f:
            s = json.load(f)["results"]["bench_asyncio"]
        out = []
        for ours, theirs in ((430, 438), (500, 400), (200, 400)):
            for rows in (v for k, v in s.items() if k != "python"):
                base = rows["none (baseline)"]["bytes"]["median"]
                rows["hwtimer.timeout"]["bytes"]["median"] = base + ours
                rows["asyncio.timeout"]["bytes"]["median"] = base + theirs
            out.append(" ".join(readme.block_scope_ratios(s, {}).split()))
        print(json.dumps(out))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    same, more, less = json.loads(proc.stdout)
    assert "holds about as much memory (430 bytes against 438)" in same, same
    assert "holds 1.2x more memory (500 bytes against 400)" in more, more
    assert "holds 2.0x less memory (200 bytes against 400)" in less, less


def test_runs_that_disagree_in_a_table_of_rows_are_noted() -> None:
    # idle's result is a list of rows: a row whose runs disagree gets its
    # SPREAD note, named by what it measures, as a figure of a dict does
    code = """if True:
        import json, run
        def s(lo, med, hi):
            return {"median": med, "min": lo, "max": hi, "runs": [lo, med, hi]}
        row = {"tick_ms": s(1, 1, 1), "scenario": "1/s", "mode": "default"}
        result = {"rows": [
            dict(row, worker_cpu_us_per_s=s(10.0, 11.0, 12.0)),
            dict(row, mode="every-tick", worker_cpu_us_per_s=s(100.0, 200.0, 400.0)),
        ]}
        load = {"other_processes_cores": 0.0, "steal_cores": 0.0,
                "load_average_start": [0.0] * 3, "load_average_end": [0.0] * 3}
        print(json.dumps([run.wide_spreads(result), run.busy_notes(load, result)]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    spreads, notes = json.loads(proc.stdout)
    assert [p for _, p, _ in spreads] == ["rows/1 ms 1/s every-tick/worker_cpu_us_per_s"]
    assert len(notes) == 1 and notes[0].startswith("SPREAD: 1 figure(s)"), notes


def test_floor_burst_refuses_to_touch_what_make_args_did_not_make() -> None:
    # burst(fn, args, touch=True) writes into each argument's last bytes,
    # which only make_args()'s objects have: any other list is refused
    # before a call, not written over
    if not has_c_compiler():
        pytest.skip("no C compiler for the floor extension")
    code = """if True:
        import json, floor
        ext = floor.load()
        calls = []
        items = [object(), 1]
        try:
            ext.burst(calls.append, items, True)
            got = "no error"
        except TypeError as e:
            got = str(e)
        ext.burst(calls.append, ext.make_args(3), True)
        print(json.dumps([got, len(calls), len(items)]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    got, calls, left = json.loads(proc.stdout)
    assert got != "no error" and calls == 3 and left == 2, (got, calls, left)


def test_floor_gc_args_are_freed_as_untracked_gc_objects_of_a_timeouts_size() -> None:
    # make_gc_args(n): the GC argument variant of the burst's limit stands
    # for a Timeout that only the wheel holds: the cyclic GC's header, the
    # same 80 bytes with it, not tracked; burst() calls and frees each
    if not has_c_compiler():
        pytest.skip("no C compiler for the floor extension")
    code = """if True:
        import gc, json, sys, floor, hwtimer
        ext = floor.load()
        args = ext.make_gc_args(3)
        timer = hwtimer.HashedWheelTimer()
        timeout = timer.new_timeout(print, 3600)
        sizes = [sys.getsizeof(args[0]), sys.getsizeof(timeout)]
        timer.stop()
        tracked = [gc.is_tracked(a) for a in args]
        calls = []
        ext.burst(calls.append, args)
        print(json.dumps([sizes, tracked, len(calls), len(args)]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    sizes, tracked, calls, left = json.loads(proc.stdout)
    assert sizes[0] == sizes[1] == 80, sizes
    assert tracked == [False] * 3 and calls == 3 and left == 0


def test_a_failed_benchmark_keeps_what_the_others_measured(tmp_path) -> None:
    # a benchmark whose child crashes, between two that measure: the run
    # goes on, results.json holds the other two's figures and names the
    # failure, and the exit status says something failed
    (tmp_path / "first_bench.py").write_text("def run(cfg):\n    return {'first': 1.5}\n")
    (tmp_path / "crashing_bench.py").write_text(
        "import os, signal\n\nfrom common import run_child\n\n\n"
        "def child():\n    os.kill(os.getpid(), signal.SIGSEGV)\n\n\n"
        "def run(cfg):\n    return run_child('crashing_bench', 'child')\n"
    )
    (tmp_path / "last_bench.py").write_text("def run(cfg):\n    return {'last': 2.5}\n")
    names = ["first_bench", "crashing_bench", "last_bench"]
    out = tmp_path / "out"
    args = [a for n in names for a in ("--module", n)] + ["--out", str(out), "--only", *names]
    proc = bench(os.path.join(BENCHMARKS, "run.py"), *args, PYTHONPATH=str(tmp_path))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "crashing_bench" in proc.stderr.splitlines()[-1], proc.stderr
    with open(out / "results.json") as f:
        r = json.load(f)
    assert r["results"] == {"first_bench": {"first": 1.5}, "last_bench": {"last": 2.5}}
    assert set(r["load"]) == {"first_bench", "last_bench"}
    assert list(r["failed"]) == ["crashing_bench"]
    assert "SIGSEGV" in r["failed"]["crashing_bench"], r["failed"]


def test_run_keeps_what_was_measured_when_its_figure_fails(tmp_path) -> None:
    # a figure() that raises fails its benchmark, but its measured result
    # is still in results.json and the report, for the run not to be lost
    (tmp_path / "bad_figure_bench.py").write_text(
        "FIGURE = 'a target'\n\n\n"
        "def run(cfg):\n    return {'measured': 3.5}\n\n\n"
        "def figure(result):\n    raise KeyError('no such figure')\n"
    )
    out = tmp_path / "out"
    args = ["--module", "bad_figure_bench", "--out", str(out), "--only", "bad_figure_bench"]
    proc = bench(os.path.join(BENCHMARKS, "run.py"), *args, PYTHONPATH=str(tmp_path))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "bad_figure_bench" in proc.stderr.splitlines()[-1], proc.stderr
    assert "FAILED: figure(): KeyError" in proc.stdout, proc.stdout
    with open(out / "results.json") as f:
        r = json.load(f)
    assert r["results"] == {"bad_figure_bench": {"measured": 3.5}}
    assert r["figures"] == {}
    assert r["failed"]["bad_figure_bench"].startswith("figure(): KeyError"), r["failed"]


def test_steal_time_counts_toward_a_busy_machine() -> None:
    # time the hypervisor stole is time the benchmark could not run, as
    # much as other processes' CPU: together past BUSY_CORES is busy
    code = """if True:
        import json, run
        def load(other, steal):
            return {"other_processes_cores": other, "steal_cores": steal,
                    "load_average_start": [0.0] * 3, "load_average_end": [0.0] * 3}
        half = run.BUSY_CORES * 0.6
        print(json.dumps([run.busy_notes(load(o, s), {}) for o, s in
                          [(half, half), (0.0, 2 * half), (half, 0.0), (0.0, 0.0)]]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    both, steal, other, idle = json.loads(proc.stdout)
    assert len(both) == 1 and both[0].startswith("BUSY:"), both
    assert len(steal) == 1 and steal[0].startswith("BUSY:"), steal
    assert "steal" in steal[0], steal
    assert other == [] and idle == []


def test_runs_that_disagree_about_a_median_of_zero_are_noted() -> None:
    # a figure whose median is 0 has no spread relative to it, but runs of
    # -1, 0 and 2 ms disagree: its SPREAD note gives their min-max instead
    code = """if True:
        import json, run, readme
        def s(lo, med, hi):
            return {"median": med, "min": lo, "max": hi, "runs": [lo, med, hi]}
        result = {"late": {"min_ms": s(-1.0, 0.0, 2.0), "zero_ms": s(0.0, 0.0, 0.0)}}
        load = {"other_processes_cores": 0.0, "steal_cores": 0.0,
                "load_average_start": [0.0] * 3, "load_average_end": [0.0] * 3}
        r = {"load": {"x": load}, "results": {"x": result}, "machine": {"cores": 2}}
        print(json.dumps([run.busy_notes(load, result), readme.load_note("x", r)]))
    """
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    notes, readme_note = json.loads(proc.stdout)
    assert len(notes) == 1 and notes[0].startswith("SPREAD: 1 figure(s)"), notes
    assert "late/min_ms -1 to 2" in notes[0], notes
    assert "zero_ms" not in notes[0] and "inf" not in notes[0], notes
    assert "late/min_ms" in readme_note and "-1 to 2" in readme_note, readme_note
    assert "inf" not in readme_note, readme_note


def test_compare_keeps_what_was_measured_when_a_benchmark_fails(tmp_path) -> None:
    # --compare runs each benchmark twice in a child: one that fails on
    # either build is named, the others are still compared, compare.json
    # is written, and the exit status says something failed
    why = cannot_build_a_revision()
    if why:
        pytest.skip(why)
    (tmp_path / "steady_bench.py").write_text(
        "def run(cfg):\n"
        "    runs = [1.0] * cfg['repeats']\n"
        "    return {'x': {'median': 1.0, 'min': 1.0, 'max': 1.0, 'runs': runs}}\n"
    )
    (tmp_path / "failing_bench.py").write_text("def run(cfg):\n    raise ValueError('no')\n")
    names = ["steady_bench", "failing_bench"]
    out = tmp_path / "out"
    args = ["--compare", "HEAD", "--size", "tiny", "--repeats", str(REPEATS), "--out", str(out)]
    args += [a for n in names for a in ("--module", n)] + ["--only", *names]
    proc = bench(os.path.join(BENCHMARKS, "run.py"), *args, PYTHONPATH=str(tmp_path))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "failing_bench" in proc.stderr.splitlines()[-1], proc.stderr
    with open(out / "compare.json") as f:
        c = json.load(f)
    for side in ("before", "after"):
        assert list(c[side]["results"]) == ["steady_bench"], c[side]["results"]
        assert list(c[side]["failed"]) == ["failing_bench"], c[side]["failed"]
    assert [r["figure"] for r in c["comparison"]["steady_bench"]] == ["x"]
    assert c["comparison"]["failing_bench"] == []
