"""ManualTimer against a reference model, by hypothesis's stateful testing.

Random programs of new_timeout(), new_periodic(), cancel(), reset(),
start(), stop(), advance() and advance_to_next(), on wheels from one
bucket to 64 (so that far deadlines go through every level of the
hierarchy), run on the real timer and on a few lines of Python that say
what API.md promises: a timeout due at d runs at the end of the first tick
that ends at or after d (and after the time it was scheduled; ticks count
from the first schedule or start()), tasks of one tick run in the order
they were scheduled, a periodic timeout follows its grid by its `missed`
policy, and what a task schedules, cancels or re-arms is processed in the
same advance when it falls due before the new time.  Tasks themselves
schedule (near or far, one-shot or periodic), cancel, re-arm and raise.
Every time is a whole number of microseconds, so the model's nanoseconds
are exact.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import hwtimer
from hwtimer import Timeout
from hwtimer.testing import ManualTimer

US = 1_000
MISSED = ("skip", "delay", "burst")


def ns(seconds: float) -> int | None:
    """A deadline or a clock reading in ns; None for a never-due one."""
    return None if math.isinf(seconds) else round(seconds * 1e9)


def seconds(us: int | None) -> float:
    return math.inf if us is None else us / 1e6


# What a task does when it runs, after recording its run:
#   ("none",), ("raise",), ("schedule", delay_us),
#   ("periodic", period_us, delay_us or None, missed), ("cancel", target),
#   ("reset", target, delay_us), ("advance",) (refused inside a task).
# A target is an index into the timeouts made so far, taken modulo their
# number when the task runs, or "self".
Action = tuple


@dataclass(eq=False)
class Entry:
    """The model's view of one timeout."""

    ident: int
    action: Action
    periodic: bool = False
    period: int = 0  # ns
    missed: str = "skip"
    deadline: int | None = None  # ns: the deadline, or the next run's grid point
    due: int | None = None  # ns: the end of the tick it runs at
    seq: int = 0  # the order of scheduling (and re-arming) within a tick
    state: str = "pending"  # "pending", "expired" or "cancelled"
    reset: bool = False  # re-armed by reset(): its place in its tick is not kept
    reset_in_run: bool = False


@dataclass
class Run:
    """What the real timer did: one task's run, recorded by the task."""

    ident: int
    time: int
    deadline: int | None
    pending: int  # pending_timeouts() as it began
    result: Any = None
    target: int = -1  # a cancel's or reset's timeout, as it ran


@dataclass
class Counts:
    scheduled: int = 0
    expired: int = 0
    cancelled: int = 0
    rejected: int = 0
    task_errors: int = 0
    logged: list = field(default_factory=list)


class TaskError(Exception):
    pass


class ManualTimerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.timer: ManualTimer | None = None

    @initialize(
        tick_us=st.sampled_from([1000, 2500, 4000]),
        wheel=st.sampled_from([1, 4, 8, 64]),
        max_pending=st.sampled_from([0, 0, 0, 6, 20]),
    )
    def make(self, tick_us: int, wheel: int, max_pending: int) -> None:
        self.tick = tick_us * US
        self.timer = ManualTimer(tick_us / 1e6, wheel, max_pending_timeouts=max_pending)
        self.max_pending = max_pending
        self.now = 0
        self.origin: int | None = None  # the clock when the timer started
        self.stopped = False
        self.seq = 0
        self.entries: list[Entry] = []
        self.handles: list[Timeout] = []
        self.runs: list[Run] = []
        self.counts = Counts()
        self.handler = _Collect(self.counts.logged)
        logger = logging.getLogger("hwtimer")
        logger.addHandler(self.handler)
        self.propagate = logger.propagate
        logger.propagate = False

    def teardown(self) -> None:
        if self.timer is None:
            return
        logger = logging.getLogger("hwtimer")
        logger.removeHandler(self.handler)
        logger.propagate = self.propagate
        if self.stopped:
            assert self.timer.stop() == []
        else:
            self.stop()

    # ---- the model's rules --------------------------------------------

    def due_for(self, deadline: int | None, now: int | None) -> int | None:
        """The end of the tick a timeout scheduled at `now` runs at: ticks
        end at whole ticks from the timer's start.  A periodic timeout's
        next run (`now` None) may fall in the tick that is running."""
        if deadline is None:
            return None
        assert self.origin is not None
        ticks = -(-(deadline - self.origin) // self.tick)
        if now is not None:
            ticks = max(ticks, (now - self.origin) // self.tick + 1)
        return self.origin + ticks * self.tick

    def after(self, now: int, delay_us: int | None) -> int | None:
        """The deadline of a delay from `now`: one <= 0 is now."""
        return None if delay_us is None else now + max(delay_us, 0) * US

    def pending(self) -> list[Entry]:
        return [e for e in self.entries if e.state == "pending"]

    def arm(self, entry: Entry, deadline: int | None, now: int | None, reset: bool) -> None:
        entry.deadline = deadline
        entry.due = self.due_for(deadline, now)
        entry.reset = reset
        self.seq += 1
        entry.seq = self.seq

    def next_run(self, entry: Entry, end: int) -> int:
        """A periodic timeout's next grid point after a run at `end`."""
        g, p = entry.deadline, entry.period
        assert g is not None
        if entry.missed == "burst":
            return g + p
        if entry.missed == "delay":
            return end + p if end - g >= p else g + p
        return g + p * ((end - g) // p + 1) if g + p <= end else g + p

    # ---- the real side: tasks ------------------------------------------

    def make_task(self, ident: int, action: Action) -> Any:
        def task(timeout: Timeout) -> None:
            assert self.timer is not None
            timer = self.timer
            run = Run(ident, ns(timer.time()), ns(timeout.deadline), timer.pending_timeouts())
            self.runs.append(run)
            kind = action[0]
            if kind == "raise":
                raise TaskError(ident)
            if kind == "schedule":
                run.result = self.schedule_real(("none",), action[1])
            elif kind == "periodic":
                period = action[1] * US
                run.result = self.schedule_real(
                    ("none",), action[2], period=period, missed=action[3]
                )
            elif kind in ("cancel", "reset"):
                run.target = self.target_of(ident, action[1])
                target = self.handles[run.target]
                run.result = (
                    target.cancel() if kind == "cancel" else target.reset(seconds(action[2]))
                )
            elif kind in ("advance", "stop"):
                try:
                    timer.advance(0) if kind == "advance" else timer.stop()
                except RuntimeError:
                    run.result = "refused"

        return task

    def target_of(self, ident: int, target: Any) -> int:
        return ident if target == "self" else target % len(self.handles)

    def schedule_real(self, action: Action, delay_us: int | None, **periodic: Any) -> Any:
        """Schedules on the real timer; the new ident, or "rejected"."""
        assert self.timer is not None
        if self.origin is None:
            self.origin = self.now  # new_timeout() and new_periodic() start it
        ident = len(self.handles)
        task = self.make_task(ident, action)
        try:
            if periodic:
                handle = self.timer.new_periodic(
                    task,
                    periodic["period"] / 1e9,
                    delay=None if delay_us is None else delay_us / 1e6,
                    missed=periodic["missed"],
                )
            else:
                handle = self.timer.new_timeout(task, seconds(delay_us))
        except hwtimer.RejectedExecutionError:
            return "rejected"
        except RuntimeError:
            return "stopped"
        self.handles.append(handle)
        return ident

    def schedule_model(
        self, result: Any, action: Action, delay_us: int | None, now: int, **periodic: Any
    ) -> None:
        if self.stopped:
            assert result == "stopped"
            return
        full = self.max_pending > 0 and len(self.pending()) >= self.max_pending
        if full:
            assert result == "rejected"
            self.counts.rejected += 1
            return
        assert result == len(self.entries)
        entry = Entry(result, action)
        if periodic:
            entry.periodic = True
            entry.period = periodic["period"]
            entry.missed = periodic["missed"]
            first = now + periodic["period"] if delay_us is None else self.after(now, delay_us)
            self.arm(entry, first, now, reset=False)
        else:
            self.arm(entry, self.after(now, delay_us), now, reset=False)
        self.entries.append(entry)
        self.counts.scheduled += 1

    # ---- the model's advance -------------------------------------------

    def run_model(self, until: int, first_only: bool = False) -> int:
        """Processes the model's ticks up to `until`, checking the real runs
        recorded meanwhile; returns how many tasks ran."""
        ran = 0
        runs = iter(self.runs)
        self.runs = []
        while True:
            dues = [e.due for e in self.pending() if e.due is not None]
            if not dues or min(dues) > until:
                break
            end = min(dues)
            self.now = end
            batch = sorted((e for e in self.pending() if e.due == end), key=lambda e: e.seq)
            for e in batch:
                if not e.periodic:
                    e.state = "expired"
                    self.counts.expired += 1
            while True:
                # cancelled or re-armed by a task of this tick: not run here
                batch = [
                    e for e in batch if not e.periodic or (e.state == "pending" and e.due == end)
                ]
                if not batch:
                    break
                run = next(runs, None)
                assert run is not None, f"{batch[0]} did not run at {end}"
                entry = self.entries[run.ident]
                assert entry in batch, (run, batch)
                # in the order of scheduling, except a reset one's
                if not entry.reset and entry is not batch[0]:
                    assert entry is [e for e in batch if not e.reset][0], (run, batch)
                batch.remove(entry)
                assert (run.time, run.deadline) == (end, entry.deadline), (run, entry)
                assert run.pending == len(self.pending()), (run, entry)
                ran += 1
                entry.reset_in_run = False
                self.model_action(entry, run, end)
                if entry.periodic and entry.state == "pending" and not entry.reset_in_run:
                    self.arm(entry, self.next_run(entry, end), None, reset=False)
                    if entry.due == end:
                        batch.insert(0, entry)  # a burst's catch-up: back to back
            if first_only:
                break
        assert next(runs, None) is None, "a task ran that the model did not expect"
        return ran

    def model_action(self, entry: Entry, run: Run, end: int) -> None:
        kind = entry.action[0]
        if kind == "raise":
            self.counts.task_errors += 1
            if entry.periodic:
                entry.state = "expired"  # an exception ends it, counted as expired
                self.counts.expired += 1
        elif kind == "schedule":
            self.schedule_model(run.result, ("none",), entry.action[1], end)
        elif kind == "periodic":
            _, period_us, delay_us, missed = entry.action
            periodic = {"period": period_us * US, "missed": missed}
            self.schedule_model(run.result, ("none",), delay_us, end, **periodic)
        elif kind in ("cancel", "reset"):
            target = self.entries[run.target]
            expect = target.state == "pending"
            assert run.result is expect, (kind, target, run)
            if expect and kind == "cancel":
                target.state = "cancelled"
                self.counts.cancelled += 1
            elif expect:
                self.arm(target, self.after(end, entry.action[2]), end, reset=True)
                target.reset_in_run = target is entry
        elif kind in ("advance", "stop"):
            assert run.result == "refused"

    # ---- rules -----------------------------------------------------------

    delays = st.one_of(
        st.integers(-2_000, 12_000),  # within a few ticks
        st.integers(0, 400_000),  # within a turn or two of a small wheel
        st.integers(0, 40_000_000),  # far: upper levels
        st.none(),  # never due
    )
    # a task's: mostly near, so that they fall due in the same advance
    task_delays = st.integers(-1_000, 20_000) | st.integers(0, 40_000_000) | st.none()
    # a periodic timeout's task does not make periodic ones: they would
    # multiply with every run
    periodic_actions = st.one_of(
        st.just(("none",)),
        st.just(("raise",)),
        st.just(("advance",)),
        st.just(("stop",)),
        st.tuples(st.just("schedule"), task_delays),
        st.tuples(st.just("cancel"), st.integers(0, 50) | st.just("self")),
        st.tuples(
            st.just("reset"),
            st.integers(0, 50) | st.just("self"),
            task_delays,
        ),
    )
    actions = periodic_actions | st.tuples(
        st.just("periodic"),
        st.integers(300, 30_000),
        st.none() | st.integers(-1_000, 30_000),
        st.sampled_from(MISSED),
    )

    @rule(action=actions, delay_us=delays)
    def new_timeout(self, action: Action, delay_us: int | None) -> None:
        result = self.schedule_real(action, delay_us)
        self.schedule_model(result, action, delay_us, self.now)

    @rule(
        action=periodic_actions,
        period_us=st.integers(300, 30_000),
        delay_us=st.none() | st.integers(-1_000, 30_000),
        missed=st.sampled_from(MISSED),
    )
    def new_periodic(
        self, action: Action, period_us: int, delay_us: int | None, missed: str
    ) -> None:
        period = period_us * US
        result = self.schedule_real(action, delay_us, period=period, missed=missed)
        self.schedule_model(result, action, delay_us, self.now, period=period, missed=missed)

    @precondition(lambda self: self.entries)
    @rule(pick=st.integers(0, 1_000))
    def cancel(self, pick: int) -> None:
        entry = self.entries[pick % len(self.entries)]
        expect = entry.state == "pending"
        assert self.handles[entry.ident].cancel() is expect
        if expect:
            entry.state = "cancelled"
            self.counts.cancelled += 1

    @precondition(lambda self: self.entries)
    @rule(pick=st.integers(0, 1_000), delay_us=delays)
    def reset(self, pick: int, delay_us: int | None) -> None:
        entry = self.entries[pick % len(self.entries)]
        expect = entry.state == "pending"
        assert self.handles[entry.ident].reset(seconds(delay_us)) is expect
        if expect:
            self.arm(entry, self.after(self.now, delay_us), self.now, reset=True)

    @rule()
    def start(self) -> None:
        """start(): the ticks count from here if nothing started it yet."""
        assert self.timer is not None
        try:
            self.timer.start()
        except RuntimeError:
            assert self.stopped
            return
        assert not self.stopped
        if self.origin is None:
            self.origin = self.now

    @precondition(lambda self: not self.stopped)
    @rule()
    def stop(self) -> None:
        """stop(): the pending ones, now cancelled; nothing runs after it,
        and what comes after it is refused or does nothing."""
        assert self.timer is not None
        returned = self.timer.stop()
        pending = self.pending()
        assert sorted(map(id, returned)) == sorted(id(self.handles[e.ident]) for e in pending)
        assert all(t.is_cancelled() for t in returned)
        for entry in pending:
            entry.state = "cancelled"
        self.counts.cancelled += len(pending)
        self.stopped = True
        self.check_counts()

    @rule(step_us=st.integers(0, 25_000) | st.integers(0, 2_000_000))
    def advance(self, step_us: int) -> None:
        assert self.timer is not None
        ran = self.timer.advance(step_us / 1e6)
        until = self.now + step_us * US
        assert ran == self.run_model(until)
        self.now = until
        assert ns(self.timer.time()) == until
        self.check_counts()

    @rule()
    def advance_to_next(self) -> None:
        assert self.timer is not None
        dues = [e.due for e in self.pending() if e.due is not None]
        got = self.timer.advance_to_next()
        if not dues:
            assert got is None
            return
        assert got is not None and ns(got) == min(dues)
        self.run_model(min(dues), first_only=True)
        self.check_counts()

    # ---- invariants --------------------------------------------------

    def check_counts(self) -> None:
        assert self.timer is not None
        stats = self.timer.stats()
        c = self.counts
        counted = ("scheduled", "expired", "cancelled", "rejected", "task_errors")
        assert {k: stats[k] for k in counted} == {k: getattr(c, k) for k in counted}
        assert stats["pending"] == len(self.pending())
        assert stats["never_due"] == sum(e.due is None for e in self.pending())
        levels = stats["levels"]
        assert sum(level["timeouts"] for level in levels) + stats["never_due"] == stats["pending"]
        assert stats["fullest_bucket"] == levels[0]["fullest"]
        for level in levels:
            assert level["occupied"] <= min(level["buckets"], level["timeouts"])
            assert level["fullest"] <= level["timeouts"]
            assert (level["fullest"] > 0) == (level["occupied"] > 0)
        assert len(c.logged) == c.task_errors

    @invariant()
    def timeouts_agree(self) -> None:
        if self.timer is None:
            return
        assert self.timer.pending_timeouts() == len(self.pending())
        for entry in self.entries:
            handle = self.handles[entry.ident]
            state = (handle.is_expired(), handle.is_cancelled())
            assert state == (entry.state == "expired", entry.state == "cancelled"), entry
            if entry.state == "pending":
                assert ns(handle.deadline) == entry.deadline, entry

    @invariant()
    def snapshot_agrees(self) -> None:
        """pending_snapshot(): the pending ones in deadline order (ties in
        scheduling order), never-due ones last; a limit takes the first."""
        if self.timer is None:
            return
        pending = self.pending()
        snapshot = self.timer.pending_snapshot(len(pending) + 1)
        got = [self.entries[self.handles.index(t)] for t in snapshot]
        assert sorted(map(id, got)) == sorted(map(id, pending))

        def key(e: Entry) -> tuple:
            return (e.deadline is None, e.deadline or 0)

        assert [key(e) for e in got] == sorted(map(key, pending))
        for a, b in zip(got, got[1:]):
            if key(a) == key(b) and not a.reset and not b.reset:
                assert a.seq < b.seq, (a, b)
        half = len(pending) // 2
        assert self.timer.pending_snapshot(half) == snapshot[:half]


class _Collect(logging.Handler):
    def __init__(self, records: list) -> None:
        super().__init__(logging.WARNING)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


ManualTimerModel.TestCase.settings = settings(stateful_step_count=40, deadline=None)
TestManualTimerModel = ManualTimerModel.TestCase
