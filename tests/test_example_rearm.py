"""examples/heartbeat.py and examples/failback.py over real loopback
sockets, on asyncio and uvloop."""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    EXAMPLES,
    INTERRUPTIBLE,
    close_with_a_late_connection,
    interrupt,
    interruptible_example,
    load_example,
    run_python,
)

import hwtimer

heartbeat = load_example("heartbeat")
failback = load_example("failback")

PERIOD = 0.05


async def _until(condition: Any, timeout: float = 20.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


# ---- heartbeat ----


def test_heartbeat_keeps_a_healthy_connection_open(run) -> None:
    async def main() -> None:
        server = heartbeat.HeartbeatServer(timeout=10 * PERIOD)
        await server.start()
        client = heartbeat.HeartbeatClient(PERIOD)
        await client.connect(server.address)
        await _until(lambda: client.pongs >= 30)  # 30 periods, 3 timeouts long
        assert client.closed_by_server is None
        assert server.stats["closed_dead"] == 0
        assert server.stats["heartbeats"] >= 30
        await client.close()
        await server.close()

    run(main)


def test_heartbeat_server_closes_a_connection_whose_heartbeat_stops(run) -> None:
    async def main() -> None:
        timer = hwtimer.HashedWheelTimer(0.01)
        try:
            server = heartbeat.HeartbeatServer(timeout=4 * PERIOD, timer=timer)
            await server.start()
            healthy = heartbeat.HeartbeatClient(PERIOD, timer=timer)
            hung = heartbeat.HeartbeatClient(PERIOD, timer=timer)
            await healthy.connect(server.address)
            await hung.connect(server.address)
            await _until(lambda: hung.pongs >= 3)
            hung.stop_heartbeat()
            stopped = asyncio.get_running_loop().time()
            await asyncio.wait_for(hung.wait_closed(), 20)
            # never before the timeout after its last heartbeat
            assert asyncio.get_running_loop().time() - stopped >= 4 * PERIOD - 2 * PERIOD
            assert hung.closed_by_server == "BYE heartbeat"
            assert server.stats["closed_dead"] == 1
            n = healthy.pongs
            await _until(lambda: healthy.pongs >= n + 5)
            assert healthy.closed_by_server is None
            await healthy.close()
            await hung.close()
            await server.close()
            await _until(lambda: timer.pending_timeouts() == 0)
        finally:
            timer.stop()

    run(main)


def test_heartbeat_server_closes_a_connection_that_sends_a_line_over_the_limit(run) -> None:
    # the stream refuses a line over 64 KiB with a ValueError: the server
    # hangs up without a traceback and serves the others
    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        server = heartbeat.HeartbeatServer(timeout=100 * PERIOD)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            writer.write(b"x" * 70_000 + b"\n")
            assert await asyncio.wait_for(reader.read(), 20) == b""
            writer.close()
            client = heartbeat.HeartbeatClient(PERIOD)
            await client.connect(server.address)
            await _until(lambda: client.pongs >= 1)
            await client.close()
        finally:
            await server.close()
        assert not errors, errors

    run(main)


def test_heartbeat_server_close_also_closes_a_connection_whose_handler_starts_after_it(
    run,
) -> None:
    # A connection accepted as close() begins, its handler started only
    # once close() has closed those it knew of: closed all the same.
    run(lambda: close_with_a_late_connection(heartbeat.HeartbeatServer, timeout=60.0))


def test_heartbeat_client_sends_on_a_fixed_grid(run) -> None:
    async def main() -> None:
        server = heartbeat.HeartbeatServer(timeout=1.0)
        await server.start()
        client = heartbeat.HeartbeatClient(PERIOD)
        await client.connect(server.address)
        ping = client._heartbeat
        first = ping.deadline
        await _until(lambda: client.pongs >= 5)
        # the periodic timeout's next deadline is a point of its grid
        k = (ping.deadline - first) / PERIOD
        assert k == pytest.approx(round(k), abs=1e-6) and k >= 4
        await client.close()
        assert ping.is_cancelled()
        await server.close()

    run(main)


def test_heartbeat_client_stops_beating_when_the_server_resets_the_connection(run) -> None:
    # A reset ends the client's read with ConnectionResetError, not at end of
    # file: the heartbeat stops all the same (no periodic timeout left on
    # the timer), and wait_closed() and close() return.
    async def main() -> None:
        timer = hwtimer.HashedWheelTimer(0.01)

        async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readline()  # the first PING
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

        server = await asyncio.start_server(reset, "127.0.0.1", 0)
        try:
            client = heartbeat.HeartbeatClient(PERIOD, timer=timer)
            await client.connect(server.sockets[0].getsockname()[:2])
            await asyncio.wait_for(client.wait_closed(), 20)
            await _until(lambda: timer.pending_timeouts() == 0)
            await client.close()
        finally:
            server.close()
            await server.wait_closed()
            timer.stop()

    run(main)


# ---- failback ----


async def _backend(failures: int) -> tuple[Any, Any]:
    backend = failback.FlakyBackend(failures=failures)
    await backend.start()
    client = failback.BackendClient()
    await client.connect(backend.address)
    return backend, client


def test_failback_retries_with_exponential_backoff_until_ok(run) -> None:
    async def main() -> None:
        backend, client = await _backend(failures=3)
        queue = failback.FailbackQueue(client.send, base_delay=0.02, max_delay=1.0)
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await queue.invoke("a") is False  # failed, queued
        await _until(lambda: queue.stats["retried_ok"] == 1)
        # three failures: retries after 0.02, 0.04, then 0.08 s: 0.14 s at least
        assert loop.time() - began >= 0.14 - 0.01
        assert backend.seen["a"] == 4
        assert queue.stats["retries"] == 3
        assert await queue.invoke("a") is True  # the backend takes it now
        assert queue.pending == 0
        assert await queue.close() == []
        await client.close()
        await backend.close()

    run(main)


def test_failback_client_never_takes_a_cancelled_request_s_reply_for_the_next(run) -> None:
    # A send cancelled (by a timeout around invoke(), or by close()) after
    # its request went out leaves the backend's reply on the wire.  The
    # next send must not read it as its own: a request the backend refused
    # would count as delivered and never be retried.
    async def main() -> None:
        backend, client = await _backend(failures=1)  # each id: ERR, then OK
        try:
            with pytest.raises(RuntimeError):
                await client.send("a")  # ERR a
            cancelled = asyncio.ensure_future(client.send("a"))  # OK a, never read
            await asyncio.sleep(0)  # it has written its request and awaits the reply
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            await _until(lambda: backend.seen.get("a") == 2)
            with pytest.raises((OSError, RuntimeError)):
                await client.send("b")  # the backend refuses b (its first time)
            queue = failback.FailbackQueue(client.send, base_delay=30)
            assert await queue.invoke("c") is False  # refused or unsent: queued
            assert await queue.close() == ["c"]
        finally:
            await client.close()
            await backend.close()

    run(main)


def test_failback_backend_refuses_a_malformed_request_and_goes_on(run) -> None:
    # a line that is not "SEND <id>" (no id, bytes that are not UTF-8) is
    # answered ERR, not ended with a traceback and a hang-up
    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        backend = failback.FlakyBackend(failures=0)
        await backend.start()
        try:
            reader, writer = await asyncio.open_connection(*backend.address)
            for bad in (b"SEND\n", b"\xff\xfe\n", b"\n", b"HELLO r1\n"):
                writer.write(bad)
                assert await asyncio.wait_for(reader.readline(), 20) == b"ERR bad request\n"
            writer.write(b"SEND r1\n")
            assert await asyncio.wait_for(reader.readline(), 20) == b"OK r1\n"
            writer.close()
            await writer.wait_closed()
        finally:
            await backend.close()
        assert not errors, errors

    run(main)


def test_failback_delays_double_and_are_capped() -> None:
    queue = failback.FailbackQueue(lambda r: None, base_delay=0.1, max_delay=0.5)
    try:
        assert [queue.delay(i) for i in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    finally:
        queue.timer.stop()


def test_failback_queue_is_bounded_by_max_pending_timeouts(run) -> None:
    async def main() -> None:
        backend, client = await _backend(failures=-1)  # always fails
        queue = failback.FailbackQueue(client.send, max_pending=3, base_delay=30)
        assert queue.timer.max_pending_timeouts == 3
        for i in range(5):
            assert await queue.invoke(f"r{i}") is False
        assert queue.pending == 3
        assert queue.stats["dropped"] == 2
        assert sorted(await queue.close()) == ["r0", "r1", "r2"]
        await client.close()
        await backend.close()

    run(main)


def test_failback_close_returns_a_retry_that_fell_due_but_had_not_run(run) -> None:
    # The retry falls due while the loop is busy: the timer has handed its
    # call to the loop, and stop() no longer lists it.  close() still
    # returns it, and the call, run later, neither retries nor fails.
    async def main() -> None:
        backend, client = await _backend(failures=-1)
        queue = failback.FailbackQueue(client.send, base_delay=0.01)
        errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        try:
            assert await queue.invoke("late") is False
            time.sleep(0.5)  # the loop is blocked: the retry is due, its call waits
            assert queue.pending == 0
            assert await queue.close() == ["late"]
            await asyncio.sleep(0.2)  # the loop runs what was handed to it
            assert errors == []
            assert queue.stats["retries"] == 0 and backend.seen["late"] == 1
        finally:
            await client.close()
            await backend.close()

    run(main)


def test_failback_close_returns_a_retry_whose_attempt_had_not_begun(run) -> None:
    # The retry's call has run and made the task of its attempt, but the
    # loop has not started that task when close() comes: the attempt never
    # begins, so close() returns the request rather than losing it.
    async def main() -> None:
        backend, client = await _backend(failures=-1)
        queue = failback.FailbackQueue(client.send, base_delay=0.01)
        try:
            assert await queue.invoke("late") is False
            time.sleep(0.5)  # the loop is blocked: the retry is due, its call waits
            for _ in range(5):
                await asyncio.sleep(0)
                if queue._tasks:  # the call has run: its attempt is made
                    break
            else:
                pytest.skip("the loop ran the attempt's task before this one")
            assert await queue.close() == ["late"]
            assert queue.stats["retries"] == 0 and backend.seen["late"] == 1
        finally:
            await client.close()
            await backend.close()

    run(main)


def test_failback_close_returns_a_retry_whose_attempt_was_in_flight(run) -> None:
    # close() cancels an attempt that waits for the backend's answer: not
    # known to be delivered, its request comes back with the waiting ones
    # rather than being lost.
    async def main() -> None:
        sent: list[str] = []
        never = asyncio.Event()

        async def send(request: str) -> None:
            sent.append(request)
            if len(sent) == 1:
                raise OSError("backend down")
            await never.wait()  # the retry: sent, no answer yet

        queue = failback.FailbackQueue(send, base_delay=0.01)
        assert await queue.invoke("r") is False
        await _until(lambda: len(sent) == 2)
        assert await queue.close() == ["r"]
        assert queue.stats["retries"] == 1 and queue.stats["retried_ok"] == 0

    run(main)


def test_failback_gives_up_after_max_retries(run) -> None:
    async def main() -> None:
        backend, client = await _backend(failures=-1)
        queue = failback.FailbackQueue(client.send, base_delay=0.01, max_retries=3)
        await queue.invoke("x")
        await _until(lambda: queue.stats["gave_up"] == 1)
        assert queue.stats["retries"] == 3 and backend.seen["x"] == 4
        assert queue.pending == 0
        await queue.close()
        await client.close()
        await backend.close()

    run(main)


@pytest.mark.parametrize("name", ["heartbeat", "failback"])
def test_demo_runs(name: str) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--demo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "{" in out.stdout


def test_heartbeat_server_stops_on_ctrl_c_closing_the_server() -> None:
    with interruptible_example(EXAMPLES / "heartbeat.py", ["--port", "0"]) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("heartbeat server on "), first
        out, err = interrupt(proc)
    assert (proc.returncode, err) == (0, "")


def _demo_interrupted(name: str, patch: str) -> None:
    """Runs example `name`'s --demo in a child where `patch` (code that
    sees the example's module as `example`, and os) sends the Ctrl-C; the
    demo must exit 0 having printed nothing and left nothing open."""
    code = INTERRUPTIBLE + (
        "import os, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from conftest import load_example\n"
        f"example = load_example({name!r})\n"
        f"{patch}"
        "sys.exit(example.main(['--demo']))\n"
    )
    done = run_python(
        code, args=("-W", "always::ResourceWarning"), argv=(str(Path(__file__).parent),)
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_heartbeat_demo_stops_on_ctrl_c_closing_what_it_opened() -> None:
    # Ctrl-C once both clients are connected and beating
    _demo_interrupted(
        "heartbeat",
        "connect = example.HeartbeatClient.connect\n"
        "connected = []\n"
        "async def connect_then_interrupt(self, address):\n"
        "    await connect(self, address)\n"
        "    connected.append(self)\n"
        "    if len(connected) == 2:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "example.HeartbeatClient.connect = connect_then_interrupt\n",
    )


def test_failback_demo_stops_on_ctrl_c_closing_what_it_opened() -> None:
    # Ctrl-C once the first request has failed and waits for its retry
    _demo_interrupted(
        "failback",
        "invoke = example.FailbackQueue.invoke\n"
        "async def invoke_then_interrupt(self, request):\n"
        "    ok = await invoke(self, request)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return ok\n"
        "example.FailbackQueue.invoke = invoke_then_interrupt\n",
    )
