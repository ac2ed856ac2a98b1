"""A slow network link for benchmarks: a TCP proxy on 127.0.0.1 that forwards to a local port at
a set rate (a robot's Wi-Fi), and can drop every connection once after a number of bytes (a
link that goes down mid-upload).

Used by ``benchmarks/deploy.py``: the deploy client talks to the proxy's URL instead of the
agent's. Each direction of each connection is paced to ``rate`` bytes/s; connections share
nothing (one upload at a time is what the benchmark measures).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

READ_BYTES = 64 << 10


class Link:
    """The proxy's counters and its one-shot drop."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.sent = 0
        """Bytes forwarded towards the target (the upload direction), all connections."""
        self.drop_after: int | None = None
        """Drop every open connection once :attr:`sent` passes this (then it is cleared)."""
        self.drops = 0
        self._open: set[asyncio.StreamWriter] = set()

    def drop_once_after(self, nbytes: int) -> None:
        """Cut the link once ``nbytes`` more have been sent towards the target."""
        self.drop_after = self.sent + nbytes


@contextmanager
def slow_link(target_port: int, rate: float) -> Iterator[tuple[str, Link]]:
    """A proxy to ``127.0.0.1:target_port`` at ``rate`` bytes/s each way; its URL and
    :class:`Link`. Stopped on exit."""
    link = Link(rate)
    loop = asyncio.new_event_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]

    async def pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upload: bool
    ) -> None:
        free_at = time.monotonic()  # when the link has carried what came before
        try:
            while data := await reader.read(READ_BYTES):
                # a link at ``rate``: each read takes len / rate on the wire after the previous
                # one, and idle time earns no burst
                start = max(time.monotonic(), free_at)
                free_at = start + len(data) / link.rate
                await asyncio.sleep(max(0.0, free_at - time.monotonic()))
                writer.write(data)
                await writer.drain()
                if upload:
                    link.sent += len(data)
                    if link.drop_after is not None and link.sent >= link.drop_after:
                        link.drop_after, link.drops = None, link.drops + 1
                        for open_writer in list(link._open):
                            open_writer.transport.abort()
                        return
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            target_r, target_w = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_w.close()
            return
        link._open.update((client_w, target_w))
        try:
            await asyncio.gather(pump(client_r, target_w, True), pump(target_r, client_w, False))
        finally:
            link._open.difference_update((client_w, target_w))

    async def serve() -> asyncio.AbstractServer:
        return await asyncio.start_server(handle, sock=sock)

    server = loop.run_until_complete(serve())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def shutdown() -> None:
        server.close()
        for writer in list(link._open):
            writer.transport.abort()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        yield f"http://127.0.0.1:{port}", link
    finally:
        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
