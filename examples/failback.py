"""A failback retry queue: Dubbo's FailbackClusterInvoker on the wheel.

A call that fails is not reported to the caller as a failure: it is
recorded and retried in the background with exponential backoff
(``base_delay * 2**attempt``, capped at ``max_delay``), each retry a
timeout on a HashedWheelTimer.  The queue is bounded with the timer's
``max_pending_timeouts``: when that many retries wait, a new failure is
dropped (counted in ``stats["dropped"]``) rather than queued, so a dead
backend cannot make the queue grow without end.  That bound is why the
queue has a timer of its own.

The backend here is a line-based TCP service (``SEND <id>`` ->
``OK <id>`` or ``ERR <id>``); ``FlakyBackend`` fails each id a chosen
number of times first.

Run it::

    python examples/failback.py --demo
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable
from typing import Any, Callable

import hwtimer


class FailbackQueue:
    """Runs ``await send(request)``; a failed one is retried later.

    ``invoke(request)`` returns True if the first attempt succeeded, False if
    it failed and was queued for retry or dropped.  ``stats`` counts
    ``ok`` (first attempts), ``retried_ok``, ``retries``, ``dropped`` (queue
    full), ``gave_up`` (after `max_retries`).  ``close()`` stops the timer
    and returns the requests whose retries were still waiting, and those
    whose retry it cancelled before the backend answered (at least once:
    such a request may have reached the backend).
    """

    def __init__(
        self,
        send: Callable[[Any], Awaitable[object]],
        *,
        max_pending: int = 1000,
        base_delay: float = 0.1,
        max_delay: float = 10.0,
        max_retries: int = 10,
        tick_duration: float = 0.01,
    ) -> None:
        self._send = send
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_retries = max_retries
        self.timer = hwtimer.HashedWheelTimer(
            tick_duration, max_pending_timeouts=max_pending, thread_name="failback"
        )
        self.stats = {"ok": 0, "retried_ok": 0, "retries": 0, "dropped": 0, "gave_up": 0}
        self._tasks: set[asyncio.Task[None]] = set()
        # each waiting retry: its key -> (its timeout, the request)
        self._waiting: dict[object, tuple[hwtimer.Timeout, Any]] = {}
        # each retry whose attempt has begun and not ended: key -> request
        self._in_flight: dict[object, Any] = {}
        self._closed = False

    @property
    def pending(self) -> int:
        """Retries waiting on the wheel."""
        return self.timer.pending_timeouts()

    def delay(self, attempt: int) -> float:
        """The backoff before retry number `attempt` (0 for the first)."""
        return min(self.base_delay * 2**attempt, self.max_delay)

    async def invoke(self, request: Any) -> bool:
        try:
            await self._send(request)
        except (OSError, RuntimeError):
            self._queue(request, 0)
            return False
        self.stats["ok"] += 1
        return True

    def _queue(self, request: Any, attempt: int) -> None:
        if attempt >= self.max_retries:
            self.stats["gave_up"] += 1
            return
        key = object()
        try:
            timeout = self.timer.call_later(self.delay(attempt), self._retry, key, attempt)
        except hwtimer.RejectedExecutionError:
            self.stats["dropped"] += 1  # full: max_pending retries wait already
            return
        self._waiting[key] = (timeout, request)

    def _retry(self, key: object, attempt: int) -> None:
        if key not in self._waiting:
            return  # closed after this retry fell due: close() returned it
        task = asyncio.ensure_future(self._attempt(key, attempt))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attempt(self, key: object, attempt: int) -> None:
        # The retry waits until its attempt begins here: closed before
        # that (the task made, not yet started), close() returned it.
        entry = self._waiting.pop(key, None)
        if entry is None:
            return
        _, request = entry
        self.stats["retries"] += 1
        # Kept until the attempt ends: one that close() cancels (or that
        # fails once the timer is stopped) is returned by close().
        self._in_flight[key] = request
        try:
            await self._send(request)
        except (OSError, RuntimeError):
            if self._closed:
                return
            del self._in_flight[key]
            self._queue(request, attempt + 1)
        else:
            del self._in_flight[key]
            self.stats["retried_ok"] += 1

    async def close(self) -> list[Any]:
        """Stops retrying; returns the requests whose retry was waiting or
        was cancelled in flight."""
        self._closed = True
        self.timer.stop()
        # Every retry not begun: those stop() returned, those that fell due
        # but whose call the loop has yet to run, and those whose attempt's
        # task has yet to start (both then do nothing).
        waiting = [request for _, request in self._waiting.values()]
        self._waiting.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # then those whose attempt it cancelled before the backend answered
        waiting += self._in_flight.values()
        self._in_flight.clear()
        return waiting


class FlakyBackend:
    """A TCP service that answers ``SEND <id>`` with ``ERR <id>`` the first
    `failures` times it sees an id, then ``OK <id>``; `failures` < 0: always
    ``ERR``."""

    def __init__(self, failures: int = 2) -> None:
        self.failures = failures
        self.seen: dict[str, int] = {}
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[:2]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                words = line.decode(errors="replace").split()
                if len(words) != 2 or words[0] != "SEND":
                    writer.write(b"ERR bad request\n")
                    await writer.drain()
                    continue
                ident = words[1]
                n = self.seen[ident] = self.seen.get(ident, 0) + 1
                ok = self.failures >= 0 and n > self.failures
                writer.write(f"{'OK' if ok else 'ERR'} {ident}\n".encode())
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


class BackendClient:
    """One connection to the backend; ``send(id)`` raises RuntimeError on ERR,
    ConnectionError once the connection is closed, or out of step after a
    send was cancelled while it waited for its reply."""

    def __init__(self) -> None:
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def connect(self, address: tuple[str, int]) -> None:
        self._reader, self._writer = await asyncio.open_connection(*address)

    async def send(self, ident: str) -> None:
        assert self._reader is not None and self._writer is not None
        async with self._lock:  # one request on the wire at a time
            if self._writer.is_closing():
                raise ConnectionError("the connection to the backend is closed")
            self._writer.write(f"SEND {ident}\n".encode())
            try:
                reply = (await self._reader.readline()).decode(errors="replace").split()
            except BaseException:
                # Cancelled (a timeout around the call, close()) or failed
                # with the request sent: its reply, if it comes, would be
                # read as the next request's.  The connection is out of
                # step; later sends fail (and are retried) rather than lie.
                self._writer.close()
                raise
        if reply != ["OK", ident]:
            raise RuntimeError(f"backend refused {ident}")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except ConnectionError:
                pass


async def demo() -> dict[str, Any]:
    backend = FlakyBackend(failures=2)
    await backend.start()
    client = BackendClient()
    queue = FailbackQueue(client.send, max_pending=100, base_delay=0.02)
    try:
        await client.connect(backend.address)
        for i in range(10):
            await queue.invoke(f"r{i}")
        while queue.stats["retried_ok"] < 10:
            await asyncio.sleep(0.02)
    finally:  # Ctrl-C cancels the demo: it closes what it opened all the same
        await queue.close()
        await client.close()
        await backend.close()
    return queue.stats


def main(argv: list[str] | None = None) -> int:
    # no description under python -OO, which strips the docstring
    description = __doc__.splitlines()[0] if __doc__ else None
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--demo", action="store_true", help="run the demo and exit")
    args = parser.parse_args(argv)
    if not args.demo:
        parser.print_help()
        return 2
    try:
        print(asyncio.run(demo()))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
