"""hwtimer's pytest plugin, loaded through its pytest11 entry point with no
conftest: the manual_timer fixture, its failure for tasks that raised, and
the follow_loop_time fixture and ini switch.  Each case runs pytest in a
subprocess, as a user's project would."""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ["pytester"]

INI = """
[pytest]
asyncio_default_fixture_loop_scope = function
"""


def run(pytester: pytest.Pytester, code: str, ini: str = INI) -> pytest.RunResult:
    pytester.makeini(ini)
    pytester.makepyfile(test_user=textwrap.dedent(code))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")


def test_manual_timer_fixture_is_there_without_a_conftest(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        import threading
        import hwtimer
        from hwtimer.testing import ManualTimer

        def test_it(manual_timer):
            assert isinstance(manual_timer, ManualTimer)
            assert hwtimer.default_timer() is manual_timer
            seen = []
            t = threading.Thread(target=lambda: seen.append(hwtimer.default_timer()))
            t.start(); t.join()
            assert seen == [manual_timer]
            ran = []
            manual_timer.new_timeout(ran.append, 60)
            manual_timer.advance(60.001)
            assert len(ran) == 1

        def test_after(manual_timer):
            assert manual_timer.time() == 0.0  # a new timer for each test

        def test_outside():
            assert not isinstance(hwtimer.default_timer(), ManualTimer)
        """,
    )
    result.assert_outcomes(passed=3)


def test_manual_timer_fails_a_test_that_left_tasks_that_raised(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        def boom(timeout):
            raise LookupError("the task failed")

        def test_left_errors(manual_timer):
            manual_timer.new_timeout(boom, 1)
            manual_timer.advance(2)

        def test_checked_errors(manual_timer):
            manual_timer.new_timeout(boom, 1)
            manual_timer.advance(2)
            assert [type(e) for e in manual_timer.task_errors] == [LookupError]
            manual_timer.task_errors.clear()
        """,
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*1 task(s) of the manual_timer raised*", "*LookupError: the task failed*"]
    )


def test_manual_timer_fails_a_test_whose_loop_callbacks_raised(pytester: pytest.Pytester) -> None:
    # call_later() and call_every() callbacks go to the loop's exception
    # handler, as asyncio's do; the fixture sees them all the same
    result = run(
        pytester,
        """
        import pytest

        def boom():
            raise LookupError("the callback failed")

        @pytest.mark.asyncio
        async def test_call_later(manual_timer):
            manual_timer.call_later(1, boom)
            await manual_timer.advance_async(2)

        @pytest.mark.asyncio
        async def test_call_every(manual_timer):
            manual_timer.call_every(1, boom)
            await manual_timer.advance_async(2)

        @pytest.mark.asyncio
        async def test_checked(manual_timer):
            manual_timer.call_later(1, boom)
            await manual_timer.advance_async(2)
            assert [type(e) for e in manual_timer.task_errors] == [LookupError]
            manual_timer.task_errors.clear()
        """,
    )
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(["*LookupError: the callback failed*"])


def test_manual_timer_is_stopped_after_the_test(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        kept = []

        def test_schedule(manual_timer):
            kept.append(manual_timer)
            kept.append(manual_timer.new_timeout(print, 10))

        def test_check():
            timer, timeout = kept
            assert timeout.is_cancelled()
            assert timer.stop() == []
        """,
    )
    result.assert_outcomes(passed=2)


#: A loop whose clock jumps 200 s forward inside a 100 s scope:
#: run_jump() says whether the scope followed the loop's time.
JUMP_PRELUDE = """
        import asyncio
        import pytest
        import hwtimer

        class JumpLoop(asyncio.SelectorEventLoop):
            offset = 0.0
            def time(self):
                return super().time() + self.offset

        async def scoped(loop):
            try:
                async with hwtimer.timeout(100):
                    loop.offset += 200
                    await asyncio.sleep(0.05)
            except TimeoutError:
                return "timed out"
            return "not timed out"

        def run_jump():
            loop = JumpLoop()
            try:
                return loop.run_until_complete(scoped(loop))
            finally:
                loop.close()
"""


def test_follow_loop_time_fixture_and_ini_switch(pytester: pytest.Pytester) -> None:
    code = (
        JUMP_PRELUDE
        + """

        def test_fixture(follow_loop_time):
            assert run_jump() == "timed out"

        def test_plain():
            assert run_jump() == EXPECTED
        """
    )
    run(pytester, code.replace("EXPECTED", '"not timed out"')).assert_outcomes(passed=2)
    ini = INI + "hwtimer_follow_loop_time = true\n"
    run(pytester, code.replace("EXPECTED", '"timed out"'), ini).assert_outcomes(passed=2)


def test_the_ini_switch_holds_in_fixtures_too(pytester: pytest.Pytester) -> None:
    # every test: its fixtures' setup and teardown as well as its body
    code = (
        JUMP_PRELUDE
        + """

        seen = []

        @pytest.fixture
        def jumps():
            seen.append(("setup", run_jump()))
            yield
            seen.append(("teardown", run_jump()))

        def test_with_fixture(jumps):
            seen.append(("call", run_jump()))

        def test_all_followed():
            assert seen == [("setup", "timed out"), ("call", "timed out"),
                            ("teardown", "timed out")]
        """
    )
    ini = INI + "hwtimer_follow_loop_time = true\n"
    run(pytester, code, ini).assert_outcomes(passed=2)
