"""What the stable-ABI build (HWTIMER_LIMITED_API=1) does its own way.

The limited API has no PyContext_*, no type fields and no
PyObject_CallFinalizerFromDealloc(), so that build enters contexts through
Context.run(), reads type names through __name__ and finalizes a dropped
timer in its dealloc (test_timer.py's ResourceWarning cases).  These
cases pin the behaviour both builds share; the whole suite runs on both
(.ci/run).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sysconfig
from typing import Any, Callable

import pytest
from conftest import DEADLINE

import hwtimer
import hwtimer._hwtimer as ext


def test_the_build_is_the_expected_one() -> None:
    # scripts/check-abi3.sh (run by .ci/run) sets this for the abi3 build
    # it installs, so that a stale full-API extension cannot pass for it
    expected = os.environ.get("HWTIMER_EXPECT_LIMITED_API")
    name = os.path.basename(ext.__file__)
    if expected is None:
        pytest.skip(f"HWTIMER_EXPECT_LIMITED_API not set; testing {name}")
    suffix = ".abi3.so" if expected == "1" else sysconfig.get_config_var("EXT_SUFFIX")
    assert name == "_hwtimer" + suffix


def test_callback_in_an_entered_context_is_reported(
    make_timer: Callable[..., hwtimer.HashedWheelTimer],
) -> None:
    # A context cannot be entered twice: the callback does not run, the
    # loop's handler hears of it, and the rest of the batch runs.
    timer = make_timer(0.001)
    entered = contextvars.copy_context()
    loop = asyncio.new_event_loop()
    called = []

    async def main() -> dict[str, Any]:
        reported = loop.create_future()
        ran_after = loop.create_future()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if not reported.done():
                reported.set_result(context)

        loop.set_exception_handler(handler)
        timer.call_later(0.01, called.append, 1, context=entered)
        timer.call_later(0.01, ran_after.set_result, True)
        context = await asyncio.wait_for(reported, DEADLINE)
        assert await asyncio.wait_for(ran_after, DEADLINE) is True
        return context

    try:
        context = entered.run(loop.run_until_complete, main())
    finally:
        loop.close()
    assert isinstance(context["exception"], RuntimeError)
    assert called == []


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda t: t.new_timeout(42, 1), "int"),
        (lambda t: t.new_timeout(print, "soon"), "str"),
        (lambda t: hwtimer.HashedWheelTimer(thread_name=b"x"), "bytes"),
        (lambda t: hwtimer.HashedWheelTimer(ticks_per_wheel=1.5), "float"),
    ],
)
def test_type_errors_name_the_type(
    timer: hwtimer.HashedWheelTimer, call: Callable[[Any], object], name: str
) -> None:
    with pytest.raises(TypeError) as info:
        call(timer)
    assert f"not {name}" in str(info.value)


def test_timeout_cannot_be_created() -> None:
    with pytest.raises(TypeError, match="cannot create '.*Timeout' instances"):
        hwtimer.Timeout()
