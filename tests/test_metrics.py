"""hwtimer.metrics: timers' statistics as Prometheus and OpenTelemetry
metrics, read the way a monitoring system reads them (a real HTTP scrape
on loopback, generate_latest, the OpenTelemetry SDK's in-memory reader)."""

from __future__ import annotations

import asyncio
import gc
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from conftest import DEADLINE, README, run_python, wait_for

import hwtimer
from hwtimer import metrics
from hwtimer.testing import ManualTimer

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

COUNTERS = {
    "hwtimer_timeouts_scheduled": "scheduled",
    "hwtimer_timeouts_expired": "expired",
    "hwtimer_timeouts_cancelled": "cancelled",
    "hwtimer_timeouts_taken_back": "taken_back",
    "hwtimer_timeouts_rejected": "rejected",
    "hwtimer_task_errors": "task_errors",
    "hwtimer_worker_ticks": "ticks",
    "hwtimer_worker_wakeups": "wakeups",
    "hwtimer_task_untimed": "untimed_tasks",
}
GAUGES = {
    "hwtimer_timeouts_pending": "pending",
    "hwtimer_max_expired_per_tick": "max_expired_per_tick",
    "hwtimer_task_time_max_seconds": "task_time_max",
    "hwtimer_task_lateness_samples": "late_samples",
    "hwtimer_wheel_fullest_bucket": "fullest_bucket",
    "hwtimer_timeouts_never_due": "never_due",
}
# one sample per level of the wheel, labelled `level`: name -> levels key
PER_LEVEL = {
    "hwtimer_wheel_level_timeouts": "timeouts",
    "hwtimer_wheel_level_occupied_buckets": "occupied",
    "hwtimer_wheel_level_fullest_bucket": "fullest",
}
QUANTILES = {"0.5": "late_p50", "0.99": "late_p99", "1": "late_max"}
# OpenTelemetry: name -> (stats key, kind, unit)
OTEL = {
    "hwtimer.timeouts.scheduled": ("scheduled", "counter", "{timeout}"),
    "hwtimer.timeouts.expired": ("expired", "counter", "{timeout}"),
    "hwtimer.timeouts.cancelled": ("cancelled", "counter", "{timeout}"),
    "hwtimer.timeouts.taken_back": ("taken_back", "counter", "{timeout}"),
    "hwtimer.timeouts.rejected": ("rejected", "counter", "{timeout}"),
    "hwtimer.task.errors": ("task_errors", "counter", "{task}"),
    "hwtimer.worker.ticks": ("ticks", "counter", "{tick}"),
    "hwtimer.worker.wakeups": ("wakeups", "counter", "{wakeup}"),
    "hwtimer.task.untimed": ("untimed_tasks", "counter", "{task}"),
    "hwtimer.timeouts.pending": ("pending", "up-down", "{timeout}"),
    "hwtimer.max_expired_per_tick": ("max_expired_per_tick", "gauge", "{timeout}"),
    "hwtimer.task.time_max": ("task_time_max", "gauge", "s"),
    "hwtimer.task.lateness_samples": ("late_samples", "gauge", "{task}"),
    "hwtimer.wheel.fullest_bucket": ("fullest_bucket", "gauge", "{timeout}"),
    "hwtimer.timeouts.never_due": ("never_due", "up-down", "{timeout}"),
}
OTEL_PER_LEVEL = {
    "hwtimer.wheel.level.timeouts": ("timeouts", "up-down", "{timeout}"),
    "hwtimer.wheel.level.occupied_buckets": ("occupied", "up-down", "{bucket}"),
    "hwtimer.wheel.level.fullest_bucket": ("fullest", "gauge", "{timeout}"),
}


def settled_timer(make_timer, name: str, fire: int, cancel: int) -> hwtimer.HashedWheelTimer:
    """A timer named `name` on which `fire` timeouts fired (the first one
    raising), `cancel` + 1 were cancelled and one was rejected, all of it
    processed: with nothing pending its worker blocks, and its stats() no
    longer change."""
    timer = make_timer(0.005, 64, thread_name=name, max_pending_timeouts=cancel + 1)
    ran = threading.Semaphore(0)

    def task(_t):
        ran.release()

    def failing(_t):
        ran.release()
        raise RuntimeError("a task that fails, on purpose")

    for i in range(fire):  # one at a time: the limit is never near
        timer.new_timeout(failing if i == 0 else task, 0.0)
        assert ran.acquire(timeout=DEADLINE)
    assert wait_for(lambda: timer.pending_timeouts() == 0)
    # Nothing of these can expire or be cancelled before the rejection.
    held = [timer.new_timeout(task, 3600) for _ in range(cancel + 1)]
    with pytest.raises(hwtimer.RejectedExecutionError):
        timer.new_timeout(task, 3600)
    assert all(t.cancel() for t in held)

    def processed() -> bool:
        s = timer.stats()
        return (s["cancelled"], s["late_samples"], s["pending"]) == (cancel + 1, fire, 0)

    assert wait_for(processed)
    return timer


@pytest.fixture
def two_timers(make_timer) -> list[hwtimer.HashedWheelTimer]:
    return [settled_timer(make_timer, "api", 5, 3), settled_timer(make_timer, "jobs", 2, 7)]


@pytest.fixture(autouse=True)
def quiet_task_errors(caplog):
    """The failing tasks above log a WARNING each, as they should."""
    caplog.set_level("CRITICAL", logger="hwtimer")


def by_name(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


#: What the worker counts even on a settled timer: a wake-up it was already
#: on its way to may land between two reads.
MOVING = {"ticks", "wakeups"}


def read_between(exported: list[float], before: dict, after: dict, key: str) -> bool:
    """Whether `exported` is the one value of `key` that stats() had at some
    moment between the `before` and `after` reads."""
    if len(exported) != 1:
        return False
    if key in MOVING:
        return before[key] <= exported[0] <= after[key]
    return before[key] == exported[0] == after[key]


def snapshot(timers: list[hwtimer.HashedWheelTimer]) -> dict[str, dict]:
    return {timer.thread_name: dict(timer.stats()) for timer in timers}


def levels_of(stats: dict) -> dict[tuple[str, str], float]:
    """stats()["levels"] as (metric, level) -> value."""
    return {
        (name, str(level)): figures[key]
        for name, key in PER_LEVEL.items()
        for level, figures in enumerate(stats["levels"])
    }


def per_level(families: dict, timer: str) -> dict[tuple[str, str], float]:
    """The per-level gauges of `timer` in a parsed exposition, the same way."""
    got = {}
    for name in PER_LEVEL:
        assert families[name].type == "gauge"
        for s in families[name].samples:
            if s.labels["timer"] == timer:
                assert set(s.labels) == {"timer", "level"}
                got[name, s.labels["level"]] = s.value
    return got


def check_exposition(text: str, timers: list[hwtimer.HashedWheelTimer], before: dict) -> None:
    """`text`, parsed as Prometheus reads it, holds each timer's stats() as
    read between `before` (a snapshot()) and now."""
    families = by_name(text)
    assert set(families) == {*COUNTERS, *GAUGES, *PER_LEVEL, "hwtimer_task_lateness_seconds"}
    for timer in timers:
        stats = timer.stats()
        earlier = before[timer.thread_name]
        label = {"timer": timer.thread_name}
        for name, key in COUNTERS.items():
            family = families[name]
            assert family.type == "counter"
            samples = [s for s in family.samples if s.labels == label]
            assert {s.name for s in samples} == {name + "_total"}
            assert read_between([s.value for s in samples], earlier, stats, key), (name, samples)
        for name, key in GAUGES.items():
            family = families[name]
            assert family.type == "gauge"
            samples = [s for s in family.samples if s.labels == label]
            assert {s.name for s in samples} == {name}
            assert read_between([s.value for s in samples], earlier, stats, key), (name, samples)
        assert per_level(families, timer.thread_name) == levels_of(stats)
        summary = families["hwtimer_task_lateness_seconds"]
        assert summary.type == "summary"
        quantiles = {
            s.labels["quantile"]: s.value
            for s in summary.samples
            if s.labels["timer"] == timer.thread_name
        }
        assert quantiles == {q: pytest.approx(stats[k]) for q, k in QUANTILES.items()}
        # seconds, in order, and within what a busy machine can be late by
        assert 0 <= quantiles["0.5"] <= quantiles["0.99"] <= quantiles["1"] < DEADLINE
    api = {s.labels["timer"]: s.value for s in families["hwtimer_timeouts_scheduled"].samples}
    assert api == {"api": 5 + 3 + 1, "jobs": 2 + 7 + 1}
    errors = {s.labels["timer"]: s.value for s in families["hwtimer_task_errors"].samples}
    assert errors == {"api": 1, "jobs": 1}
    rejected = {s.labels["timer"]: s.value for s in families["hwtimer_timeouts_rejected"].samples}
    assert rejected == {"api": 1, "jobs": 1}


@pytest.fixture
def registry() -> Iterator[object]:
    yield prometheus_client.CollectorRegistry()


def test_scrape_over_http(two_timers, registry):
    metrics.register_prometheus(*two_timers, registry=registry)
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        before = snapshot(two_timers)
        with urllib.request.urlopen(url, timeout=DEADLINE) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(DEADLINE)
    check_exposition(text, two_timers, before)


def test_generate_latest(two_timers, registry):
    collector = metrics.register_prometheus(*two_timers, registry=registry)
    before = snapshot(two_timers)
    check_exposition(prometheus_client.generate_latest(registry).decode(), two_timers, before)
    registry.unregister(collector)
    assert prometheus_client.generate_latest(registry) == b""


def test_openmetrics_exposition_says_units(two_timers, registry):
    from prometheus_client.openmetrics.exposition import generate_latest

    metrics.register_prometheus(*two_timers, registry=registry)
    text = generate_latest(registry).decode()
    assert "# UNIT hwtimer_task_lateness_seconds seconds" in text
    assert "# UNIT hwtimer_task_time_max_seconds seconds" in text
    assert 'hwtimer_timeouts_expired_total{timer="api"} 5.0' in text


def test_default_registry(make_timer):
    timer = make_timer(thread_name="in-default-registry")
    collector = metrics.register_prometheus(timer)
    try:
        text = prometheus_client.generate_latest().decode()
        assert 'hwtimer_timeouts_pending{timer="in-default-registry"} 0.0' in text
    finally:
        prometheus_client.REGISTRY.unregister(collector)


def check_pending_follows(timer: hwtimer.HashedWheelTimer, pending: Callable[[], float]) -> None:
    """Each read of `pending` (the exported pending figure) is the timer's
    count at that moment, not one taken earlier."""
    assert pending() == 0
    timeouts = [timer.new_timeout(lambda t: None, 3600) for _ in range(4)]
    assert pending() == 4
    for t in timeouts:
        t.cancel()
    assert wait_for(lambda: pending() == 0)


def test_scrapes_follow_the_timer(make_timer, registry):
    timer = make_timer(0.005, 64, thread_name="live")
    metrics.register_prometheus(timer, registry=registry)

    def pending() -> float:
        families = by_name(prometheus_client.generate_latest(registry).decode())
        return families["hwtimer_timeouts_pending"].samples[0].value

    check_pending_follows(timer, pending)


def test_cancels_count_when_cancel_returns(make_timer, registry):
    """A cancel counts when cancel() returns, not when the worker gets to
    it (here it sleeps for a minute-long tick): what the figure says and
    what its help says."""
    timer = make_timer(60.0, 64, thread_name="long-tick")
    metrics.register_prometheus(timer, registry=registry)
    held = [timer.new_timeout(lambda _t: None, 3600) for _ in range(3)]
    assert all(t.cancel() for t in held)
    family = by_name(prometheus_client.generate_latest(registry).decode())[
        "hwtimer_timeouts_cancelled"
    ]
    assert [s.value for s in family.samples] == [3]
    assert "cancel()" in family.documentation


def take_back_a_handover(
    read: Callable[[hwtimer.HashedWheelTimer], dict[str, float]],
) -> list[dict[str, float]]:
    """Hands two call_later() callbacks of a ManualTimer to a loop that
    does not run them, takes one back with a cancel and the other with a
    reset, and returns what `read` (the exported expired, taken_back and
    cancelled) gave after each step: stats()["expired"] goes 2, 1, 0."""
    loop = asyncio.new_event_loop()
    timer = ManualTimer()
    try:
        seen = [read(timer)]
        cancelled = timer.call_later(1, print, "never", loop=loop)
        reset = timer.call_later(1, print, "never", loop=loop)
        timer.advance(1)  # handed to the loop, not run
        seen.append(read(timer))
        assert cancelled.cancel() and timer.stats()["expired"] == 1
        seen.append(read(timer))
        assert reset.reset(60) and timer.stats()["expired"] == 0
        seen.append(read(timer))
    finally:
        timer.stop()
        loop.close()
    return seen


# what each step of take_back_a_handover() exports: expired never goes down
TAKEN_BACK = [
    {"expired": 0, "taken_back": 0, "cancelled": 0},
    {"expired": 2, "taken_back": 0, "cancelled": 0},
    {"expired": 2, "taken_back": 1, "cancelled": 1},
    {"expired": 2, "taken_back": 2, "cancelled": 1},
]


def test_expired_total_never_goes_down(registry):
    """A call_later() callback taken back from its loop unrun leaves
    stats()["expired"]; a counter must not go down (Prometheus would read
    a reset), so expired_total keeps it and taken_back_total counts it."""

    registered: list[object] = []

    def read(timer: hwtimer.HashedWheelTimer) -> dict[str, float]:
        if not registered:
            registered.append(metrics.register_prometheus(timer, registry=registry))
        label = {"timer": timer.thread_name}
        return {
            key: registry.get_sample_value(f"hwtimer_timeouts_{key}_total", label)
            for key in ("expired", "taken_back", "cancelled")
        }

    assert take_back_a_handover(read) == TAKEN_BACK


def test_a_loops_close_counts_as_a_take_back(registry):
    """Callbacks handed to a loop that is closed before it runs them are
    cancelled by the close: taken_back_total and cancelled_total count
    them, as their help says, and expired_total - taken_back_total is
    stats()["expired"] again."""
    loop = asyncio.new_event_loop()
    timer = ManualTimer()
    try:
        metrics.register_prometheus(timer, registry=registry)
        for _ in range(2):
            timer.call_later(1, print, "never", loop=loop)
        timer.advance(1)  # handed to the loop, not run
        loop.close()
        label = {"timer": timer.thread_name}
        exported = {
            key: registry.get_sample_value(f"hwtimer_timeouts_{key}_total", label)
            for key in ("expired", "taken_back", "cancelled")
        }
        assert exported == {"expired": 2, "taken_back": 2, "cancelled": 2}
        assert timer.stats()["expired"] == 0
        families = by_name(prometheus_client.generate_latest(registry).decode())
        for name in ("hwtimer_timeouts_taken_back", "hwtimer_timeouts_cancelled"):
            assert "close" in families[name].documentation
    finally:
        timer.stop()
        loop.close()


def test_a_timer_gone_drops_out(registry):
    kept = hwtimer.HashedWheelTimer(0.01, 64, thread_name="kept")
    gone = hwtimer.HashedWheelTimer(0.01, 64, thread_name="gone")
    try:
        metrics.register_prometheus(kept, gone, registry=registry)
        gone.stop()
        del gone
        gc.collect()
        families = by_name(prometheus_client.generate_latest(registry).decode())
        labels = {s.labels["timer"] for s in families["hwtimer_timeouts_pending"].samples}
        assert labels == {"kept"}
    finally:
        kept.stop()


SHARED_IN_FORK_CHILD = """
    import os, sys, time, warnings
    # 3.12+ warns about fork() in a process with threads; that is the point
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import hwtimer
    from hwtimer import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    metrics.register_prometheus(hwtimer.default_timer(), registry=registry)
    metrics.register_otel(MeterProvider(metric_readers=[reader]).get_meter("t"),
                          hwtimer.default_timer())

    def read():
        # (scheduled, pending) by Prometheus, then by OpenTelemetry, for
        # the shared timer
        label = {"timer": "hwtimer-default"}
        prom = tuple(registry.get_sample_value(name, label) for name in
                     ("hwtimer_timeouts_scheduled_total", "hwtimer_timeouts_pending"))
        names = ("hwtimer.timeouts.scheduled", "hwtimer.timeouts.pending")
        points = {  # (the SDK may add metrics of its own, histograms)
            m.name: [p.value for p in m.data.data_points]
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics if m.name in names
        }
        otel = tuple(points[name][0] for name in names)
        return tuple(map(float, prom + otel))

    for _ in range(5):
        hwtimer.default_timer().new_timeout(lambda t: None, 60).cancel()
    parent = read()
    pid = os.fork()
    if pid == 0:
        kept = [hwtimer.default_timer().new_timeout(lambda t: None, 60) for _ in range(3)]
        print("child", read(), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    print("parent", parent, read(), flush=True)
"""


def test_the_shared_timer_is_followed_into_a_fork_child():
    """An exporter given default_timer() reads, in a child of fork(), the
    child's shared timer: the parent's is stopped there, and its figures
    would stand still (a service that registers before it forks workers)."""
    pytest.importorskip("opentelemetry.sdk")
    proc = run_python(SHARED_IN_FORK_CHILD, timeout=90)
    assert proc.returncode == 0, proc.stderr
    child = "child (3.0, 3.0, 3.0, 3.0)"
    parent = "parent (5.0, 0.0, 5.0, 0.0) (5.0, 0.0, 5.0, 0.0)"
    assert proc.stdout.splitlines() == [child, parent], proc.stderr


def test_bad_timers_change_nothing(make_timer, registry):
    a = make_timer(thread_name="same")
    b = make_timer(thread_name="same")
    with pytest.raises(ValueError, match="no timer"):
        metrics.register_prometheus(registry=registry)
    with pytest.raises(TypeError, match="HashedWheelTimer"):
        metrics.register_prometheus(a, object(), registry=registry)
    with pytest.raises(ValueError, match="two timers named 'same'"):
        metrics.register_prometheus(a, b, registry=registry)
    assert prometheus_client.generate_latest(registry) == b""
    # a second collector of the same metrics in one registry is refused
    metrics.register_prometheus(a, registry=registry)
    before = prometheus_client.generate_latest(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        metrics.register_prometheus(b, registry=registry)
    assert prometheus_client.generate_latest(registry) == before


def test_not_a_registry_is_refused(timer):
    with pytest.raises(TypeError, match="registry must be a prometheus_client CollectorRegistry"):
        metrics.register_prometheus(timer, registry=object())


def test_every_stats_key_is_exported(timer):
    """FIGURES and LATENESS are the one place figures are defined: a key
    added to stats() (and to its TypedDict) must be given a row there."""
    rows = [(f.key, f.level_key) for f in metrics.FIGURES]
    exported = [key for key, _ in rows] + [k for _, k in metrics.LATENESS.keys]
    assert len(rows) == len(set(rows))
    assert set(exported) == set(hwtimer.Stats.__annotations__) == set(timer.stats())
    per_level = {level_key for key, level_key in rows if key == "levels"}
    assert per_level == set(hwtimer.LevelStats.__annotations__) - {"bucket_seconds", "buckets"}
    assert all(
        set(level) == set(hwtimer.LevelStats.__annotations__) for level in timer.stats()["levels"]
    )


def test_missing_library_names_the_extra(monkeypatch, timer):
    monkeypatch.setitem(sys.modules, "prometheus_client.core", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'hwtimer[prometheus]'")):
        metrics.register_prometheus(timer)
    monkeypatch.setitem(sys.modules, "opentelemetry.metrics", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'hwtimer[otel]'")):
        metrics.register_otel(object(), timer)


def test_importing_hwtimer_imports_neither_library():
    proc = run_python(
        """
        import sys
        import hwtimer, hwtimer.metrics
        loaded = sorted(m for m in sys.modules
                        if m.split(".")[0] in ("prometheus_client", "opentelemetry"))
        print(loaded)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ---- OpenTelemetry ----


@pytest.fixture
def otel_reader() -> Iterator[tuple[object, object]]:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider.get_meter("hwtimer-tests"), reader
    provider.shutdown()


def otel_metrics(reader) -> dict:
    data = reader.get_metrics_data()
    return {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }


def test_otel_instruments(two_timers, otel_reader):
    from opentelemetry.sdk.metrics.export import Gauge, Sum

    meter, reader = otel_reader
    instruments = metrics.register_otel(meter, *two_timers)
    assert len(instruments) == len(metrics.FIGURES) + 1
    before = snapshot(two_timers)
    got = otel_metrics(reader)
    assert set(got) == {*OTEL, *OTEL_PER_LEVEL, "hwtimer.task.lateness"}
    for timer in two_timers:
        stats = timer.stats()
        for name, (key, kind, unit) in OTEL.items():
            m = got[name]
            assert m.unit == unit and m.description
            if kind == "gauge":
                assert isinstance(m.data, Gauge)
            else:
                assert isinstance(m.data, Sum) and m.data.is_monotonic == (kind == "counter")
            points = [p for p in m.data.data_points if p.attributes == {"timer": timer.thread_name}]
            earlier = before[timer.thread_name]
            assert read_between([p.value for p in points], earlier, stats, key), (name, points)
        for name, (key, kind, unit) in OTEL_PER_LEVEL.items():
            m = got[name]
            assert m.unit == unit and m.description
            assert isinstance(m.data, Gauge if kind == "gauge" else Sum)
            points = {
                p.attributes["level"]: p.value
                for p in m.data.data_points
                if p.attributes["timer"] == timer.thread_name
            }
            assert points == {str(i): lv[key] for i, lv in enumerate(stats["levels"])}
        lateness = got["hwtimer.task.lateness"]
        assert isinstance(lateness.data, Gauge) and lateness.unit == "s"
        quantiles = {
            p.attributes["quantile"]: p.value
            for p in lateness.data.data_points
            if p.attributes["timer"] == timer.thread_name
        }
        assert quantiles == {q: pytest.approx(stats[k]) for q, k in QUANTILES.items()}


def test_otel_follows_the_timer(make_timer, otel_reader):
    meter, reader = otel_reader
    timer = make_timer(thread_name="otel-live")
    metrics.register_otel(meter, timer)

    def pending() -> int:
        return otel_metrics(reader)["hwtimer.timeouts.pending"].data.data_points[0].value

    check_pending_follows(timer, pending)


def test_otel_expired_never_goes_down(otel_reader):
    meter, reader = otel_reader
    registered: list[object] = []

    def read(timer: hwtimer.HashedWheelTimer) -> dict[str, float]:
        if not registered:
            registered.append(metrics.register_otel(meter, timer))
        found = otel_metrics(reader)
        assert found["hwtimer.timeouts.expired"].data.is_monotonic
        return {
            key: found[f"hwtimer.timeouts.{key}"].data.data_points[0].value
            for key in ("expired", "taken_back", "cancelled")
        }

    assert take_back_a_handover(read) == TAKEN_BACK


def test_otel_bad_timers(make_timer, otel_reader):
    meter, _ = otel_reader
    with pytest.raises(ValueError, match="no timer"):
        metrics.register_otel(meter)
    with pytest.raises(TypeError, match="HashedWheelTimer"):
        metrics.register_otel(meter, "timer")


def test_otel_not_a_meter_is_refused(make_timer, otel_reader):
    meter, reader = otel_reader
    timer = make_timer(thread_name="after")
    for bad in (None, object()):
        with pytest.raises(TypeError, match="meter must be an OpenTelemetry Meter"):
            metrics.register_otel(bad, timer)
    # nothing was taken: the timer still goes on a real meter
    metrics.register_otel(meter, timer)
    points = otel_metrics(reader)["hwtimer.timeouts.pending"].data.data_points
    assert [p.attributes for p in points] == [{"timer": "after"}]


def test_otel_a_timer_given_for_the_meter_is_named_as_such(make_timer):
    # register_otel(timer), the meter forgotten: the error says what the
    # first argument should have been, not that no timer was given
    timer = make_timer(thread_name="no-meter")
    with pytest.raises(TypeError, match="meter must be an OpenTelemetry Meter, not HashedWheel"):
        metrics.register_otel(timer)


def test_otel_a_second_call_on_one_meter_is_refused(make_timer, otel_reader):
    """A meter asked for an instrument it has already returns that one and
    drops the new callbacks: a second register_otel() on it would leave its
    timers out of every collection without a word.  It is refused, as a
    Prometheus registry refuses a second collector, and changes nothing."""
    meter, reader = otel_reader
    first = make_timer(thread_name="first")
    second = make_timer(thread_name="second")
    metrics.register_otel(meter, first)
    with pytest.raises(ValueError, match="register_otel"):
        metrics.register_otel(meter, second)
    points = otel_metrics(reader)["hwtimer.timeouts.pending"].data.data_points
    assert [p.attributes for p in points] == [{"timer": "first"}]


def test_otel_a_refused_call_leaves_the_meter_free(make_timer, otel_reader):
    meter, reader = otel_reader
    timer = make_timer(thread_name="later")
    with pytest.raises(ValueError, match="no timer"):
        metrics.register_otel(meter)
    metrics.register_otel(meter, timer)
    points = otel_metrics(reader)["hwtimer.timeouts.pending"].data.data_points
    assert [p.attributes for p in points] == [{"timer": "later"}]


def test_otel_meters_of_the_global_provider_are_known_by_what_they_become():
    """opentelemetry.metrics.get_meter() before the service sets its
    MeterProvider (a module-level meter, the usual way) returns a new proxy
    meter each call, and each proxy turns into the provider's one meter of
    that name once the provider is set: instruments made through a second
    proxy, or through that meter itself, would be dropped then without a
    word, as on a meter asked twice.  They are refused the same way."""
    pytest.importorskip("opentelemetry.sdk")
    proc = run_python(
        """
        import hwtimer
        from opentelemetry import metrics as otel
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from hwtimer import metrics

        timers = [hwtimer.HashedWheelTimer(0.01, 8, thread_name=n) for n in "abcd"]

        def refused(meter, timer):
            try:
                metrics.register_otel(meter, timer)
            except ValueError as e:
                return "register_otel" in str(e)
            return False

        first = otel.get_meter("app")
        metrics.register_otel(first, timers[0])
        print("second proxy refused:", refused(otel.get_meter("app"), timers[1]))
        metrics.register_otel(otel.get_meter("other"), timers[2])
        reader = InMemoryMetricReader()
        otel.set_meter_provider(MeterProvider(metric_readers=[reader]))
        print("its meter refused:", refused(otel.get_meter("app"), timers[3]))
        print("the proxy still refused:", refused(first, timers[3]))
        seen = sorted(
            p.attributes["timer"]
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "hwtimer.timeouts.pending"
            for p in m.data.data_points
        )
        print("seen:", seen)
        for timer in timers:
            timer.stop()
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "second proxy refused: True",
        "its meter refused: True",
        "the proxy still refused: True",
        "seen: ['a', 'c']",
    ], proc.stdout + proc.stderr


class MeterByName:
    """A meter that wraps another and, as a dataclass would, compares
    equal to any other of the same name: unhashable, or (with hash) equal
    to a different meter."""

    def __init__(self, meter: object, name: str, hashable: bool) -> None:
        self.meter = meter
        self.name = name
        self.hashable = hashable

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeterByName) and other.name == self.name

    def __hash__(self) -> int:
        if not self.hashable:
            raise TypeError(f"unhashable type: {type(self).__name__!r}")
        return hash(self.name)

    def __getattr__(self, name: str) -> object:
        return getattr(self.meter, name)


def test_otel_knows_its_meters_by_identity(make_timer):
    """A meter is one register_otel() has used by being that object, not by
    comparing equal to it: an unhashable meter is taken, and so is another
    meter that compares equal to one already used."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    readers = [InMemoryMetricReader() for _ in range(3)]
    providers = [MeterProvider(metric_readers=[r]) for r in readers]
    try:
        meters = [
            MeterByName(providers[0].get_meter("a"), "same", hashable=False),
            MeterByName(providers[1].get_meter("b"), "same", hashable=True),
            MeterByName(providers[2].get_meter("c"), "same", hashable=True),
        ]
        for i, (meter, reader) in enumerate(zip(meters, readers)):
            timer = make_timer(thread_name=f"by-identity-{i}")
            assert len(metrics.register_otel(meter, timer)) == len(metrics.FIGURES) + 1
            points = otel_metrics(reader)["hwtimer.timeouts.pending"].data.data_points
            assert [p.attributes for p in points] == [{"timer": f"by-identity-{i}"}]
        # the very same meter is still refused
        with pytest.raises(ValueError, match="register_otel"):
            metrics.register_otel(meters[1], make_timer(thread_name="again"))
    finally:
        for provider in providers:
            provider.shutdown()


# ---- the README's examples ----


def monitoring_examples() -> list[str]:
    """The Python code blocks of the README's "Monitoring" section."""
    if not README.exists():
        pytest.skip("README.rst is not beside these tests")
    text = README.read_text()
    section = text.split("\nMonitoring\n----------\n", 1)[1]
    section = re.split(r"\n[^\n]+\n-{3,}\n", section, maxsplit=1)[0]
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", section)
    return [re.sub(r"^    ", "", b, flags=re.M) for b in blocks]


def test_readme_has_both_examples():
    examples = monitoring_examples()
    assert any("register_prometheus" in e for e in examples)
    assert any("register_otel" in e for e in examples)
    assert "pending_snapshot" in examples[2]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_readme_example_runs(index, tmp_path):
    code = monitoring_examples()[index]
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hwtimer" in proc.stdout
    if "register_prometheus" in code:
        assert by_name(proc.stdout)["hwtimer_timeouts_expired"].samples[0].value > 0
    elif "pending_snapshot" in code:
        lines = proc.stdout.splitlines()
        assert [re.sub(r"[\d.]+ s later", "_", line) for line in lines[:3]] == [
            "Timeout(deadline: _, task: <class 'str'>)"
        ] * 3
        assert "hwtimer fullest bucket: 2" in lines[3]
        # 1 s (twice) and 5 s on level 0, 10, 30 and 60 s on level 1
        assert lines[4].startswith("0 {'bucket_seconds': 0.01, 'buckets': 512, 'occupied': 2,")
        assert "'timeouts': 3" in lines[5]
    else:
        assert '"name": "hwtimer.timeouts.expired"' in proc.stdout


def test_readme_scrape_output_is_what_a_scrape_gives(timer, registry):
    """The scrape the README shows it printed has the families a scrape
    gives, in their order and of their type, and figures a real scrape
    could hold: each of its 100 tasks timed or untimed."""
    section = README.read_text().split("\nPrometheus\n~~~~~~~~~~\n", 1)[1]
    shown = section.split("It printed", 1)[1].split("::\n\n", 1)[1]
    shown = "".join(re.findall(r"^    (.*\n)", shown.split("\n\n", 1)[0], flags=re.M))
    types = re.findall(r"^# TYPE (\S+) (\S+)$", shown, flags=re.M)
    metrics.register_prometheus(timer, registry=registry)
    scraped = prometheus_client.generate_latest(registry).decode()
    assert types == re.findall(r"^# TYPE (\S+) (\S+)$", scraped, flags=re.M)
    value = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^(hwtimer_\w+)\{timer="hwtimer-default"\} (\S+)$', shown, re.M)
    }
    timed, untimed = value["hwtimer_task_lateness_samples"], value["hwtimer_task_untimed_total"]
    assert timed + untimed == value["hwtimer_timeouts_expired_total"] == 100


def test_spread_of_a_known_layout(make_timer, registry, otel_reader):
    """Timeouts held where the wheel puts them show up per level in both
    exporters: 3 due in one tick and 2 in another on level 0 (64 ticks of
    0.05 s), 4 a minute or so ahead on upper levels, 1 never due."""
    timer = make_timer(0.05, 64, thread_name="layout")
    task = lambda _t: None  # noqa: E731
    held = [timer.new_timeout(task, 2.0) for _ in range(3)]
    held += [timer.new_timeout(task, 2.5) for _ in range(2)]
    held += [timer.new_timeout(task, d) for d in (60.0, 61.0, 3600.0, 7200.0)]
    held.append(timer.new_timeout(task, float("inf")))

    def in_wheel() -> bool:
        stats = timer.stats()
        return sum(lv["timeouts"] for lv in stats["levels"]) + stats["never_due"] == 10

    # a worker held up past 2 s (a slow machine) takes the first five in
    # only to expire them: the layout is then never whole
    assert wait_for(lambda: in_wheel() or timer.stats()["expired"] > 0)
    if not in_wheel():
        pytest.skip("timeouts fell due before the worker took them in (a slow machine)")
    stats = timer.stats()
    if stats["levels"][0]["timeouts"] != 5:
        pytest.skip("the wheel's turn ended between the schedules (a slow machine)")
    assert stats["fullest_bucket"] == 3 and stats["levels"][0]["occupied"] == 2
    assert stats["never_due"] == 1
    assert sum(lv["timeouts"] for lv in stats["levels"][1:]) == 4
    metrics.register_prometheus(timer, registry=registry)
    families = by_name(prometheus_client.generate_latest(registry).decode())
    assert per_level(families, "layout") == levels_of(stats)
    assert families["hwtimer_wheel_fullest_bucket"].samples[0].value == 3
    meter, reader = otel_reader
    metrics.register_otel(meter, timer)
    got = otel_metrics(reader)
    points = {
        p.attributes["level"]: p.value for p in got["hwtimer.wheel.level.timeouts"].data.data_points
    }
    assert points == {str(i): lv["timeouts"] for i, lv in enumerate(stats["levels"])}
    assert all(t.cancel() for t in held)
