"""A line-based TCP service with per-request timeouts and idle detection.

Every deadline of the service lives on one shared HashedWheelTimer:

* each request runs inside ``hwtimer.timeout(REQUEST_TIMEOUT)``: a request
  that takes too long is cancelled and answered ``ERR timeout``, and the
  connection stays usable;
* each connection has an ``IdleWatcher``, the pattern of Netty's
  ``IdleStateHandler`` and of Dubbo's heartbeat: a connection with no
  request and no reply for ``idle_timeout`` seconds is told ``BYE idle``
  and closed.  Clients keep a quiet connection open with ``PING``.

The protocol, one command per line::

    ECHO <text>      -> <text>
    SLEEP <seconds>  -> OK, after that long (a slow backend call)
    PING             -> PONG
    QUIT             -> BYE

Run it::

    python examples/echo_service.py --port 8007
    python examples/echo_service.py --demo   # starts it, talks to it, exits
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
import time
from typing import Any, Callable

import hwtimer


class IdleWatcher:
    """Calls `on_idle` once the connection has seen no activity (``touch()``)
    for `idle_timeout` seconds.

    Activity only stores a timestamp: the timer is not touched for every
    read.  When the timer fires, it looks at the last read and either
    reports the connection idle or sleeps again for the time that is left,
    as Netty's IdleStateHandler does.  One pending timeout per connection,
    whatever the traffic.

    `clock` is where it reads the time: the clock of the timer's deadlines,
    ``time.monotonic`` for a real timer, ``timer.time`` for a
    ``hwtimer.testing.ManualTimer`` in tests.
    """

    def __init__(
        self,
        idle_timeout: float,
        on_idle: Callable[[], Any],
        *,
        timer: hwtimer.HashedWheelTimer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_timeout = idle_timeout
        self._on_idle = on_idle
        self._timer = timer if timer is not None else hwtimer.default_timer()
        self._clock = clock
        self._last_activity = clock()
        self._timeout: hwtimer.Timeout | None = None

    def start(self) -> None:
        """Starts watching; call from the connection's event loop."""
        self._last_activity = self._clock()
        self._schedule(self.idle_timeout)

    def touch(self) -> None:
        """Records activity on the connection (a read, a reply sent)."""
        self._last_activity = self._clock()

    def stop(self) -> None:
        """Stops watching (the connection is closing)."""
        if self._timeout is not None:
            self._timeout.cancel()
            self._timeout = None

    def _schedule(self, delay: float) -> None:
        self._timeout = self._timer.call_later(delay, self._check)

    def _check(self) -> None:
        if self._timeout is None:
            return  # stopped while this call was on its way
        remaining = self._last_activity + self.idle_timeout - self._clock()
        if remaining > 0:
            self._schedule(remaining)  # read meanwhile: sleep for the rest
        else:
            self._timeout = None
            self._on_idle()


class EchoService:
    """The service: ``await start()``, then ``address``; ``await close()``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        request_timeout: float = 1.0,
        idle_timeout: float = 30.0,
        timer: hwtimer.HashedWheelTimer | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.timer = timer if timer is not None else hwtimer.default_timer()
        self.stats = {"connections": 0, "requests": 0, "timeouts": 0, "idle_closed": 0}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "not started"
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._connections):
            writer.close()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None or not self._server.is_serving():
            # accepted as close() began, which did not know of it yet
            writer.close()
            return
        self.stats["connections"] += 1
        self._connections.add(writer)

        def on_idle() -> None:
            self.stats["idle_closed"] += 1
            writer.write(b"BYE idle\n")
            writer.close()  # the pending readline() then sees end of file

        watcher = IdleWatcher(self.idle_timeout, on_idle, timer=self.timer)
        watcher.start()
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # longer than the stream's limit (64 KiB)
                    writer.write(b"ERR line too long\n")
                    break
                if not line:
                    break
                watcher.touch()
                reply = await self._request(line.decode(errors="replace").strip())
                if writer.is_closing():
                    break
                writer.write(reply.encode() + b"\n")
                await writer.drain()
                watcher.touch()  # a reply is activity too ("all idle")
                if reply == "BYE":
                    break
        except ConnectionError:
            pass
        finally:
            watcher.stop()
            self._connections.discard(writer)
            writer.close()

    async def _request(self, line: str) -> str:
        self.stats["requests"] += 1
        try:
            async with hwtimer.timeout(self.request_timeout, timer=self.timer):
                return await self.handle(line)
        except TimeoutError:
            self.stats["timeouts"] += 1
            return "ERR timeout"

    async def handle(self, line: str) -> str:
        """Answers one request; the backend a real service would call."""
        command, _, argument = line.partition(" ")
        command = command.upper()
        if command == "ECHO":
            return argument
        if command == "PING":
            return "PONG"
        if command == "QUIT":
            return "BYE"
        if command == "SLEEP":
            try:
                seconds = float(argument)
            except ValueError:
                return "ERR bad number"
            if math.isnan(seconds):  # float() takes "nan", which no sleep does
                return "ERR bad number"
            await hwtimer.sleep(seconds, timer=self.timer)
            return "OK"
        return f"ERR unknown command {command!r}"


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: str) -> str:
    writer.write(line.encode() + b"\n")
    return (await reader.readline()).decode().strip()


async def demo() -> None:
    """Starts a service, shows the three behaviours, stops it."""
    service = EchoService(request_timeout=0.2, idle_timeout=1.0)
    await service.start()
    try:
        host, port = service.address
        print(f"serving on {host}:{port}")
        reader, writer = await asyncio.open_connection(host, port)
        try:
            print("ECHO hello ->", await _ask(reader, writer, "ECHO hello"))
            print("SLEEP 0.05 ->", await _ask(reader, writer, "SLEEP 0.05"))
            print("SLEEP 5    ->", await _ask(reader, writer, "SLEEP 5"), "(request timeout 0.2 s)")
            for _ in range(3):
                await asyncio.sleep(0.25)
                pong = await _ask(reader, writer, "PING")
                print("PING       ->", pong, "(keeps the connection alive)")
            started = time.monotonic()
            line = (await reader.readline()).decode().strip()
            print(f"silent for {time.monotonic() - started:.2f} s ->", line)
            print("then end of file:", await reader.read() == b"")
        finally:  # Ctrl-C cancels the demo: it closes what it opened all the same
            writer.close()
    finally:
        await service.close()
    print("stats:", service.stats)


async def serve(args: argparse.Namespace) -> int:
    service = EchoService(
        args.host,
        args.port,
        request_timeout=args.request_timeout,
        idle_timeout=args.idle_timeout,
    )
    try:
        await service.start()
    except OSError as e:  # the address is taken, or names no host here
        print(f"cannot serve on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    host, port = service.address
    print(f"serving on {host}:{port} (Ctrl-C stops)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await service.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    # no description under python -OO, which strips the docstring
    description = __doc__.split("\n\n")[0] if __doc__ else None
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8007)
    parser.add_argument("--request-timeout", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--idle-timeout", type=float, default=30.0, metavar="SECONDS")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    parser.add_argument("--demo", action="store_true", help="talk to a fresh service and exit")
    args = parser.parse_args(argv)
    for name in ("request_timeout", "idle_timeout"):
        if not getattr(args, name) > 0:  # NaN included: no deadline could hold it
            parser.error(f"--{name.replace('_', '-')} must be a number of seconds > 0")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be a TCP port, 0 to 65535")
    loop: asyncio.AbstractEventLoop
    if args.uvloop:
        try:
            import uvloop
        except ImportError as e:
            parser.error(f"--uvloop needs uvloop (pip install uvloop): {e}")
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    main_task = loop.create_task(demo() if args.demo else serve(args))
    # Ctrl-C cancels that task, so that serve() closes the service while the
    # loop runs, rather than raising KeyboardInterrupt in whatever code ran
    loop.add_signal_handler(signal.SIGINT, main_task.cancel)
    rc = 0
    try:
        rc = loop.run_until_complete(main_task) or 0
    except asyncio.CancelledError:
        pass
    finally:
        # the connections' tasks: close() closed their connections, so each
        # ends at its next read (or once its request has timed out)
        rest = asyncio.all_tasks(loop)
        if rest:
            loop.run_until_complete(asyncio.wait(rest))
        loop.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
