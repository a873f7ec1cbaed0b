"""examples/echo_service.py over real loopback sockets, on asyncio and uvloop."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import close_with_a_late_connection, interrupt, interruptible_example, load_example

import hwtimer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "echo_service.py"
SOON = 10.0


echo_service = load_example("echo_service")


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, service: Any) -> Client:
        return cls(*await asyncio.open_connection(*service.address))

    async def ask(self, line: str) -> str:
        self.writer.write(line.encode() + b"\n")
        return await self.read_line()

    async def read_line(self) -> str:
        line = await asyncio.wait_for(self.reader.readline(), SOON)
        return line.decode().strip()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


async def _started(**kwargs: Any) -> Any:
    service = echo_service.EchoService(**kwargs)
    await service.start()
    host, port = service.address
    assert host == "127.0.0.1" and port > 0
    return service


def test_requests_answered(run: Any) -> None:
    async def main() -> None:
        service = await _started(request_timeout=SOON, idle_timeout=SOON)
        try:
            client = await Client.connect(service)
            assert await client.ask("ECHO hello world") == "hello world"
            assert await client.ask("PING") == "PONG"
            assert await client.ask("SLEEP 0.01") == "OK"
            assert await client.ask("NOPE") == "ERR unknown command 'NOPE'"
            assert await client.ask("QUIT") == "BYE"
            assert await asyncio.wait_for(client.reader.read(), SOON) == b""
            await client.close()
            assert service.stats["requests"] == 5
            assert service.stats["timeouts"] == 0
        finally:
            await service.close()

    run(main)


def test_a_bad_number_is_answered_and_the_connection_stays(run: Any) -> None:
    # "nan" is a float to float(), not a delay to sleep(): it is refused
    # like "abc", rather than end the connection with a ValueError
    async def main() -> None:
        service = await _started(request_timeout=SOON, idle_timeout=SOON)
        try:
            client = await Client.connect(service)
            for bad in ("abc", "nan", "NaN", "-nan"):
                assert await client.ask(f"SLEEP {bad}") == "ERR bad number"
            assert await client.ask("PING") == "PONG"
            await client.close()
        finally:
            await service.close()

    run(main)


def test_a_line_over_the_limit_is_answered_and_the_service_goes_on(run: Any) -> None:
    # the stream refuses a line over 64 KiB with a ValueError: the client is
    # told, rather than the service logging a traceback and hanging up
    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        service = await _started(request_timeout=SOON, idle_timeout=SOON)
        try:
            client = await Client.connect(service)
            assert await client.ask("ECHO " + "x" * 70_000) == "ERR line too long"
            assert await asyncio.wait_for(client.reader.read(), SOON) == b""
            await client.close()
            other = await Client.connect(service)
            assert await other.ask("PING") == "PONG"
            await other.close()
        finally:
            await service.close()
        assert not errors, errors

    run(main)


def test_many_clients(run: Any) -> None:
    async def main() -> None:
        service = await _started(request_timeout=SOON, idle_timeout=SOON)
        try:

            async def one(i: int) -> None:
                client = await Client.connect(service)
                for j in range(5):
                    assert await client.ask(f"ECHO {i}-{j}") == f"{i}-{j}"
                await client.close()

            await asyncio.gather(*(one(i) for i in range(50)))
            assert service.stats["connections"] == 50
        finally:
            await service.close()

    run(main)


def test_slow_request_times_out(run: Any) -> None:
    async def main() -> None:
        service = await _started(request_timeout=0.1, idle_timeout=SOON)
        try:
            client = await Client.connect(service)
            started = time.monotonic()
            assert await client.ask("SLEEP 30") == "ERR timeout"
            assert time.monotonic() - started >= 0.1
            # The connection is still good, and fast requests still pass.
            assert await client.ask("ECHO after") == "after"
            assert await client.ask("SLEEP 0.01") == "OK"
            assert service.stats["timeouts"] == 1
            await client.close()
        finally:
            await service.close()

    run(main)


def test_idle_connection_closed(run: Any) -> None:
    async def main() -> None:
        service = await _started(request_timeout=SOON, idle_timeout=0.2)
        try:
            client = await Client.connect(service)
            quiet_since = time.monotonic()  # the server's last activity is later
            assert await client.ask("PING") == "PONG"
            assert await client.read_line() == "BYE idle"
            assert time.monotonic() - quiet_since >= 0.2
            assert await asyncio.wait_for(client.reader.read(), SOON) == b""
            assert service.stats["idle_closed"] == 1
            await client.close()
        finally:
            await service.close()

    run(main)


def test_activity_keeps_connection_open(run: Any) -> None:
    async def main() -> None:
        service = await _started(request_timeout=SOON, idle_timeout=0.3)
        try:
            client = await Client.connect(service)
            started = time.monotonic()
            while time.monotonic() - started < 1.0:  # well past idle_timeout
                assert await client.ask("PING") == "PONG"
                await asyncio.sleep(0.05)
            assert service.stats["idle_closed"] == 0
            assert await client.read_line() == "BYE idle"
            await client.close()
        finally:
            await service.close()

    run(main)


def test_idle_watcher_reschedules_instead_of_rearming(run: Any) -> None:
    # Reads only store a timestamp: however much traffic, the watcher has
    # one timeout pending.
    async def main() -> None:
        with hwtimer.HashedWheelTimer(0.005, 64) as timer:
            fired: list[float] = []
            watcher = echo_service.IdleWatcher(
                0.1, lambda: fired.append(time.monotonic()), timer=timer
            )
            started = time.monotonic()
            watcher.start()
            touches: list[float] = []
            for _ in range(20):
                touches.append(time.monotonic())
                watcher.touch()
                assert timer.pending_timeouts() <= 1
                await asyncio.sleep(0.01)
            while not fired:
                assert time.monotonic() - started < SOON
                await asyncio.sleep(0.01)
            # after the last touch before it: a busy machine may hold the
            # loop past the idle time between two touches
            assert fired[0] - max(t for t in touches if t <= fired[0]) >= 0.1
            watcher.stop()

    run(main)


def test_close_also_closes_a_connection_whose_handler_starts_after_it(run: Any) -> None:
    # A connection accepted as close() begins, its handler started only
    # once close() has closed the connections it knew of: closed all the same.
    run(
        lambda: close_with_a_late_connection(
            echo_service.EchoService, request_timeout=SOON, idle_timeout=60.0
        )
    )


def test_script_demo() -> None:
    # The script runs on its own, with the hwtimer under test importable.
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(hwtimer.__file__)))
    env["PYTHONPATH"] = package_root + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--demo"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "ECHO hello -> hello" in result.stdout
    assert "ERR timeout" in result.stdout
    assert "BYE idle" in result.stdout


@pytest.mark.parametrize(
    ("args", "wait_for"),
    [
        pytest.param(["--port", "0"], "serving on ", id="serve"),
        pytest.param(["--demo"], "ECHO hello -> ", id="demo"),
    ],
)
def test_script_stops_on_ctrl_c_closing_the_service(args: list[str], wait_for: str) -> None:
    # Ctrl-C ends the script as it says it does: the service (and the
    # demo's own connection) close on the open loop, and nothing is left
    # open or pending to complain at exit, ResourceWarnings shown.
    with interruptible_example(EXAMPLE, args) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("serving on "), first
        host, port = first.split()[2].rsplit(":", 1)
        if wait_for == first[: len(wait_for)]:
            with socket.create_connection((host, int(port)), timeout=SOON) as sock:
                sock.sendall(b"PING\n")
                assert sock.makefile("rb").readline() == b"PONG\n"
                out, err = interrupt(proc)
        else:  # the demo's own client is connected and waiting
            line = proc.stdout.readline()
            assert line.startswith(wait_for), line
            out, err = interrupt(proc)
    assert proc.returncode == 0, err
    assert err == ""
