"""Heartbeats over TCP: Dubbo's pattern, on one HashedWheelTimer.

* The client sends ``PING`` every ``period`` seconds with
  ``timer.call_every()``: one periodic timeout per connection, on a fixed
  grid, however long the loop takes to write.
* The server gives each connection a deadline of ``timeout`` seconds
  (three periods by default, as Dubbo's heartbeat timeout) and moves it
  with ``Timeout.reset()`` on every line it reads: no new timeout per
  heartbeat, and a reset that loses the race with the deadline returns
  False, so a connection is never closed after its heartbeat came in.
  A connection whose heartbeat stops is told ``BYE heartbeat`` and closed.

Run it::

    python examples/heartbeat.py --demo   # a server, a healthy and a dead client
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import hwtimer


class HeartbeatServer:
    """Closes connections whose heartbeat stops.  ``await start()``, then
    ``address``; ``await close()``.  Replies ``PONG`` to ``PING``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        timeout: float = 3.0,
        timer: hwtimer.HashedWheelTimer | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.timer = timer if timer is not None else hwtimer.default_timer()
        self.stats = {"connections": 0, "heartbeats": 0, "closed_dead": 0}
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "not started"
        return self._server.sockets[0].getsockname()[:2]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
            # each connection's task ends at its next read, now at end of file
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None or not self._server.is_serving():
            # accepted as close() began, which did not know of it yet
            writer.close()
            return
        self.stats["connections"] += 1
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        dead = False

        def on_dead() -> None:
            nonlocal dead
            dead = True
            task.cancel()  # stops the read below

        deadline = self.timer.call_later(self.timeout, on_dead)
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # longer than the stream's limit: no heartbeat
                    break
                if not line:
                    break
                # False: the deadline passed first (on_dead is on its way)
                if not deadline.reset(self.timeout):
                    dead = True
                    break
                if line.strip() == b"PING":
                    self.stats["heartbeats"] += 1
                    writer.write(b"PONG\n")
                    await writer.drain()
        except asyncio.CancelledError:
            if not dead:
                raise
        except ConnectionError:
            pass
        finally:
            deadline.cancel()
            self._writers.discard(writer)
            self._tasks.discard(task)
            if dead:
                self.stats["closed_dead"] += 1
                try:
                    writer.write(b"BYE heartbeat\n")
                except ConnectionError:
                    pass
            writer.close()


class HeartbeatClient:
    """Sends ``PING`` every `period` seconds until ``stop_heartbeat()`` or
    ``close()``; counts the ``PONG`` replies and sees the server's ``BYE``."""

    def __init__(
        self,
        period: float = 1.0,
        *,
        timer: hwtimer.HashedWheelTimer | None = None,
    ) -> None:
        self.period = period
        self.timer = timer if timer is not None else hwtimer.default_timer()
        self.pongs = 0
        self.closed_by_server: str | None = None
        self._heartbeat: hwtimer.Timeout | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None

    async def connect(self, address: tuple[str, int]) -> None:
        reader, self._writer = await asyncio.open_connection(*address)
        self._reading = asyncio.ensure_future(self._read(reader))
        self._heartbeat = self.timer.call_every(self.period, self._ping, delay=0)

    def _ping(self) -> None:
        assert self._writer is not None
        if not self._writer.is_closing():
            self._writer.write(b"PING\n")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                text = line.decode(errors="replace").strip()
                if text == "PONG":
                    self.pongs += 1
                elif text.startswith("BYE"):
                    self.closed_by_server = text
        except ConnectionError:
            pass  # reset by the server: closed all the same
        finally:
            # however the read ends, nothing reads the PONGs any more: a
            # heartbeat left running would beat on the timer for ever
            self.stop_heartbeat()

    def stop_heartbeat(self) -> None:
        """The heartbeat stops (a hung client): the server should close us."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    async def wait_closed(self) -> None:
        """Waits until the server has closed the connection."""
        assert self._reading is not None
        await self._reading

    async def close(self) -> None:
        self.stop_heartbeat()
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except ConnectionError:
                pass
        if self._reading is not None:
            await self._reading


async def demo(period: float = 0.1) -> dict[str, Any]:
    """A server, one healthy client and one whose heartbeat stops."""
    server = HeartbeatServer(timeout=3 * period)
    await server.start()
    healthy, hung = HeartbeatClient(period), HeartbeatClient(period)
    try:
        await healthy.connect(server.address)
        await hung.connect(server.address)
        await asyncio.sleep(5 * period)
        hung.stop_heartbeat()
        await asyncio.wait_for(hung.wait_closed(), 30 * period)
        await asyncio.sleep(2 * period)
        result = {
            "healthy_pongs": healthy.pongs,
            "healthy_closed": healthy.closed_by_server,
            "hung_closed": hung.closed_by_server,
            **server.stats,
        }
    finally:  # Ctrl-C cancels the demo: it closes what it opened all the same
        await healthy.close()
        await hung.close()
        await server.close()
    return result


def main(argv: list[str] | None = None) -> int:
    # no description under python -OO, which strips the docstring
    description = __doc__.splitlines()[0] if __doc__ else None
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--demo", action="store_true", help="run the demo and exit")
    parser.add_argument("--port", type=int, default=8008)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    if not args.timeout > 0:  # NaN included: no deadline could hold it
        parser.error("--timeout must be a number of seconds > 0")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be a TCP port, 0 to 65535")

    async def serve() -> int:
        server = HeartbeatServer(port=args.port, timeout=args.timeout)
        try:
            await server.start()
        except OSError as e:  # the address is taken
            print(f"cannot serve on {server.host}:{args.port}: {e}", file=sys.stderr)
            return 1
        try:
            print(f"heartbeat server on {server.address}, timeout {args.timeout} s", flush=True)
            await asyncio.Event().wait()
        finally:
            await server.close()
        return 0

    # Ctrl-C cancels the main task; its finally closes the server (and the
    # demo's clients) while the loop still runs
    try:
        if args.demo:
            print(asyncio.run(demo()))
        else:
            return asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
