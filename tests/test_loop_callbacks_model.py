"""call_later() and call_every() on a ManualTimer against a plain model.

Hypothesis generates programs: callbacks scheduled from the loop (some in a
context of their own), cancels and resets of their handles, clock advances
with ``advance_async()``; each callback may, in a given run, cancel or reset
a handle (its own too), schedule another callback, read
``pending_timeouts()`` or raise.  The program runs on a real loop and a
ManualTimer, and through a model of what the documentation promises:

- a callback is due at the end of the first tick that ends at or after its
  deadline (ticks count from the timer's start: its first schedule or
  ``start()``), or at the next tick if that one has passed when the wheel
  takes it in; it runs once, in the loop's thread, while ``time()`` reads
  that tick's end, and a ``call_every`` one on its grid (period >= tick:
  every ``missed`` policy gives the same runs, except after a run a whole
  tick late, when ``"burst"`` runs the next grid point at once);
- callbacks of one tick run in the order the wheel took them in: a tick
  (and ``stats()``) first relinks those reset since, in reset order, then
  takes in those scheduled since, in scheduling order;
- ``cancel()`` and ``reset()`` answer as asyncio's handles do: a callback
  handed to the loop whose run has not begun can still be cancelled (it
  does not run) or reset (the run moves to the new deadline); a one-shot
  counts as expired from its handover until such a cancel (then cancelled)
  or reset (then pending); a one-shot in its own run has expired, and a
  periodic one in its own run takes the cancel or the next deadline;
- each callback sees the ``contextvars`` copy taken by its call (or the
  context given); a failure goes to the loop's exception handler and to
  ``task_errors`` and stops nothing but that periodic timeout;
- ``advance_async()`` returns the one-shots expired and the periodic runs
  handed over; ``pending_timeouts()``, ``stats()`` and ``stop()`` list what
  the model holds as pending;
- with ``max_pending_timeouts``, a schedule past the bound raises
  ``RejectedExecutionError`` and a reset that would make a handed-over
  one-shot pending again returns ``False`` (both count in ``rejected``);
  after a ``stop()`` part way, a schedule and ``start()`` raise
  ``RuntimeError`` and cancels and resets return ``False``.

A second test shares one ManualTimer between two loops in their own
threads, advanced from the test's thread with ``advance()``, one loop
closed part way (its pending callbacks are cancelled).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hwtimer
from hwtimer.testing import ManualTimer

TICK = 1_000_000  # ns: the ManualTimer's tick, 1 ms
WHEEL = 8  # ticks per wheel: a delay past 8 ms waits on a coarser level
US = 1_000

tag: contextvars.ContextVar[Any] = contextvars.ContextVar("tag")

SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Boom(Exception):
    pass


def ns(seconds: float) -> int:
    return round(seconds * 1e9)


# ---- programs ----

# many deadlines on the same few ticks, so that ticks hold several callbacks
delays_us = st.one_of(
    st.sampled_from([0, 500, 1000, 2000]),
    st.sampled_from([0, 1, 999, 1000, 1001, 2000, 3000]),
    st.integers(0, 4000),
    st.integers(0, 40_000),
)


@dataclass(frozen=True)
class Spec:
    every: bool
    delay_us: int
    period_us: int  # call_every only
    first_us: int | None  # call_every's delay=, None: the period
    missed: str
    given_context: bool
    raise_run: int | None
    actions: tuple  # ((run, action), ...)


def actions(depth: int) -> st.SearchStrategy:
    refs = st.integers(-1, 40)  # -1: the callback's own handle
    choices = [
        st.tuples(st.just("cancel"), refs),
        st.tuples(st.just("reset"), refs, delays_us),
        st.tuples(st.just("pending")),
    ]
    if depth > 0:
        choices.append(st.tuples(st.just("spawn"), specs(depth - 1)))
    return st.one_of(choices)


@st.composite
def specs(draw: Any, depth: int) -> Spec:
    every = draw(st.integers(0, 2)) == 0
    runs = st.integers(0, 2) if every else st.just(0)
    return Spec(
        every=every,
        delay_us=draw(delays_us),
        period_us=draw(st.integers(1000, 4000)) if every else 0,
        first_us=draw(st.none() | delays_us) if every else None,
        missed=draw(st.sampled_from(["skip", "delay", "burst"])),
        given_context=draw(st.booleans()),
        raise_run=draw(st.none() | runs),
        actions=tuple(draw(st.lists(st.tuples(runs, actions(depth)), max_size=3))),
    )


ops = st.one_of(
    st.tuples(st.just("schedule"), specs(2)),
    st.tuples(st.just("schedule"), specs(2)),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(st.just("reset"), st.integers(0, 40), delays_us),
    st.tuples(st.just("reset"), st.integers(0, 40), delays_us),
    st.tuples(st.just("advance"), st.sampled_from([0, 500, 1000, 2000])),
    st.tuples(st.just("advance"), st.one_of(st.integers(0, 3000), st.integers(0, 30_000))),
    st.tuples(st.just("start")),
    st.tuples(st.just("stop")),
)
programs = st.lists(ops, max_size=30)
#: max_pending_timeouts: none, or a bound that the programs reach
bounds = st.sampled_from([0, 0, 0, 3, 8])


# ---- the model ----

#: The stats() counts the model follows.
COUNTED = ("scheduled", "expired", "cancelled", "task_errors", "taken_back", "rejected")


@dataclass
class Item:
    ident: int
    spec: Spec
    deadline: int  # ns on the clock
    tag: Any
    state: str = "waiting"  # waiting (to be taken in), linked, handed, running, done
    queued: int = 0  # scheduling order, while waiting
    relink: int = 0  # reset order, while waiting after a reset in the wheel
    seq: int = 0  # the order the wheel took it in
    due: int = 0  # clock time of the end of its tick
    runs: int = 0
    cancelled: bool = False
    expired: bool = False
    reset_in_run: bool = False


@dataclass
class Model:
    clock: int = 0
    start: int | None = None
    items: list = field(default_factory=list)
    orders: dict = field(default_factory=lambda: {"queue": 0, "reset": 0, "seq": 0})
    stats: dict = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    trace: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    stopped: bool = False
    bound: int = 0  # max_pending_timeouts

    def stop(self) -> list:
        """stop() between advances: what is not done yet, now cancelled."""
        stopped = [it for it in self.items if it.state != "done"]
        for it in stopped:
            it.cancelled = True
            it.state = "done"
        self.stats["cancelled"] += len(stopped)
        self.stopped = True
        return sorted(it.ident for it in stopped)

    def _next(self, name: str) -> int:
        self.orders[name] += 1
        return self.orders[name]

    def started(self) -> None:
        if self.start is None:
            self.start = self.clock

    def pending(self) -> int:
        # a one-shot handed over counts as expired until its run
        return sum(
            1
            for it in self.items
            if it.state not in ("done", "running-cancelled")
            and not (it.state == "handed" and not it.spec.every)
        )

    def link(self) -> None:
        """A tick, or stats(): relinks the reset ones, then takes in the
        new ones."""
        if self.start is None:
            return
        waiting = [it for it in self.items if it.state == "waiting"]
        waiting.sort(key=lambda it: (0, it.relink) if it.relink else (1, it.queued))
        current = (self.clock - self.start) // TICK  # the tick under way
        for it in waiting:
            rel = it.deadline - self.start
            calc = (rel - 1) // TICK if rel > 0 else 0
            it.due = self.start + (max(calc, current) + 1) * TICK
            it.seq = self._next("seq")
            it.relink = 0
            it.state = "linked"

    def full(self) -> bool:
        if self.bound > 0 and self.pending() >= self.bound:
            self.stats["rejected"] += 1
            return True
        return False

    def schedule(self, spec: Spec, tag_value: Any) -> Any:
        self.started()
        if self.full():
            return "rejected"
        ident = len(self.items)
        if spec.every:
            first = spec.period_us if spec.first_us is None else spec.first_us
            deadline = self.clock + first * US
        else:
            deadline = self.clock + spec.delay_us * US
        value = ("given", ident) if spec.given_context else tag_value
        it = Item(ident, spec, deadline, value, queued=self._next("queue"))
        self.items.append(it)
        self.stats["scheduled"] += 1
        return ident

    def cancel(self, ident: int) -> bool:
        it = self.items[ident]
        if it.state == "done" or it.cancelled:
            return False
        it.cancelled = True
        self.stats["cancelled"] += 1
        if it.state == "handed" and not it.spec.every:
            it.expired = False  # handed over, not run: cancelled instead
            self.stats["expired"] -= 1
            self.stats["taken_back"] += 1
        if it.state != "running":
            it.state = "done"
        else:
            it.state = "running-cancelled"
        return True

    def reset(self, ident: int, delay_us: int) -> bool:
        it = self.items[ident]
        if it.state in ("done", "running-cancelled"):
            return False
        if it.state == "handed" and not it.spec.every and self.full():
            return False  # pending again past the bound: it runs as handed over
        it.deadline = self.clock + delay_us * US
        if it.state == "linked":
            it.state = "waiting"
            it.relink = self._next("reset")
        elif it.state == "handed":
            it.state = "handed-reset"
            if not it.spec.every:
                it.expired = False  # pending again
                self.stats["expired"] -= 1
                self.stats["taken_back"] += 1
        elif it.state == "running":
            it.reset_in_run = True
        return True

    def requeue(self, it: Item) -> None:
        it.state = "waiting"
        it.queued = self._next("queue")
        it.relink = 0

    def run(self, it: Item, api: Any) -> None:
        if it.state == "done":  # cancelled before its run
            return
        if it.state == "handed-reset":
            self.requeue(it)
            return
        k = it.runs
        it.runs += 1
        # a one-shot ends as its run begins: a cancel in it comes too late
        it.state = "running" if it.spec.every else "done"
        self.trace.append(("run", it.ident, k, self.clock, it.tag, True))
        perform_actions(api, it.ident, it.spec, k, it.tag)
        failed = it.spec.raise_run == k
        if failed:
            error = f"boom {it.ident}/{k}"
            self.errors.append(error)
            self.stats["task_errors"] += 1
        if not it.spec.every:
            return
        if it.state == "running-cancelled":
            it.state = "done"
        elif failed:
            it.state = "done"
            it.expired = True
            self.stats["expired"] += 1
        elif it.reset_in_run:
            it.reset_in_run = False
            self.requeue(it)
        else:
            it.deadline += it.spec.period_us * US
            if it.spec.missed == "burst" and it.deadline <= self.clock:
                # a run a whole tick late (its first deadline at or before
                # its schedule, or a reset to one): the next grid point is
                # due already, and a burst runs it at once, back to back
                self.run(it, api)
                return
            # period >= tick: otherwise the next grid point is after this
            # run's tick, and skip and delay wait for it as well
            self.requeue(it)

    def advance(self, seconds_us: int, api: Any) -> int:
        target = self.clock + seconds_us * US
        if target == self.clock:
            return 0
        count = 0
        self.link()
        while True:
            due = [it for it in self.items if it.state == "linked" and it.due <= target]
            if self.start is None or not due:
                self.clock = target
                self.link()
                return count
            end = min(it.due for it in due)
            self.clock = end
            batch = sorted((it for it in due if it.due == end), key=lambda it: it.seq)
            for it in batch:
                count += 1
                it.state = "handed"
                if not it.spec.every:
                    it.expired = True
                    self.stats["expired"] += 1
            for it in batch:
                self.run(it, api)
            if end == target:
                return count  # the last step is skipped: nothing taken in
            self.link()


class ModelApi:
    def __init__(self, model: Model) -> None:
        self.m = model

    def count(self) -> int:
        return len(self.m.items)

    def schedule(self, spec: Spec, tag_value: Any) -> int:
        return self.m.schedule(spec, tag_value)

    def cancel(self, ident: int) -> bool:
        return self.m.cancel(ident)

    def reset(self, ident: int, delay_us: int) -> bool:
        return self.m.reset(ident, delay_us)

    def pending(self) -> int:
        return self.m.pending()

    def trace(self, entry: tuple) -> None:
        self.m.trace.append(entry)


def perform_actions(api: Any, ident: int, spec: Spec, run: int, tag_value: Any) -> None:
    """What a callback does in its run `run`: the same on both sides."""
    for when, action in spec.actions:
        if when != run:
            continue
        kind = action[0]
        if kind in ("cancel", "reset"):
            ref = ident if action[1] == -1 else action[1] % api.count()
            if kind == "cancel":
                api.trace(("cb-cancel", ident, ref, api.cancel(ref)))
            else:
                api.trace(("cb-reset", ident, ref, api.reset(ref, action[2])))
        elif kind == "pending":
            api.trace(("cb-pending", ident, api.pending()))
        else:
            api.trace(("cb-spawn", ident, api.schedule(action[1], tag_value)))


def run_model(program: list, bound: int = 0) -> tuple[list, list]:
    m = Model(bound=bound)
    api = ModelApi(m)
    for op in program + [("advance", 60_000)]:
        kind = op[0]
        if kind in ("schedule", "start") and m.stopped:
            m.trace.append(("refused", kind))
        elif kind == "schedule":
            ident = m.schedule(op[1], ("loop", len(m.items)))
            if ident == "rejected":
                m.trace.append(("rejected",))
            else:
                m.trace.append(("scheduled", ident, m.items[ident].deadline))
        elif kind == "cancel" and m.items:
            ref = op[1] % len(m.items)
            m.trace.append(("cancel", ref, m.cancel(ref)))
        elif kind == "reset" and m.items:
            ref = op[1] % len(m.items)
            m.trace.append(("reset", ref, m.reset(ref, op[2])))
        elif kind == "advance":
            m.trace.append(("advanced", m.advance(op[1], api), m.clock))
            m.link()  # stats() takes in what waits
            m.trace.append(("stats", m.pending(), dict(m.stats)))
        elif kind == "start":
            m.started()
        elif kind == "stop":
            m.trace.append(("stop", m.stop()))
    m.trace.append(("pending", m.pending()))
    m.trace.append(
        (
            "handles",
            [(it.ident, it.cancelled, it.expired and not it.cancelled) for it in m.items],
        )
    )
    stopped = sorted(it.ident for it in m.items if it.state != "done")
    m.trace.append(("stop", stopped))
    return m.trace, m.errors


# ---- the real thing ----


class RealApi:
    def __init__(self, timer: ManualTimer, loop_thread: int) -> None:
        self.timer = timer
        self.handles: list = []
        self.runs: dict = {}
        self.specs: dict = {}
        self.log: list = []
        self.loop_thread = loop_thread

    def count(self) -> int:
        return len(self.handles)

    def callback(self, ident: int, word: str) -> None:
        assert word == "arg"
        spec = self.specs[ident]
        k = self.runs.get(ident, 0)
        self.runs[ident] = k + 1
        now = ns(self.timer.time())
        here = threading.get_ident() == self.loop_thread
        seen = tag.get(None)
        self.log.append(("run", ident, k, now, seen, here))
        perform_actions(self, ident, spec, k, seen)
        if spec.raise_run == k:
            raise Boom(f"boom {ident}/{k}")

    def schedule(self, spec: Spec, tag_value: Any) -> Any:
        ident = len(self.handles)
        self.specs[ident] = spec
        context = None
        if spec.given_context:
            context = contextvars.Context()
            context.run(tag.set, ("given", ident))
        try:
            if spec.every:
                first = None if spec.first_us is None else spec.first_us / 1e6
                handle = self.timer.call_every(
                    spec.period_us / 1e6,
                    self.callback,
                    ident,
                    "arg",
                    context=context,
                    delay=first,
                    missed=spec.missed,
                )
            else:
                handle = self.timer.call_later(
                    spec.delay_us / 1e6, self.callback, ident, "arg", context=context
                )
        except hwtimer.RejectedExecutionError:
            return "rejected"
        self.handles.append(handle)
        return ident

    def cancel(self, ident: int) -> bool:
        return self.handles[ident].cancel()

    def reset(self, ident: int, delay_us: int) -> bool:
        return self.handles[ident].reset(delay_us / 1e6)

    def pending(self) -> int:
        return self.timer.pending_timeouts()

    def trace(self, entry: tuple) -> None:
        self.log.append(entry)


def run_real(program: list, bound: int = 0) -> tuple[list, list, list]:
    timer = ManualTimer(TICK / 1e9, WHEEL, max_pending_timeouts=bound)
    loop = asyncio.new_event_loop()
    errors: list = []
    loop.set_exception_handler(lambda loop, context: errors.append(str(context["exception"])))

    async def main() -> list:
        api = RealApi(timer, threading.get_ident())
        log = api.log
        stopped = False
        for op in program + [("advance", 60_000)]:
            kind = op[0]
            if kind in ("schedule", "start") and stopped:
                try:
                    api.schedule(op[1], None) if kind == "schedule" else timer.start()
                except RuntimeError:
                    log.append(("refused", kind))
            elif kind == "schedule":
                ident = len(api.handles)
                tag.set(("loop", ident))
                if api.schedule(op[1], ("loop", ident)) == "rejected":
                    log.append(("rejected",))
                    continue
                tag.set(("after", ident))  # the copy was taken: this is not seen
                log.append(("scheduled", ident, ns(api.handles[ident].deadline)))
            elif kind == "cancel" and api.handles:
                ref = op[1] % len(api.handles)
                log.append(("cancel", ref, api.cancel(ref)))
            elif kind == "reset" and api.handles:
                ref = op[1] % len(api.handles)
                log.append(("reset", ref, api.reset(ref, op[2])))
            elif kind == "advance":
                n = await timer.advance_async(op[1] / 1e6)
                log.append(("advanced", n, ns(timer.time())))
                stats = timer.stats()
                counts = {k: stats[k] for k in COUNTED}
                log.append(("stats", stats["pending"], counts))
            elif kind == "start":
                timer.start()
            elif kind == "stop":
                ids = {id(h): i for i, h in enumerate(api.handles)}
                log.append(("stop", sorted(ids[id(h)] for h in timer.stop())))
                stopped = True
        log.append(("pending", timer.pending_timeouts()))
        log.append(
            (
                "handles",
                [
                    (i, h.is_cancelled(), h.is_expired() and not h.is_cancelled())
                    for i, h in enumerate(api.handles)
                ],
            )
        )
        stopped = timer.stop()
        ids = {id(h): i for i, h in enumerate(api.handles)}
        log.append(("stop", sorted(ids[id(h)] for h in stopped)))
        return log

    try:
        log = loop.run_until_complete(main())
    finally:
        timer.stop()
        loop.close()
    return log, errors, [str(e) for e in timer.task_errors]


@SETTINGS
@given(programs, bounds)
def test_loop_callbacks_match_the_model(program: list, bound: int) -> None:
    expected, expected_errors = run_model(program, bound)
    log, errors, task_errors = run_real(program, bound)
    assert log == expected
    assert errors == expected_errors
    assert task_errors == expected_errors


# ---- two loops in two threads, one timer, advanced from a third ----

two_loop_ops = st.one_of(
    st.tuples(st.just("schedule"), st.integers(0, 1), delays_us),
    st.tuples(st.just("schedule"), st.integers(0, 1), delays_us),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(
        st.just("advance"), st.one_of(st.sampled_from([0, 1000, 2000]), st.integers(0, 9000))
    ),
    st.tuples(st.just("close")),
)


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ran: list = []
        self.thread = threading.Thread(target=self.loop.run_forever)
        self.thread.start()

    def callback(self, ident: int) -> None:
        self.ran.append((ident, tag.get(None), threading.get_ident() == self.thread.ident))

    def drain(self) -> None:
        """Waits until what the timer handed to this loop has run."""
        done = threading.Event()
        for _ in range(3):  # a wake-up read, then its batch, then this
            done.clear()
            self.loop.call_soon_threadsafe(done.set)
            assert done.wait(10)

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


# a quarter of the profile's count (conftest.py): each program starts two threads
@settings(max_examples=max(40, settings.default.max_examples // 4), deadline=None)
@given(st.lists(two_loop_ops, max_size=20))
def test_two_loops_in_threads_share_a_manual_timer(program: list) -> None:
    # the model: (loop, deadline's tick end, scheduling order) of each
    # callback; all one-shot, none reset, so a tick runs them in
    # scheduling order; advance() counts those handed to either loop
    clock, start, closed = 0, None, False
    items: list = []  # [loop, due, state]
    expected: list = []
    expected_runs: list = [[], []]

    timer = ManualTimer(TICK / 1e9, WHEEL)
    loops = [LoopThread(), LoopThread()]
    handles: list = []
    log: list = []
    try:
        for op in program + [("advance", 50_000)]:
            kind = op[0]
            if kind == "schedule":
                which, delay = op[1], op[2] * US
                if closed and which == 1:
                    try:
                        timer.call_later(delay / 1e9, lambda: None, loop=loops[1].loop)
                    except RuntimeError:
                        log.append("refused")
                    expected.append("refused")
                    continue
                ident = len(items)
                start = clock if start is None else start
                rel = clock + delay - start
                calc = (rel - 1) // TICK if rel > 0 else 0
                due = start + (max(calc, (clock - start) // TICK) + 1) * TICK
                items.append([which, due, "pending"])
                tag.set(("thread", ident))
                handles.append(
                    timer.call_later(
                        delay / 1e9, loops[which].callback, ident, loop=loops[which].loop
                    )
                )
                tag.set(None)
            elif kind == "cancel" and items:
                ref = op[1] % len(items)
                log.append(("cancel", ref, handles[ref].cancel()))
                expected.append(("cancel", ref, items[ref][2] == "pending"))
                if items[ref][2] == "pending":
                    items[ref][2] = "cancelled"
            elif kind == "advance":
                target = clock + op[1] * US  # the clock moves also before the start
                n = timer.advance(op[1] / 1e6)
                for loop in loops:
                    if not loop.loop.is_closed():
                        loop.drain()
                due = sorted(
                    (it[1], i)
                    for i, it in enumerate(items)
                    if it[2] == "pending" and it[1] <= target
                )
                for _, i in due:
                    items[i][2] = "ran"
                    expected_runs[items[i][0]].append((i, ("thread", i), True))
                clock = target
                log.append(("advanced", n, timer.pending_timeouts(), ns(timer.time())))
                pending = sum(1 for it in items if it[2] == "pending")
                expected.append(("advanced", len(due), pending, clock))
                assert loops[0].ran == expected_runs[0]
                assert loops[1].ran == expected_runs[1]
            elif kind == "close" and not closed:
                loops[1].close()
                closed = True
                for it in items:
                    if it[0] == 1 and it[2] == "pending":
                        it[2] = "closed"
                log.append(("closed", timer.pending_timeouts()))
                expected.append(("closed", sum(1 for it in items if it[2] == "pending")))
        log.append(("cancelled", [h.is_cancelled() for h in handles]))
        expected.append(("cancelled", [it[2] in ("cancelled", "closed") for it in items]))
        assert log == expected
        assert timer.stop() == []
    finally:
        timer.stop()
        for loop in loops:
            loop.close()
