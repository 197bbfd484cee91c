"""A TCP proxy that delays every chunk it forwards: latency and jitter on a link, where the kernel has no netem.

The fault harness (:mod:`josef.testing.faults`) runs one inside a node's
network namespace in front of the listeners other nodes use (inter-broker and
controller), so that traffic between nodes can be slowed while clients keep a
direct path. Run as::

    python -m josef.testing.delay_proxy LISTEN_HOST LISTEN_PORT:TARGET_HOST:TARGET_PORT [...]

It prints ``ready`` once listening, then reads commands on stdin, one per line:
``delay MS JITTER_MS`` sets the delay of each chunk in both directions
(uniform in ``MS ± JITTER_MS``); bytes are never reordered, as on a TCP
link. End of input stops it.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

_CHUNK = 64 * 1024


class Link:
    """The delay every chunk gets, changed while connections are open."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.jitter_s = 0.0

    def due(self, previous: float) -> float:
        """When a chunk read now may be written: after its delay, and never before the chunk ahead of it."""
        delay = max(0.0, self.delay_s + random.uniform(-self.jitter_s, self.jitter_s))
        return max(time.monotonic() + delay, previous)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    sender = asyncio.create_task(deliver())
    last = 0.0
    try:
        while data := await reader.read(_CHUNK):
            last = link.due(last)
            queue.put_nowait((last, data))
        queue.put_nowait((last, b""))
        await sender
    except (ConnectionError, OSError):
        pass
    finally:
        sender.cancel()
        writer.close()


async def _serve(listen_host: str, routes: list[tuple[int, str, int]], link: Link) -> None:
    async def handler(target_host: str, target_port: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, link), _pipe(up_reader, writer, link))

    servers = [await asyncio.start_server(lambda r, w, h=host, p=port: handler(h, p, r, w), listen_host, listen)
               for listen, host, port in routes]
    print("ready", flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        words = line.split()
        if len(words) == 3 and words[0] == "delay":
            link.delay_s, link.jitter_s = int(words[1]) / 1000, int(words[2]) / 1000
            print(f"delay {words[1]} {words[2]}", flush=True)
    for server in servers:
        server.close()
    os._exit(0)  # end of input: the harness is done with this link; open connections go with the process


def main(argv: list[str]) -> None:
    listen_host, *specs = argv
    routes = []
    for spec in specs:
        listen, host, port = spec.split(":")
        routes.append((int(listen), host, int(port)))
    asyncio.run(_serve(listen_host, routes, Link()))


if __name__ == "__main__":
    main(sys.argv[1:])
