"""hwtimer's pytest plugin, loaded on install through the ``pytest11`` entry
point: no conftest needed.

Fixtures:

- ``manual_timer``: a ``hwtimer.testing.ManualTimer`` installed with
  ``use_timer()`` for the test (so ``hwtimer.default_timer()``, and the
  asyncio helpers without ``timer=``, use it), stopped after it.  The test
  fails if tasks of the timer raised and the test left their exceptions in
  ``manual_timer.task_errors``: clear the list once the test has checked
  them.
- ``follow_loop_time``: ``hwtimer.testing.follow_loop_time()`` for the test,
  so that ``hwtimer.timeout()``, ``wait_for()`` and ``sleep()`` follow a
  fake-time event loop's ``time()`` (looptime's).

The switch is on by itself in every test that looptime runs on its fake
clock (marked ``looptime``, or all with ``--looptime``, and one marked
``looptime(True)`` even under ``--no-looptime``, and none with looptime's
plugin turned off: looptime's own decision, asked of looptime); the ini
option
``hwtimer_follow_loop_time = true`` turns it on for every test, its
fixtures' setup and teardown included.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator

import pytest

from .testing import ManualTimer, follow_loop_time, use_timer


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "hwtimer_follow_loop_time",
        "hwtimer: put the asyncio helpers' deadlines on the event loop's own clock in every "
        "test (for fake-time loops such as looptime's)",
        type="bool",
        default=False,
    )


def _looptime_decision(item: pytest.Item) -> Callable[[pytest.Item], object] | None:
    """looptime's own decision for a test, where its loaded plugin has one:
    ``_get_options(item)`` (looptime 0.9), None when looptime leaves the
    test on real time.  None where looptime's plugin is not loaded or has no
    such function."""
    plugin = item.config.pluginmanager.getplugin("looptime_plugin")
    decide = getattr(plugin, "_get_options", None)
    return decide if callable(decide) else None


def _looptime_rules(item: pytest.Item) -> bool:
    """looptime's decision by its rules, as looptime 0.9's _get_options()
    has them: ``--looptime`` turns it on for unmarked tests,
    ``--no-looptime`` off for them and for a bare ``looptime`` marker, and a
    marker's own argument (``looptime(True)`` or ``looptime(False)``), the
    closest winning, overrides both."""
    flag = item.config.getoption("looptime", None)  # None: looptime is absent or not asked
    markers = list(item.iter_markers("looptime"))
    enabled = bool((markers or flag is True) and flag is not False)
    for marker in reversed(markers):
        if marker.args:
            enabled = bool(marker.args[0])
    return enabled


def _under_looptime(item: pytest.Item) -> bool:
    """Whether looptime runs `item` on its fake loop clock: what looptime
    itself decides, asked of looptime where it can be.  Never where its
    plugin is turned off (``-p no:looptime_plugin``): its markers then move
    no clock."""
    if item.config.pluginmanager.is_blocked("looptime_plugin"):
        return False
    decide = _looptime_decision(item)
    if decide is not None:
        return decide(item) is not None
    return _looptime_rules(item)


def _follow_every_test(item: pytest.Item) -> bool:
    """Whether the ini option turns the switch on for every test: for its
    fixtures' setup and teardown too, not only its body."""
    return bool(item.config.getini("hwtimer_follow_loop_time"))


def _switched(on: bool) -> Iterator[None]:
    """A hook wrapper's body: the switch on around the phase, if `on`."""
    if not on:
        yield
        return
    with follow_loop_time():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _switched(_follow_every_test(item))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    # looptime moves its fake clock in the test's body only
    yield from _switched(_follow_every_test(item) or _under_looptime(item))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _switched(_follow_every_test(item))


def _describe(errors: list[BaseException]) -> str:
    lines = [f"{len(errors)} task(s) of the manual_timer raised:"]
    for exc in errors:
        lines.append("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    lines.append("(clear manual_timer.task_errors once the test has checked them)")
    return "\n".join(lines)


@pytest.fixture
def manual_timer() -> Iterator[ManualTimer]:
    """A ManualTimer installed as hwtimer.default_timer() for the test."""
    timer = ManualTimer()
    try:
        with use_timer(timer):
            yield timer
    finally:
        timer.stop()
    if timer.task_errors:
        pytest.fail(_describe(timer.task_errors), pytrace=False)


@pytest.fixture(name="follow_loop_time")
def follow_loop_time_fixture() -> Iterator[None]:
    """hwtimer's asyncio helpers follow the event loop's time() in the test."""
    with follow_loop_time():
        yield
