"""A TCP proxy that adds a fixed one-way delay: simulated distance between regions.

The kernel here has no netem, so ``tc`` cannot slow down loopback traffic. Instead each
"remote" listener (say a broker on 127.0.0.2:9094) gets a proxy in front of it
(127.0.0.1:19094), and the clients of the other "region" connect to the proxy. Every
chunk of bytes, and the end of the stream, reaches the other side no earlier than
``delay_ms`` after the proxy read it, in order, in both directions: a round trip costs
at least twice the delay.

    python -m gnomon.infra.latency --delay-ms 30 --route 127.0.0.1:19094=127.0.0.2:9094

Limits: the delay is fixed (no jitter, no loss). Setting up a connection is not delayed,
only what flows over it. One connection moves at most about ``buffer_max_bytes`` per
delay each way. The target sees the proxy's address, not the client's. A reset is not
passed on as a reset: the other side is just closed at once, and what was queued is
dropped. The delay is a minimum; a busy machine adds its own on top.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import math
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024  # bytes asked of a socket per read
_CONNECT_TIMEOUT_S = 10.0  # a target that does not answer at all
_CLOSE_TIMEOUT_S = 2.0  # for a closing connection to flush what it still buffers


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_address(text: str, what: str, route: str, min_port: int) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text:
        raise ValueError(f"bad route {route!r}: {what} {text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host:
            raise ValueError(f"bad route {route!r}: {what} {text!r} has an empty host")
    elif ":" in host:
        raise ValueError(f"bad route {route!r}: {what} {text!r}: write an IPv6 host in brackets, [::1]:PORT")
    if not port_text.isdigit() or not min_port <= int(port_text) <= 65535:
        raise ValueError(
            f"bad route {route!r}: {what} port {port_text!r} is not a number from {min_port} to 65535"
        )
    return host, int(port_text)


@dataclass(frozen=True)
class Route:
    """Connections accepted on ``listen_host:listen_port`` go to ``target_host:target_port``."""

    listen_host: str
    listen_port: int
    target_host: str
    target_port: int

    @classmethod
    def parse(cls, text: str) -> Route:
        """``LISTEN_HOST:PORT=TARGET_HOST:PORT``, e.g. ``127.0.0.1:19094=127.0.0.2:9094``.

        IPv6 hosts go in brackets (``[::1]:19094``). A listen port of 0 takes any free port
        (:attr:`LatencyProxy.listen_addresses` tells which). Raises ValueError saying what
        is wrong.
        """
        listen, sep, target = text.strip().partition("=")
        if not sep or "=" in target:
            raise ValueError(f"bad route {text!r}: expected LISTEN_HOST:PORT=TARGET_HOST:PORT")
        listen_host, listen_port = _parse_address(listen.strip(), "listen address", text, 0)
        target_host, target_port = _parse_address(target.strip(), "target address", text, 1)
        return cls(listen_host, listen_port, target_host, target_port)

    def __str__(self) -> str:
        return (
            f"{_format_address(self.listen_host, self.listen_port)}"
            f"={_format_address(self.target_host, self.target_port)}"
        )


class _Direction:
    """One direction of one connection: ``pump`` reads ``src`` into a queue of
    (due time, bytes), ``deliver`` writes each chunk to ``dst`` once it is due. ``b""``
    in the queue is the end of the stream (forwarded as a half-close)."""

    def __init__(
        self, proxy: LatencyProxy, src: asyncio.StreamReader, dst: asyncio.StreamWriter
    ) -> None:
        self._proxy = proxy
        self._src = src
        self._dst = dst
        self._items: collections.deque[tuple[float, bytes]] = collections.deque()
        self._ready = asyncio.Event()  # something was queued
        self._room = asyncio.Event()  # at most buffer_max_bytes queued
        self._room.set()
        self.queued = 0  # bytes read and not yet delivered (counted until drained)

    def _add(self, n: int) -> None:
        self.queued += n
        self._proxy.bytes_queued += n

    async def pump(self) -> None:
        loop = asyncio.get_running_loop()
        limit = self._proxy.buffer_max_bytes
        while True:
            data = await self._src.read(_CHUNK)
            # (read each time: a change of delay_ms applies to open connections too)
            self._items.append((loop.time() + self._proxy.delay_ms / 1000.0, data))
            self._ready.set()
            if not data:
                return
            self._add(len(data))
            if self.queued > limit:  # stop reading (the socket buffers fill, TCP pushes back)
                self._room.clear()
                await self._room.wait()

    async def deliver(self) -> None:
        loop = asyncio.get_running_loop()
        items = self._items
        while True:
            while not items:
                self._ready.clear()
                await self._ready.wait()
            due = items[0][0]
            while (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not items[0][1]:  # the end of the stream, after everything before it
                items.popleft()
                if self._dst.can_write_eof():
                    self._dst.write_eof()
                return
            now = loop.time()
            batch: list[bytes] = []
            while items and items[0][1] and items[0][0] <= now:
                batch.append(items.popleft()[1])
            self._dst.writelines(batch)
            await self._dst.drain()
            n = sum(map(len, batch))
            self._add(-n)
            self._proxy.bytes_forwarded += n
            if self.queued <= self._proxy.buffer_max_bytes:
                self._room.set()

    def discard(self) -> None:
        """Forget what is still queued (the connection is gone)."""
        self._items.clear()
        self._add(-self.queued)


class LatencyProxy:
    """Forwards TCP connections along ``routes``, each byte ``delay_ms`` late each way.

    ``start()`` binds every listener; ``stop()`` closes them and every open connection;
    ``serve_forever()`` starts (if needed) and runs until ``stop()`` or cancellation.
    Counters: ``connections_total`` (connections accepted), ``bytes_forwarded`` (bytes
    written to either side), ``bytes_queued`` (bytes read and not yet delivered).
    """

    def __init__(
        self,
        routes: Sequence[Route],
        delay_ms: float,
        *,
        buffer_max_bytes: int = 4 * 1024 * 1024,
        bind_source: str | None = None,
    ) -> None:
        if not routes:
            raise ValueError("a latency proxy needs at least one route")
        if not math.isfinite(delay_ms) or delay_ms < 0:
            raise ValueError(f"delay_ms must be a finite number >= 0, not {delay_ms!r}")
        if buffer_max_bytes < 1:
            raise ValueError(f"buffer_max_bytes must be at least 1, not {buffer_max_bytes!r}")
        self.routes: tuple[Route, ...] = tuple(routes)
        self.delay_ms = float(delay_ms)
        self.buffer_max_bytes = buffer_max_bytes
        self.bind_source = bind_source
        self.connections_total = 0
        self.bytes_forwarded = 0
        self.bytes_queued = 0
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._stopped = asyncio.Event()

    @property
    def listen_addresses(self) -> list[tuple[str, int]]:
        """(host, port) each listener is bound to, in route order (empty when stopped)."""
        out: list[tuple[str, int]] = []
        for server in self._servers:
            name = server.sockets[0].getsockname()
            out.append((str(name[0]), int(name[1])))
        return out

    async def start(self) -> None:
        """Bind every route's listener; OSError naming the address if one cannot bind
        (the listeners already bound are closed again)."""
        if self._servers:
            raise RuntimeError("the latency proxy is already started")
        self._closing = False
        self._stopped.clear()
        for route in self.routes:
            try:
                server = await asyncio.start_server(
                    self._handler(route), route.listen_host, route.listen_port
                )
            except OSError as exc:
                servers, self._servers = self._servers, []
                for s in servers:
                    s.close()
                for s in servers:
                    await s.wait_closed()
                address = _format_address(route.listen_host, route.listen_port)
                # asyncio's own message repeats the address; the errno's text is enough
                reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else (exc.strerror or str(exc))
                raise OSError(exc.errno, f"latency proxy cannot listen on {address}: {reason}") from exc
            self._servers.append(server)
        log.info(
            "latency proxy: %s, %g ms each way", ", ".join(map(str, self.routes)), self.delay_ms
        )

    async def stop(self) -> None:
        """Close the listeners and every open connection (queued bytes are dropped)."""
        self._closing = True
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for server in servers:
            await server.wait_closed()
        self._stopped.set()

    async def serve_forever(self) -> None:
        """Start if not started, then serve until :meth:`stop` (or cancellation, which stops)."""
        if not self._servers:
            await self.start()
        try:
            await self._stopped.wait()
        finally:
            await self.stop()

    def _handler(
        self, route: Route
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(route, reader, writer)

        return handle

    async def _serve(
        self, route: Route, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections_total += 1
        writers = [client_writer]
        directions: list[_Direction] = []
        graceful = False  # close (flushing what the sockets still hold) rather than abort
        try:
            if self._closing:
                return
            local_addr = (self.bind_source, 0) if self.bind_source else None
            try:
                target_reader, target_writer = await asyncio.wait_for(
                    asyncio.open_connection(route.target_host, route.target_port, local_addr=local_addr),
                    _CONNECT_TIMEOUT_S,
                )
            except OSError as exc:  # refused, unreachable, timed out (TimeoutError is an OSError)
                log.warning("latency proxy %s: cannot connect to the target: %s", route, exc or type(exc).__name__)
                graceful = True
                return
            writers.append(target_writer)
            directions = [
                _Direction(self, client_reader, target_writer),
                _Direction(self, target_reader, client_writer),
            ]
            tasks = [asyncio.create_task(coro) for d in directions for coro in (d.pump(), d.deliver())]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            errors = [e for t in done if not t.cancelled() and (e := t.exception()) is not None]
            if not errors:
                graceful = True
            elif isinstance(errors[0], OSError):  # a reset, a broken pipe: the peer's doing
                log.debug("latency proxy %s: connection closed on error: %s", route, errors[0])
            else:
                log.error("latency proxy %s: connection failed", route, exc_info=errors[0])
        finally:
            self._tasks.discard(task)
            for d in directions:
                d.discard()
            await _close(writers, graceful)


async def _close(writers: Sequence[asyncio.StreamWriter], graceful: bool) -> None:
    for w in writers:
        if graceful:
            w.close()
        else:
            w.transport.abort()
    for w in writers:
        try:
            await asyncio.wait_for(w.wait_closed(), _CLOSE_TIMEOUT_S)
        except TimeoutError:  # the peer does not take what is left: drop it
            w.transport.abort()
        except OSError:  # wait_closed re-raises the error the connection ended with
            pass
        except asyncio.CancelledError:
            for x in writers:
                x.transport.abort()
            raise


# ---- the command line ----------------------------------------------------------------------

USAGE = "python -m gnomon.infra.latency --delay-ms MS --route LISTEN=TARGET [--route ...] [--bind-source ADDR]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"gnomon.infra.latency: {message} (usage: {USAGE})", file=sys.stderr)
        raise SystemExit(2)


def _route_arg(text: str) -> Route:
    try:
        return Route.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _delay_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--delay-ms {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"--delay-ms {text!r} must be a number >= 0")
    return value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m gnomon.infra.latency",
        usage=USAGE,
        description="A TCP proxy that delays every byte by a fixed time each way (simulated regions).",
    )
    p.add_argument("--delay-ms", type=_delay_arg, required=True, help="one-way delay in milliseconds")
    p.add_argument(
        "--route",
        type=_route_arg,
        action="append",
        required=True,
        help="LISTEN_HOST:PORT=TARGET_HOST:PORT; repeat for more listeners",
    )
    p.add_argument("--bind-source", help="local address for the connections to the targets")
    return p


async def _run(proxy: LatencyProxy) -> int:
    try:
        await proxy.start()
    except OSError as exc:
        print(f"gnomon.infra.latency: {exc}", file=sys.stderr)
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    delay_ms = proxy.delay_ms
    # SIGUSR1: no delay from now on; SIGUSR2: the delay again (a benchmark compares both in one run)
    toggles = {signal.SIGUSR1: 0.0, signal.SIGUSR2: delay_ms}
    for sig, value in toggles.items():
        loop.add_signal_handler(sig, _set_delay, proxy, value)
    signals = (*signals, *toggles)
    try:
        print(f"latency proxy ready: {len(proxy.routes)} routes, {proxy.delay_ms:g} ms each way", flush=True)
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await proxy.stop()
    return 0


def _set_delay(proxy: LatencyProxy, delay_ms: float) -> None:
    proxy.delay_ms = delay_ms
    print(f"latency proxy: {delay_ms:g} ms each way from now", flush=True)


MARKER = "-Dgnomon.component="  # gnomon.infra.procs tags the processes it starts (ignored here)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proxy until SIGTERM or SIGINT: 0 then, 1 if a listener cannot bind, 2 bad usage.
    SIGUSR1 sets the delay to 0, SIGUSR2 back to ``--delay-ms``."""
    given = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args([a for a in given if not a.startswith(MARKER)])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    proxy = LatencyProxy(args.route, args.delay_ms, bind_source=args.bind_source)
    return asyncio.run(_run(proxy))


if __name__ == "__main__":
    raise SystemExit(main())
