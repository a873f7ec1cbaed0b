"""hwtimer under looptime, the pytest plugin that runs asyncio tests on a
fake loop clock: in a test that looptime runs, hwtimer's plugin makes the
asyncio helpers follow the loop's time(), so that a timeout of 3 s fires at
loop time 3 with no real wait, and hwtimer.sleep(3) moves loop time by 3.

The cases run as a user's project runs them: pytest in a subprocess, with
pytest-asyncio, looptime and hwtimer's plugin loaded from their entry
points (in this process pytest-asyncio would leave an event loop unclosed
after a sync test: its issue 724)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from hwtimer import pytest_plugin

pytest.importorskip("looptime")
pytest.importorskip("pytest_asyncio")
pytest_plugins = ["pytester"]

CASES = """
import asyncio
import time

import pytest

import hwtimer


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_timeout_fires_at_loop_time() -> None:
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with hwtimer.timeout(3):
            await asyncio.sleep(100)
    assert loop.time() == pytest.approx(3)
    assert time.monotonic() - started < 2  # no real wait


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_sleep_moves_loop_time_at_no_real_cost() -> None:
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    assert await hwtimer.sleep(3, "done") == "done"
    assert loop.time() == pytest.approx(3)
    assert time.monotonic() - started < 2


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_wait_for_and_timeout_at_follow_loop_time() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await hwtimer.wait_for(asyncio.sleep(3600), 60)
    assert loop.time() == pytest.approx(60)
    assert await hwtimer.wait_for(asyncio.sleep(5, "quick"), 60) == "quick"
    with pytest.raises(TimeoutError):
        async with hwtimer.timeout_at(loop.time() + 10):
            await asyncio.sleep(3600)
    assert loop.time() == pytest.approx(75)


@pytest.mark.asyncio
@pytest.mark.looptime(False)
async def test_looptime_false_keeps_the_wheel() -> None:
    from hwtimer._hwtimer import _follow_loop_time

    assert _follow_loop_time(None) is False
    started = time.monotonic()
    async with hwtimer.timeout(5):
        await hwtimer.sleep(0.01)
    assert time.monotonic() - started >= 0.01
"""


def test_looptime(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_user=CASES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4)


NO_LOOPTIME_CASES = """
import asyncio
import time

import pytest

import hwtimer
from hwtimer._hwtimer import _follow_loop_time


@pytest.mark.asyncio
@pytest.mark.looptime(True)
async def test_marked_true_runs_on_fake_time() -> None:
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with hwtimer.timeout(3):
            await asyncio.sleep(100)
    assert loop.time() == pytest.approx(3)
    assert time.monotonic() - started < 2  # no real wait


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_marked_bare_stays_on_the_wheel() -> None:
    assert _follow_loop_time(None) is False
"""


def test_no_looptime_and_a_looptime_true_marker(pytester: pytest.Pytester) -> None:
    # looptime lets looptime(True) override --no-looptime: hwtimer follows
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_user=NO_LOOPTIME_CASES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "--no-looptime")
    result.assert_outcomes(passed=2)


BLOCKED_CASES = """
import pytest

from hwtimer._hwtimer import _follow_loop_time


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_marked_but_looptime_is_off() -> None:
    assert _follow_loop_time(None) is False
"""


def test_looptime_plugin_turned_off_leaves_its_markers_on_real_time(
    pytester: pytest.Pytester,
) -> None:
    # with looptime's plugin turned off (-p no:looptime_plugin) its markers
    # move no clock: hwtimer stays on the wheel's real time too
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_user=BLOCKED_CASES)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-q", "-p", "no:looptime_plugin"
    )
    result.assert_outcomes(passed=1)


class _Item:
    """What looptime's and hwtimer's decisions read of a test item."""

    def __init__(self, flag: bool | None, markers: list[Any]) -> None:
        self.config = SimpleNamespace(
            getoption=lambda name, default=None: flag,
            pluginmanager=SimpleNamespace(
                getplugin=lambda name: None, is_blocked=lambda name: False
            ),
        )
        self.markers = markers

    def iter_markers(self, name: str) -> Any:
        return (m for m in self.markers if m.name == name)


def test_the_rules_decide_as_the_installed_looptime() -> None:
    # hwtimer's own copy of the rules, for a looptime without _get_options(),
    # agrees with the installed looptime on every combination
    from looptime._internal.plugin import _get_options

    def mark(name: str, *args: Any, **kwargs: Any) -> Any:
        # what both read of a marker (looptime's plugin, which registers its
        # marker, is not loaded in this process)
        return SimpleNamespace(name=name, args=args, kwargs=kwargs)

    marks = [
        mark("looptime"),
        mark("looptime", True),
        mark("looptime", False),
        mark("looptime", start=5),
        mark("asyncio"),
    ]
    for flag in (None, True, False):
        for n in range(3):
            for markers in itertools.permutations(marks, n):
                item: Any = _Item(flag, list(markers))
                expected = _get_options(item) is not None
                assert pytest_plugin._looptime_rules(item) is expected, (flag, markers)
                assert pytest_plugin._under_looptime(item) is expected, (flag, markers)
