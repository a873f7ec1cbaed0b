"""The stubs in hwtimer/*.pyi match the extension module, checked by mypy's
stubtest against the installed package, so that they cannot drift."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest
from conftest import PACKAGE_ROOT


@pytest.mark.skipif("san.so" in os.environ.get("LD_PRELOAD", ""), reason="under a sanitizer")
def test_stubtest_finds_no_difference(tmp_path) -> None:
    pytest.importorskip("mypy.stubtest")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "hwtimer._hwtimer"],
        cwd=tmp_path,  # the installed package, as the suite tests it
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_extras_ask_for_a_mypy_that_reads_the_stubs() -> None:
    # The stubs import typing_extensions.disjoint_base, which the typeshed
    # of mypy 1.17 and older lacks: stubtest stops there with "not checking
    # stubs due to mypy build errors".
    from packaging.requirements import Requirement

    requires = [Requirement(r) for r in importlib.metadata.requires("hwtimer") or []]
    for extra in ("test", "lint"):
        found = [
            r
            for r in requires
            if r.name == "mypy" and r.marker is not None and r.marker.evaluate({"extra": extra})
        ]
        assert found, (extra, requires)
        for requirement in found:
            assert not requirement.specifier.contains("1.17.1"), (extra, str(requirement))


USER_CODE = """
from decimal import Decimal

import hwtimer
from hwtimer import HashedWheelTimer
from hwtimer.testing import ManualTimer, use_timer

with ManualTimer() as manual:
    ran: int = manual.advance(1)
with HashedWheelTimer() as timer:
    pending: int = timer.pending_timeouts()


def pending_of(timer: HashedWheelTimer) -> int:
    with timer:  # stops it, and lets every exception through
        return timer.pending_timeouts()


def advanced() -> int:
    with ManualTimer() as manual:
        return manual.advance(1)


with use_timer(ManualTimer()) as installed:
    now: float = installed.time()


class Extended(HashedWheelTimer):
    def __init__(self, tick_duration: float, *, thread_name: str) -> None:
        super().__init__(tick_duration, thread_name=thread_name)
        self.extra = 1


with Extended(0.5, thread_name="extended") as extended:
    extra: int = extended.extra


async def pause() -> str:
    async with hwtimer.timeout(Decimal("0.5")):
        return await hwtimer.sleep(Decimal("0.1"), "slept")
"""


@pytest.mark.skipif("san.so" in os.environ.get("LD_PRELOAD", ""), reason="under a sanitizer")
def test_the_stubs_type_a_users_code(tmp_path) -> None:
    """What stubtest does not see: the types a user's code gets, checked by
    mypy --strict against the installed package (a timer's `with` gives
    the timer's own class)."""
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(USER_CODE)
    env = dict(os.environ)
    if os.path.basename(PACKAGE_ROOT) != "site-packages":
        env["MYPYPATH"] = PACKAGE_ROOT  # a checkout (an editable install mypy cannot follow)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
