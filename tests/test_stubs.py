"""The stubs in hwtimer/*.pyi match the extension module, checked by mypy's
stubtest against the installed package, so that they cannot drift."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import os
import subprocess
import sys

import pytest
from conftest import PACKAGE_ROOT

from hwtimer import _hwtimer


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
import contextlib
from decimal import Decimal
from types import TracebackType

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


class Named(HashedWheelTimer):
    def __new__(cls, name: str) -> "Named":
        return super().__new__(cls, 0.05, 16, thread_name=name)

    def __init__(self, name: str) -> None:  # pyright checks the base's too
        super().__init__()  # keeps what __new__ set


class Plain(HashedWheelTimer):
    pass


named: Named = Named("named")
plain: Plain = Plain(0.5)
named.stop()
plain.stop()


class Logged(HashedWheelTimer):
    def __exit__(
        self,
        exc_type: "type[BaseException] | None",
        exc: "BaseException | None",
        tb: "TracebackType | None",
        /,
    ) -> None:
        super().__exit__(exc_type, exc, tb)
        print("stopped")


def logged() -> int:
    with Logged() as timer:  # lets every exception through, as the base does
        return timer.pending_timeouts()


async def pause() -> str:
    async with hwtimer.timeout(Decimal("0.5")):
        return await hwtimer.sleep(Decimal("0.1"), "slept")


async def stacked() -> "float | None":
    async with contextlib.AsyncExitStack() as stack:
        scope = await stack.enter_async_context(hwtimer.timeout(1))
        return scope.when()


def a_scope() -> contextlib.AbstractAsyncContextManager[hwtimer.TimeoutScope]:
    return hwtimer.timeout_at(None)
"""


def _mypy_strict(tmp_path, code: str) -> subprocess.CompletedProcess[str]:
    """Runs mypy --strict on `code`, a user's module, against the hwtimer
    under test."""
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(code)
    env = dict(os.environ)
    if os.path.basename(PACKAGE_ROOT) != "site-packages":
        env["MYPYPATH"] = PACKAGE_ROOT  # a checkout (an editable install mypy cannot follow)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif("san.so" in os.environ.get("LD_PRELOAD", ""), reason="under a sanitizer")
def test_the_stubs_type_a_users_code(tmp_path) -> None:
    """What stubtest does not see: the types a user's code gets, checked by
    mypy --strict against the installed package (a timer's `with` gives
    the timer's own class, and so does a subclass's super().__new__(); a
    subclass's __exit__ returns None, as one that swallows nothing does; a
    timeout scope is an async context manager, for AsyncExitStack too)."""
    proc = _mypy_strict(tmp_path, USER_CODE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Each line marked "# wrong" must get an error, and no other line: what
# asyncio's stubs flag in the same call to loop.call_later() (its callback's
# arguments checked against *args) the stubs flag in hwtimer's; and a
# metrics exporter given a timer where its meter or registry goes.
WRONG_USER_CODE = """
import asyncio

import hwtimer
from hwtimer import metrics


def two(a: int, b: str) -> None: ...


async def main() -> None:
    loop = asyncio.get_running_loop()
    timer = hwtimer.default_timer()
    timer.call_later(1, two, 1, "b")
    loop.call_later(1, two, 1, "b")
    timer.call_later(1, two, "b", 1)  # wrong
    loop.call_later(1, two, "b", 1)  # wrong
    timer.call_later(1, two, 1, loop=loop)  # wrong
    loop.call_later(1, two, 1)  # wrong
    timer.call_every(1, two, 1, "b", delay=0)
    timer.call_every(1, two, "b", 1, delay=0)  # wrong
    timer.call_every(1, two, 1, "b", "c")  # wrong
    metrics.register_otel(timer)  # wrong
    metrics.register_prometheus(timer, registry=timer)  # wrong
"""


@pytest.mark.skipif("san.so" in os.environ.get("LD_PRELOAD", ""), reason="under a sanitizer")
def test_the_stubs_flag_a_users_wrong_arguments(tmp_path) -> None:
    proc = _mypy_strict(tmp_path, WRONG_USER_CODE)
    flagged = {int(line.split(":")[1]) for line in proc.stdout.splitlines() if ": error:" in line}
    wrong = {
        n for n, line in enumerate(WRONG_USER_CODE.splitlines(), 1) if line.endswith("# wrong")
    }
    assert flagged == wrong, proc.stdout + proc.stderr


METRICS_USER_CODE = """
from opentelemetry.metrics import NoOpMeter, get_meter
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import REGISTRY, CollectorRegistry

import hwtimer
from hwtimer import metrics

timer = hwtimer.default_timer()
metrics.register_otel(MeterProvider().get_meter("my-service"), timer)
metrics.register_otel(get_meter("proxy"), timer)
metrics.register_otel(NoOpMeter("no-op"), timer)
registry = CollectorRegistry()
registry.unregister(metrics.register_prometheus(timer, registry=registry))
metrics.register_prometheus(timer, registry=REGISTRY)
metrics.register_prometheus(timer)
"""


@pytest.mark.skipif("san.so" in os.environ.get("LD_PRELOAD", ""), reason="under a sanitizer")
def test_the_metrics_exporters_take_a_real_meter_and_registry(tmp_path) -> None:
    """The meter and the registry are typed by the methods the exporters
    call: OpenTelemetry's meters and prometheus_client's registries have
    them."""
    pytest.importorskip("opentelemetry.sdk.metrics")
    pytest.importorskip("prometheus_client")
    proc = _mypy_strict(tmp_path, METRICS_USER_CODE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _stub_parameters(
    cls_name: str, method: str
) -> list[tuple[str, inspect._ParameterKind, object]]:
    """The parameters of `method` of class `cls_name` in _hwtimer.pyi, its
    first (cls or self) left out: name, kind and default (the literal, or
    inspect.Parameter.empty)."""
    stub = os.path.join(os.path.dirname(os.path.abspath(_hwtimer.__file__)), "_hwtimer.pyi")
    with open(stub, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name]
    (fn,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method]
    a = fn.args
    positional = [(p, inspect.Parameter.POSITIONAL_ONLY) for p in a.posonlyargs]
    positional += [(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in a.args]
    defaults: list[object] = [inspect.Parameter.empty] * (len(positional) - len(a.defaults))
    defaults += [ast.literal_eval(d) for d in a.defaults]
    params = [(p.arg, kind, d) for (p, kind), d in zip(positional, defaults)]
    params += [
        (
            p.arg,
            inspect.Parameter.KEYWORD_ONLY,
            inspect.Parameter.empty if d is None else ast.literal_eval(d),
        )
        for p, d in zip(a.kwonlyargs, a.kw_defaults)
    ]
    return params[1:]


@pytest.mark.parametrize(
    ("cls_name", "methods"),
    [
        ("HashedWheelTimer", ("__new__", "__init__")),
        ("_ManualTimer", ("__new__",)),
        ("TimeoutScope", ("__init__",)),
    ],
)
@pytest.mark.skipif(
    sys.version_info < (3, 10),
    reason="3.9 gives a type made from a spec no __text_signature__ to read",
)
def test_the_stubs_constructors_are_the_runtimes(cls_name: str, methods: tuple[str, ...]) -> None:
    """What stubtest does not see: the C types' __new__ and __init__ take
    (*args, **kwargs) to it, so a stub's constructor could name a keyword
    or give a default that the runtime does not have.  The runtime's own
    signature (its __text_signature__) is checked against its argument
    parsing too: every keyword it names is taken, with the default it
    shows, and one positional argument more than it shows is refused."""
    cls = getattr(_hwtimer, cls_name)
    runtime = inspect.signature(cls).parameters.values()
    expected = [(p.name, p.kind, p.default) for p in runtime]
    for method in methods:
        assert _stub_parameters(cls_name, method) == expected, method

    defaults = {p.name: p.default for p in runtime if p.default is not inspect.Parameter.empty}
    required = {p.name: None for p in runtime if p.default is inspect.Parameter.empty}
    made = cls(**required, **defaults)
    for name, value in defaults.items():
        if value is not None and hasattr(made, name):
            assert getattr(made, name) == value, name
    positional = [p for p in runtime if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    with pytest.raises(TypeError, match="positional"):
        cls(*[None] * (len(positional) + 1))
    if hasattr(made, "stop"):
        made.stop()
