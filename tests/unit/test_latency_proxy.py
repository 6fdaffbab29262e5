"""The latency proxy (gnomon.infra.latency) on real loopback sockets: bytes arrive intact and
in order, no earlier than the delay, half-closes pass through, memory stays bounded."""

from __future__ import annotations

import asyncio
import logging
import random
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from gnomon.infra.latency import LatencyProxy, Route, main

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def run(coro: Awaitable[None], timeout_s: float = 4.0) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro, timeout_s)

    asyncio.run(bounded())


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo until EOF, then close."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


@asynccontextmanager
async def server(handler: Handler, host: str = "127.0.0.1") -> AsyncIterator[int]:
    srv = await asyncio.start_server(handler, host, 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()


@asynccontextmanager
async def proxied(
    target_port: int, delay_ms: float, buffer_max_bytes: int = 4 * 1024 * 1024
) -> AsyncIterator[tuple[LatencyProxy, int]]:
    proxy = LatencyProxy(
        [Route("127.0.0.1", 0, "127.0.0.1", target_port)], delay_ms, buffer_max_bytes=buffer_max_bytes
    )
    await proxy.start()
    try:
        yield proxy, proxy.listen_addresses[0][1]
    finally:
        await proxy.stop()


async def round_trip(port: int, payload: bytes) -> bytes:
    """Send payload, half-close, read until EOF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        return await reader.read()
    finally:
        writer.close()


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """The other end closed (EOF, or a reset) within 2 s, sending nothing more."""
    try:
        return await asyncio.wait_for(reader.read(), 2.0) == b""
    except ConnectionResetError:
        return True


def free_port() -> int:
    """A port nobody listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- bytes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("delay_ms", [0, 5])
def test_a_megabyte_comes_back_exactly(delay_ms: float) -> None:
    payload = random.Random(7).randbytes(1024 * 1024)

    async def go() -> None:
        async with server(echo) as port, proxied(port, delay_ms) as (proxy, pport):
            assert await round_trip(pport, payload) == payload
            assert proxy.connections_total == 1
            assert proxy.bytes_forwarded == 2 * len(payload)

    run(go())


def test_a_small_buffer_still_delivers_everything() -> None:
    payload = random.Random(8).randbytes(1024 * 1024)

    async def go() -> None:
        async with server(echo) as port, proxied(port, 2, buffer_max_bytes=4096) as (proxy, pport):
            assert await round_trip(pport, payload) == payload
            assert proxy.bytes_queued == 0

    run(go())


def test_many_small_writes_arrive_in_order() -> None:
    lines = [f"{i:05d}\n".encode() for i in range(2000)]

    async def go() -> None:
        async with server(echo) as port, proxied(port, 3) as (_, pport):
            reader, writer = await asyncio.open_connection("127.0.0.1", pport)
            for i, line in enumerate(lines):
                writer.write(line)
                if i % 50 == 0:
                    await writer.drain()
                    await asyncio.sleep(0)
            writer.write_eof()
            assert await reader.read() == b"".join(lines)
            writer.close()

    run(go())


# ---- time ----------------------------------------------------------------------------------


def test_a_round_trip_takes_at_least_twice_the_delay() -> None:
    async def go() -> None:
        async with server(echo) as port, proxied(port, 50) as (_, pport):
            reader, writer = await asyncio.open_connection("127.0.0.1", pport)
            for _ in range(2):  # the second on an open connection: no setup cost hides in it
                t0 = time.monotonic()
                writer.write(b"ping")
                assert await reader.readexactly(4) == b"ping"
                assert time.monotonic() - t0 >= 0.095
            writer.close()

    run(go())


def test_no_delay_forwards_at_once() -> None:
    async def go() -> None:
        async with server(echo) as port, proxied(port, 0) as (_, pport):
            reader, writer = await asyncio.open_connection("127.0.0.1", pport)
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), 1.0) == b"ping"
            writer.close()

    run(go())


def test_connections_are_independent() -> None:
    async def one(pport: int, i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", pport)
        got = b""
        for k in range(20):
            msg = f"conn {i} msg {k};".encode()
            writer.write(msg)
            got += await reader.readexactly(len(msg))
        assert got == b"".join(f"conn {i} msg {k};".encode() for k in range(20))
        writer.close()

    async def go() -> None:
        async with server(echo) as port, proxied(port, 2) as (proxy, pport):
            await asyncio.gather(*(one(pport, i) for i in range(10)))
            assert proxy.connections_total == 10

    run(go())


# ---- the ends of a connection ----------------------------------------------------------------


def test_a_half_close_reaches_the_server_and_its_reply_comes_back() -> None:
    async def count_then_reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until the client's EOF
        writer.write(f"got {len(data)} bytes".encode())
        await writer.drain()
        writer.close()

    async def go() -> None:
        async with server(count_then_reply) as port, proxied(port, 20) as (_, pport):
            assert await round_trip(pport, b"x" * 1000) == b"got 1000 bytes"

    run(go())


def test_a_refused_target_closes_the_client(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        async with proxied(free_port(), 10) as (proxy, pport):
            reader, writer = await asyncio.open_connection("127.0.0.1", pport)
            writer.write(b"hello")
            assert await closed_by_peer(reader)
            writer.close()
            assert proxy.connections_total == 1

    with caplog.at_level(logging.WARNING, logger="gnomon.infra.latency"):
        run(go())
    warnings = [r for r in caplog.records if r.name == "gnomon.infra.latency"]
    assert len(warnings) == 1 and "cannot connect to the target" in warnings[0].getMessage()
    assert warnings[0].exc_info is None  # one line, no traceback


def test_stop_closes_the_listeners_and_open_connections() -> None:
    async def go() -> None:
        async with server(echo) as port:
            proxy = LatencyProxy([Route("127.0.0.1", 0, "127.0.0.1", port)], 5)
            await proxy.start()
            pport = proxy.listen_addresses[0][1]
            reader, writer = await asyncio.open_connection("127.0.0.1", pport)
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            await proxy.stop()
            assert await closed_by_peer(reader)
            writer.close()
            assert proxy.listen_addresses == []
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", pport)

    run(go())


def test_serve_forever_serves_until_stopped() -> None:
    async def go() -> None:
        async with server(echo) as port:
            proxy = LatencyProxy([Route("127.0.0.1", 0, "127.0.0.1", port)], 1)
            serving = asyncio.create_task(proxy.serve_forever())
            while not proxy.listen_addresses:
                await asyncio.sleep(0.01)
            assert await round_trip(proxy.listen_addresses[0][1], b"abc") == b"abc"
            await proxy.stop()
            await serving

    run(go())


def test_a_reader_that_stops_reading_bounds_the_queue() -> None:
    """The target never reads: the proxy stops reading the client once a buffer is queued,
    so the client's writes stall instead of the proxy's memory growing."""
    limit = 256 * 1024
    release = asyncio.Event()

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.close()

    async def go() -> None:
        async with server(stall) as port, proxied(port, 0, buffer_max_bytes=limit) as (proxy, pport):
            _, writer = await asyncio.open_connection("127.0.0.1", pport)
            chunk = b"z" * 65536
            sent = 0
            try:
                while sent < 200 * 1024 * 1024:
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), 0.3)
                    sent += len(chunk)
            except TimeoutError:
                pass
            assert sent < 200 * 1024 * 1024  # the client was held back
            assert 0 < proxy.bytes_queued <= limit + 65536
            release.set()
            writer.transport.abort()

    run(go(), timeout_s=4.5)


def test_bind_source_sets_the_address_the_target_sees() -> None:
    peers: list[str] = []

    async def who(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[0])
        await echo(reader, writer)

    async def go() -> None:
        async with server(who, "127.0.0.2") as port:
            proxy = LatencyProxy([Route("127.0.0.1", 0, "127.0.0.2", port)], 0, bind_source="127.0.0.3")
            await proxy.start()
            try:
                assert await round_trip(proxy.listen_addresses[0][1], b"hi") == b"hi"
            finally:
                await proxy.stop()
        assert peers == ["127.0.0.3"]

    run(go())


def test_start_names_the_address_it_cannot_bind() -> None:
    async def go() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            proxy = LatencyProxy(
                [Route("127.0.0.1", 0, "127.0.0.1", 9), Route("127.0.0.1", port, "127.0.0.1", 9)], 10
            )
            with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
                await proxy.start()
            assert proxy.listen_addresses == []  # the first listener was closed again

    run(go())


# ---- Route.parse ---------------------------------------------------------------------------


def test_route_parse() -> None:
    assert Route.parse("127.0.0.1:19094=127.0.0.2:9094") == Route("127.0.0.1", 19094, "127.0.0.2", 9094)
    assert Route.parse(" [::1]:0=localhost:9094 ") == Route("::1", 0, "localhost", 9094)
    assert str(Route.parse("[::1]:1=b:2")) == "[::1]:1=b:2"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "127.0.0.1:19094",
        "127.0.0.1:19094=",
        "=127.0.0.2:9094",
        "127.0.0.1=127.0.0.2:9094",
        "127.0.0.1:x=127.0.0.2:9094",
        "127.0.0.1:1=127.0.0.2:70000",
        "127.0.0.1:1=127.0.0.2:0",
        "127.0.0.1:-1=127.0.0.2:9",
        ":1=127.0.0.2:9094",
        "[]:1=127.0.0.2:9094",
        "::1:1=127.0.0.2:9094",
        "a:1=b:2=c:3",
    ],
)
def test_route_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="bad route"):
        Route.parse(text)


# ---- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--delay-ms", "30", "--route", "nope"],
        ["--delay-ms", "30"],
        ["--delay-ms", "-1", "--route", "127.0.0.1:1=127.0.0.1:2"],
        ["--delay-ms", "soon", "--route", "127.0.0.1:1=127.0.0.1:2"],
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert len(out.err.strip().splitlines()) == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_prints_ready_and_stops_cleanly_on_a_signal(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gnomon.infra.latency", "--delay-ms", "30",
         "--route", "127.0.0.1:0=127.0.0.1:9", "--route", "127.0.0.1:0=127.0.0.1:9"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 4.0)
        assert ready, "no ready line"
        assert proc.stdout.readline() == "latency proxy ready: 2 routes, 30 ms each way\n"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=4.0)
        assert proc.returncode == 0, err
        assert out == "" and err == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
