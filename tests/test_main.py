"""python -m hwtimer, the first thing a newcomer runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(
    *args: str, timeout: float = 120, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    # From the checkout, as the README says: the checkout comes first on
    # sys.path there, with or without the extension built beside it.
    # `flags` go to the interpreter, before -m.
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no -OO bytecode left in the checkout
    return subprocess.run(
        [sys.executable, *flags, "-m", "hwtimer", *args],
        cwd=CHECKOUT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_example(
    example: str, *args: str, flags: tuple[str, ...] = (), timeout: float = 30, **env: str
) -> subprocess.CompletedProcess[str]:
    # examples/`example` with `args`, `flags` to the interpreter and `env`
    # added to the environment; skipped where the examples are not beside
    # these tests (an installed sdist's tests)
    path = os.path.join(CHECKOUT, "examples", example)
    if not os.path.exists(path):
        pytest.skip("the examples are not beside these tests")
    return subprocess.run(
        [sys.executable, *flags, path, *args],
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_main_reports_counts_lateness_and_cost() -> None:
    proc = run_main("-n", "20000", "--fire", "0.1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert re.match(r"hwtimer on CPython \S+, (futex|posix) backend\n", out)
    assert "scheduled 20,000 timeouts" in out
    assert "fired 2,000" in out and "pending 0" in out
    assert re.search(r"cancelled 18,000\b", out)
    assert re.search(r"early 0\b", out)  # never before the deadline
    # the snapshot and spread, taken while the 2,000 left to fire waited
    # (and the 18,000 cancels, counted at the next tick, may not be yet)
    soonest = re.search(
        r"pending once scheduled: ([\d,]+); the soonest (\d) due in ([-\d., ]+) s", out
    )
    assert soonest, out
    assert 0 < int(soonest.group(1).replace(",", "")) <= 20000 and soonest.group(2) == "5"
    due = [float(x) for x in soonest.group(3).split(", ")]
    assert due == sorted(due) and all(d <= 1.0 for d in due)
    spread = re.search(r"fullest bucket then: ([\d,]+) timeouts due in one tick; level 0 ", out)
    assert spread and int(spread.group(1).replace(",", "")) >= 1, out
    assert re.search(r"level 0 \(0\.01 s buckets\): [\d,]+ timeouts in [\d,]+ of 512 buckets", out)
    cost = re.search(r"hwtimer (\d+) ns, asyncio call_later\+cancel (\d+) ns", out)
    assert cost and int(cost.group(1)) > 0 and int(cost.group(2)) > 0


def test_main_refuses_bad_arguments() -> None:
    proc = run_main("-n", "0")
    assert proc.returncode == 2
    assert "-n must be > 0" in proc.stderr


def test_main_refuses_a_tick_that_is_no_finite_duration() -> None:
    for tick in ("nan", "inf", "-1", "1e300"):
        proc = run_main("--tick", tick)
        assert proc.returncode == 2, (tick, proc.stderr)
        assert "usage: python -m hwtimer" in proc.stderr and "Traceback" not in proc.stderr


def test_main_reports_the_tick_the_timer_runs_at() -> None:
    # a tick below the finest is clamped: the report says the one in use
    proc = run_main("-n", "2000", "--tick", "0.0001")
    assert proc.returncode == 0, proc.stderr
    assert "clamped to 0.001 s" in proc.stderr
    assert "tick 1 ms:" in proc.stdout, proc.stdout


def test_main_with_nothing_to_fire_ends_whatever_the_tick() -> None:
    # with every timeout cancelled there is nothing to wait for: the report
    # comes without waiting out ticks of an hour (subprocess.TimeoutExpired
    # if it does)
    proc = run_main("-n", "1000", "--fire", "0", "--tick", "3600", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "scheduled 1,000 timeouts" in proc.stdout
    assert "cancelled 1,000, fired 0, pending 0" in proc.stdout, proc.stdout


def test_main_says_when_it_stops_waiting_for_the_timeouts_to_fire(monkeypatch, capsys) -> None:
    # with a tick longer than the wait, the report says why nothing fired
    # rather than leave the reader to guess
    import hwtimer.__main__ as main

    monkeypatch.setattr(main, "_FIRE_WAIT", 0.2)
    assert main.main(["-n", "1000", "--fire", "0.5", "--tick", "100"]) == 0
    out = capsys.readouterr().out
    assert "stopped waiting after 0.2 s for the timeouts left to fire (tick 100 s)" in out, out
    assert "500 of 500 had not fired" in out, out
    assert "fired 0, pending 500" in out, out


def test_main_help_shows_the_defaults() -> None:
    proc = run_main("--help")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "(default: 300000)" in out and "(default: 0.05)" in out, out
    assert "(default: 0.01)" in out, out


def test_main_runs_under_python_oo() -> None:
    # -OO strips docstrings, the module's included: the report and the
    # usage line do not depend on it
    proc = run_main("-n", "1000", "--fire", "0", flags=("-OO",))
    assert proc.returncode == 0, proc.stderr
    assert "scheduled 1,000 timeouts" in proc.stdout
    proc = run_main("-n", "0", flags=("-OO",))
    assert proc.returncode == 2 and "-n must be > 0" in proc.stderr, proc.stderr


def test_asyncio_pair_cost_is_taken_on_a_loop_that_turns(monkeypatch) -> None:
    # A loop that never runs keeps every cancelled handle in its heap, which
    # no live service does: the comparison would flatter hwtimer.  _scheduled
    # is the heap of asyncio's base loop on every CPython supported.
    import asyncio

    from hwtimer.__main__ import _pair_cost_asyncio

    most_scheduled = 0

    class Loop(asyncio.SelectorEventLoop):
        def call_later(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal most_scheduled
            most_scheduled = max(most_scheduled, len(self._scheduled))  # type: ignore[attr-defined]
            return super().call_later(*args, **kwargs)

    monkeypatch.setattr(asyncio, "new_event_loop", Loop)
    assert _pair_cost_asyncio(50_000) > 0
    assert 0 < most_scheduled <= 10_000  # the README: it turns every 10,000 pairs


def test_asyncio_pair_cost_is_taken_on_a_loop_out_of_debug_mode(monkeypatch) -> None:
    # PYTHONASYNCIODEBUG=1 (or -X dev) puts every new loop in debug mode,
    # where call_later() records a traceback: the figure, and the ratio the
    # report prints beside hwtimer's, came out ten times those of the loop
    # a service runs
    import asyncio

    from hwtimer.__main__ import _pair_cost_asyncio

    debug_seen: set[bool] = set()

    class Loop(asyncio.SelectorEventLoop):
        def call_later(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            debug_seen.add(self.get_debug())
            return super().call_later(*args, **kwargs)

    monkeypatch.setenv("PYTHONASYNCIODEBUG", "1")
    monkeypatch.setattr(asyncio, "new_event_loop", Loop)
    probe = Loop()
    try:
        assert probe.get_debug()  # what the environment asks of a new loop
    finally:
        probe.close()
    assert _pair_cost_asyncio(1_000) > 0
    assert debug_seen == {False}


@pytest.mark.parametrize("example", ["echo_service.py", "heartbeat.py", "failback.py"])
def test_examples_answer_help_under_python_oo(example: str) -> None:
    # -OO strips the docstring their --help takes its description from
    proc = run_example(example, "--help", flags=("-OO",), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: "), proc.stdout


@pytest.mark.parametrize(
    "example, option",
    [
        ("echo_service.py", "--request-timeout"),
        ("echo_service.py", "--idle-timeout"),
        ("heartbeat.py", "--timeout"),
    ],
)
@pytest.mark.parametrize("value", ["nan", "0", "-1"])
def test_examples_refuse_a_timeout_no_deadline_can_hold(example: str, option: str, value: str):
    # refused with a usage line, not served: each connection would end in
    # a ValueError (NaN) or be closed at once (<= 0)
    proc = run_example(example, "--port", "0", f"{option}={value}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{option} must be a number of seconds > 0" in proc.stderr


@pytest.mark.parametrize("example", ["echo_service.py", "heartbeat.py"])
@pytest.mark.parametrize("port", ["65536", "-1"])
def test_examples_refuse_a_port_out_of_range(example: str, port: str) -> None:
    # a usage line, not the traceback of bind()'s OverflowError
    proc = run_example(example, f"--port={port}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--port must be a TCP port, 0 to 65535" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("example", ["echo_service.py", "heartbeat.py"])
def test_examples_say_when_their_port_is_taken(example: str) -> None:
    # one line and exit status 1, not a traceback
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_example(example, "--port", str(port))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot serve on 127.0.0.1:{port}: " in proc.stderr
    assert "Traceback" not in proc.stderr


def test_echo_service_says_when_uvloop_is_missing(tmp_path) -> None:
    # --uvloop where uvloop cannot be imported: a usage line naming it, not
    # import's traceback (a uvloop.py that fails stands in for none)
    (tmp_path / "uvloop.py").write_text('raise ImportError("no uvloop here")\n')
    proc = run_example("echo_service.py", "--uvloop", "--demo", PYTHONPATH=str(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--uvloop needs uvloop" in proc.stderr
    assert "Traceback" not in proc.stderr
