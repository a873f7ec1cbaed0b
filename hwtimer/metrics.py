"""Timer statistics for Prometheus and OpenTelemetry.

``register_prometheus(timer, ...)`` adds a collector for one or more timers
to a ``prometheus_client`` registry; ``register_otel(meter, timer, ...)``
creates OpenTelemetry observable instruments on a ``Meter``.  Both read
``timer.stats()`` when they are scraped or collected, label each figure with
the timer's ``thread_name``, and hold their timers weakly: a timer that is
gone drops out of the figures.

Neither library is imported by ``import hwtimer`` or ``import
hwtimer.metrics``; each is imported when its function is first called, and
is an optional extra (``pip install 'hwtimer[prometheus]'``,
``'hwtimer[otel]'``).

Every figure is one row of ``FIGURES`` (plus ``LATENESS``, the quantiles):
a new ``stats()`` key reaches both exporters by adding a row there.  A row
with a ``level_key`` reads that key of each dict in ``stats()["levels"]``
and labels it with the level.
"""

from __future__ import annotations

import importlib
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from . import _default
from ._hwtimer import HashedWheelTimer

if TYPE_CHECKING:
    from ._stats import Stats

__all__ = [
    "FIGURES",
    "LATENESS",
    "Figure",
    "Quantiles",
    "PrometheusCollector",
    "register_otel",
    "register_prometheus",
]

#: Kinds of figure.  A COUNTER counts since the timer was made (Prometheus
#: counter, OpenTelemetry observable counter); a LEVEL goes up and down and
#: adds up across timers (Prometheus gauge, OpenTelemetry observable
#: up-down counter); a GAUGE is a value that does not add up, a maximum say
#: (a gauge in both).
COUNTER = "counter"
LEVEL = "level"
GAUGE = "gauge"


@dataclass(frozen=True)
class Figure:
    """One ``stats()`` key as a metric.

    ``name`` is dotted, as OpenTelemetry names are (``hwtimer.`` + name);
    Prometheus takes it with underscores, ``hwtimer_`` before it, ``_seconds``
    after it for a time and ``_total`` after a counter.
    """

    key: str
    name: str
    kind: str
    seconds: bool
    unit: str  # OpenTelemetry's unit: "s" for seconds, "{thing}" for counts
    help: str
    level_key: str | None = None  # per level: this key of each stats()["levels"] dict
    plus: str | None = None  # a stats() key whose value is added to key's

    def observations(self, stats: Stats) -> Iterator[tuple[dict[str, str], float]]:
        """Yields (labels beyond ``timer``, value) for this figure of one
        timer: one value, or one per level of the wheel."""
        if self.level_key is None:
            extra = stats[self.plus] if self.plus else 0  # type: ignore[literal-required]
            yield {}, stats[self.key] + extra  # type: ignore[literal-required]
            return
        for level, figures in enumerate(stats["levels"]):
            yield {"level": str(level)}, figures[self.level_key]  # type: ignore[literal-required]


@dataclass(frozen=True)
class Quantiles:
    """Keys of ``stats()`` that are quantiles of one distribution, in
    seconds: a Prometheus summary, an OpenTelemetry gauge with a
    ``quantile`` attribute."""

    name: str
    keys: tuple[tuple[str, str], ...]  # (quantile, stats key)
    help: str


FIGURES: tuple[Figure, ...] = (
    Figure("scheduled", "timeouts.scheduled", COUNTER, False, "{timeout}",
           "Timeouts accepted by new_timeout() and call_later()."),
    # stats()["expired"] counts a call_later() callback from its handover to
    # its loop, and no longer if a cancel or reset (or the loop's close or
    # collection) takes it back before it runs: a counter must never go
    # down, so the take-backs are added back
    Figure("expired", "timeouts.expired", COUNTER, False, "{timeout}",
           "Timeouts that fired, tasks that raised included; a call_later() callback"
           " at each handover to its loop, also if a cancel, a reset or the loop's close"
           " then took it back unrun (timeouts.taken_back counts those).", plus="taken_back"),
    Figure("taken_back", "timeouts.taken_back", COUNTER, False, "{timeout}",
           "call_later() callbacks handed to their loop that a cancel, a reset or the"
           " loop's close (or collection) took back before they ran."),
    Figure("cancelled", "timeouts.cancelled", COUNTER, False, "{timeout}",
           "Timeouts cancelled, each counted when its cancel() returns (or by stop(), or"
           " by the close or collection of a call_later() callback's loop)."),
    Figure("rejected", "timeouts.rejected", COUNTER, False, "{timeout}",
           "Timeouts refused because max_pending_timeouts was reached."),
    Figure("task_errors", "task.errors", COUNTER, False, "{task}",
           "Tasks and callbacks that raised."),
    Figure("ticks", "worker.ticks", COUNTER, False, "{tick}",
           "Ticks whose bucket the worker processed."),
    Figure("wakeups", "worker.wakeups", COUNTER, False, "{wakeup}",
           "Times the worker woke from sleep."),
    Figure("pending", "timeouts.pending", LEVEL, False, "{timeout}",
           "Timeouts scheduled and neither expired nor cancelled."),
    Figure("max_expired_per_tick", "max_expired_per_tick", GAUGE, False, "{timeout}",
           "The largest batch of timeouts one tick expired, since the timer was made."),
    Figure("task_time_max", "task.time_max", GAUGE, True, "s",
           "The longest a timed task has run, since the timer was made."),
    Figure("late_samples", "task.lateness_samples", GAUGE, False, "{task}",
           "Tasks in the window the lateness quantiles are taken over (at most 4096)."),
    Figure("untimed_tasks", "task.untimed", COUNTER, False, "{task}",
           "Tasks of large batches run without a clock read, so outside the lateness"
           " figures."),
    Figure("fullest_bucket", "wheel.fullest_bucket", GAUGE, False, "{timeout}",
           "Timeouts in the fullest bucket of level 0: the most that fall due in one tick"
           " of the wheel's current turn."),
    Figure("never_due", "timeouts.never_due", LEVEL, False, "{timeout}",
           "Pending timeouts whose deadline is never reached (an infinite delay)."),
    Figure("levels", "wheel.level.timeouts", LEVEL, False, "{timeout}",
           "Timeouts held on each level of the wheel (level 0: the configured wheel).",
           level_key="timeouts"),
    Figure("levels", "wheel.level.occupied_buckets", LEVEL, False, "{bucket}",
           "Buckets holding at least one timeout, on each level of the wheel.",
           level_key="occupied"),
    Figure("levels", "wheel.level.fullest_bucket", GAUGE, False, "{timeout}",
           "Timeouts in the fullest bucket of each level of the wheel.",
           level_key="fullest"),
)  # fmt: skip

LATENESS = Quantiles(
    "task.lateness",
    (("0.5", "late_p50"), ("0.99", "late_p99"), ("1", "late_max")),
    "From a timeout's deadline to its task's start, over the last timed tasks"
    " (quantile 1 is the maximum).",
)


def _import(module: str, extra: str) -> ModuleType:
    """Imports an optional dependency, or says which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module} is needed for this: pip install 'hwtimer[{extra}]'") from exc


class _Timers:
    """The timers one exporter reads, held weakly, each with its label.

    The shared timer is read as default_timer() would make it: in a child
    of fork(), the child's own, not the parent's that the child stopped.
    """

    def __init__(self, timers: Iterable[HashedWheelTimer]) -> None:
        refs: list[tuple[str, Callable[[], HashedWheelTimer | None]]] = []
        for timer in timers:
            if not isinstance(timer, HashedWheelTimer):
                raise TypeError(f"expected a HashedWheelTimer, not {type(timer).__name__}")
            name = timer.thread_name
            if any(name == seen for seen, _ in refs):
                raise ValueError(
                    f"two timers named {name!r}: give each a thread_name of its own,"
                    " which labels its figures"
                )
            shared = timer is _default._timer
            refs.append((name, _default._shared if shared else weakref.ref(timer)))
        if not refs:
            raise ValueError("no timer given")
        self._refs = tuple(refs)

    def stats(self) -> Iterator[tuple[str, Stats]]:
        """Yields (label, stats()) for each timer still alive."""
        for name, ref in self._refs:
            timer = ref()
            if timer is not None:
                yield name, timer.stats()


class _Registry(Protocol):
    """What register_prometheus() needs of a registry: a ``register()``."""

    def register(self, *args: Any, **kwargs: Any) -> Any: ...


class _Meter(Protocol):
    """What register_otel() needs of an OpenTelemetry ``Meter``: its three
    ``create_observable_*()`` methods."""

    def create_observable_counter(self, *args: Any, **kwargs: Any) -> Any: ...
    def create_observable_up_down_counter(self, *args: Any, **kwargs: Any) -> Any: ...
    def create_observable_gauge(self, *args: Any, **kwargs: Any) -> Any: ...


def _prometheus_name(name: str, seconds: bool) -> str:
    return "hwtimer_" + name.replace(".", "_") + ("_seconds" if seconds else "")


class PrometheusCollector:
    """A ``prometheus_client`` collector of one or more timers' statistics.

    Each scrape calls ``stats()`` once per timer, so the figures of one
    timer in one scrape are consistent with each other.
    """

    def __init__(self, *timers: HashedWheelTimer) -> None:
        self._timers = _Timers(timers)
        self._core = _import("prometheus_client.core", "prometheus")

    def _families(
        self,
    ) -> tuple[list[Any], list[tuple[Any, Figure]], list[tuple[Any, str, str]]]:
        """Empty metric families; the families filled from figures; and
        the summary's, each with its quantile and stats key."""
        core = self._core
        families: list[Any] = []
        figures: list[tuple[Any, Figure]] = []
        for fig in FIGURES:
            name = _prometheus_name(fig.name, fig.seconds)
            cls = core.CounterMetricFamily if fig.kind == COUNTER else core.GaugeMetricFamily
            labels = ["timer"] if fig.level_key is None else ["timer", "level"]
            family = cls(name, fig.help, labels=labels, unit="seconds" if fig.seconds else "")
            families.append(family)
            figures.append((family, fig))
        summary = core.Metric(
            _prometheus_name(LATENESS.name, True), LATENESS.help, "summary", unit="seconds"
        )
        families.append(summary)
        quantiles = [(summary, q, key) for q, key in LATENESS.keys]
        return families, figures, quantiles

    def describe(self) -> list[Any]:
        """The metric families without samples, for the registry's checks."""
        return self._families()[0]

    def collect(self) -> list[Any]:
        families, figures, quantiles = self._families()
        for label, stats in self._timers.stats():
            for family, fig in figures:
                for labels, value in fig.observations(stats):
                    family.add_metric([label, *labels.values()], value)
            for family, quantile, key in quantiles:
                family.add_sample(
                    family.name,
                    {"timer": label, "quantile": quantile},
                    stats[key],  # type: ignore[literal-required]
                )
        return families


def register_prometheus(
    *timers: HashedWheelTimer, registry: _Registry | None = None
) -> PrometheusCollector:
    """Registers a collector of `timers` with `registry` (by default
    ``prometheus_client.REGISTRY``, the one ``start_http_server()`` and
    ``generate_latest()`` read) and returns it; ``registry.unregister()``
    takes it out again.  ``TypeError`` for something that is not a timer,
    ``ValueError`` for no timer or two with the same ``thread_name``, and
    the registry's ``ValueError`` if these metrics are registered there
    already."""
    collector = PrometheusCollector(*timers)
    if registry is None:
        registry = _import("prometheus_client", "prometheus").REGISTRY
    _require_methods(registry, "registry", "a prometheus_client CollectorRegistry", "register")
    registry.register(collector)
    return collector


#: The Meter method that makes each kind of figure's instrument.
_OTEL_KINDS = {
    COUNTER: "create_observable_counter",
    LEVEL: "create_observable_up_down_counter",
    GAUGE: "create_observable_gauge",
}


def _require_methods(obj: Any, what: str, kind: str, *methods: str) -> None:
    """TypeError, before anything is registered, if `obj` lacks one of
    `methods`: it is not the `kind` it was given as."""
    if not all(callable(getattr(obj, m, None)) for m in methods):
        raise TypeError(f"{what} must be {kind}, not {type(obj).__name__}")


#: The meters register_otel() has created its instruments on, by id(): a
#: meter is the object, whatever its __eq__ and __hash__ say (the entry
#: goes with the meter, before its id can be reused).  A meter asked again
#: for an instrument it has returns the one it has and drops the new
#: callbacks, so a second call would leave its timers out unseen.
_otel_meters: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_otel_lock = threading.Lock()

#: The proxy meters register_otel() has used while they had no meter behind
#: them yet.  ``opentelemetry.metrics.get_meter()`` before the service sets
#: its MeterProvider returns a new proxy each call; once the provider is
#: set, each proxy hands its instruments to that provider's meter of the
#: proxy's name, version and schema URL, the one meter the provider has for
#: them.  So two such proxies, or one and that meter, are one meter.  (The
#: proxies live as long as the API's proxy provider, which holds them all.)
_otel_proxies: list[Any] = []


def _proxy_meter_class() -> type | None:
    """The OpenTelemetry API's proxy meter class, or None if it has moved:
    then meters are known by identity alone."""
    try:
        internal = importlib.import_module("opentelemetry.metrics._internal")
    except ImportError:
        return None
    cls = getattr(internal, "_ProxyMeter", None)
    return cls if isinstance(cls, type) else None


def _scope(meter: Any) -> tuple[Any, ...]:
    return (meter.name, meter.version, meter.schema_url)


def _meter_behind(meter: Any) -> Any:
    """The meter that makes `meter`'s instruments: for an OpenTelemetry
    proxy meter, the meter it hands them to (None while it has none yet);
    for any other, `meter` itself."""
    proxy_cls = _proxy_meter_class()
    if proxy_cls is not None and isinstance(meter, proxy_cls):
        return getattr(meter, "_real_meter", None)
    return meter


def _otel_used(meter: Any) -> bool:
    """Whether register_otel() has made its instruments on `meter`, or on
    a meter that is or will be the same (see _otel_proxies).  Called with
    _otel_lock held."""
    behind = _meter_behind(meter)
    if behind is None:  # a proxy not set yet: it becomes its scope's meter
        scope = _scope(meter)
        return any(
            p is meter or (getattr(p, "_real_meter", None) is None and _scope(p) == scope)
            for p in _otel_proxies
        )
    if any(p is meter for p in _otel_proxies) or _otel_meters.get(id(behind)) is behind:
        return True
    return any(getattr(p, "_real_meter", None) is behind for p in _otel_proxies)


def register_otel(meter: _Meter, *timers: HashedWheelTimer) -> list[Any]:
    """Creates on `meter` (an OpenTelemetry ``Meter``) one observable
    instrument per figure, reading `timers`, and returns the instruments.
    Each instrument calls ``stats()`` when the reader collects it.  Same
    errors as ``register_prometheus`` for `timers`, and ``ValueError`` if
    `meter` has these instruments already (from an earlier call: give all
    timers to one call)."""
    otel = _import("opentelemetry.metrics", "otel")
    # the meter first: register_otel(timer), the meter forgotten, is told so
    _require_methods(meter, "meter", "an OpenTelemetry Meter", *_OTEL_KINDS.values())
    timer_set = _Timers(timers)
    with _otel_lock:
        if _otel_used(meter):
            raise ValueError(
                "this meter has hwtimer's instruments already: register_otel() takes"
                " all timers of one meter in one call"
            )
        instruments = _create_otel(otel, meter, timer_set)
        _otel_remember(meter)
    return instruments


def _otel_remember(meter: Any) -> None:
    """Records that register_otel() has used `meter`: a proxy with no meter
    behind it yet by its scope, any other by the identity of the meter
    behind it.  Called with _otel_lock held."""
    behind = _meter_behind(meter)
    if behind is None:
        _otel_proxies.append(meter)
        return
    try:
        _otel_meters[id(behind)] = behind
    except TypeError:  # a meter that cannot be weakly referenced goes unchecked
        pass


def _create_otel(otel: ModuleType, meter: Any, timer_set: _Timers) -> list[Any]:
    """register_otel()'s instruments, on `meter`, reading `timer_set`."""

    def observe(fig: Figure) -> Any:
        # One callback per instrument: one observation per timer (and level).
        def callback(_options: Any) -> list[Any]:
            return [
                otel.Observation(value, {"timer": label, **attributes})
                for label, stats in timer_set.stats()
                for attributes, value in fig.observations(stats)
            ]

        return callback

    def observe_lateness(_options: Any) -> list[Any]:
        return [
            otel.Observation(stats[key], {"timer": label, "quantile": q})  # type: ignore[literal-required]
            for label, stats in timer_set.stats()
            for q, key in LATENESS.keys
        ]

    create = {kind: getattr(meter, method) for kind, method in _OTEL_KINDS.items()}
    instruments = [
        create[fig.kind](
            "hwtimer." + fig.name,
            callbacks=[observe(fig)],
            unit=fig.unit,
            description=fig.help,
        )
        for fig in FIGURES
    ]
    instruments.append(
        meter.create_observable_gauge(
            "hwtimer." + LATENESS.name,
            callbacks=[observe_lateness],
            unit="s",
            description=LATENESS.help,
        )
    )
    return instruments
