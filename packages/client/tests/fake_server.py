"""A Kafka server in a thread of its own, for client tests that need real framing on a real socket but no broker.

It parses requests with josef's header and body parsers and encodes answers
with josef's encoder, on a free port of 127.0.0.1, in its own event loop.
A subclass says what to answer (:meth:`FakeKafkaServer.answer`); the base
records every request, can hold an API's requests (:meth:`pause`) and
closes its connections when the test ends.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from typing import Any

from josef.protocol.messages import build, encode_response, is_flexible, parse_body, parse_header, response_type


class FakeKafkaServer:
    def __init__(self) -> None:
        self.requests: list[tuple[int, int, Any]] = []
        self.client_ids: set[str | None] = set()
        self.hold: dict[int, asyncio.Event] = {}
        self.connections: set[asyncio.Task[None]] = set()
        self.port = -1
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    def answer(self, key: int, version: int, body: Any) -> dict[str, Any] | None:
        """The response body to one request (None: no response, as for acks=0)."""
        raise NotImplementedError

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def asked(self, key: int) -> list[tuple[int, Any]]:
        """``(version, request)`` of every request of ``key`` so far."""
        return [(version, body) for k, version, body in self.requests if k == key]

    def pause(self, key: int) -> None:
        """Hold requests of ``key`` (and what follows them on their connection) until :meth:`release`."""
        self.hold[key] = asyncio.Event()

    def release(self, key: int) -> None:
        self.loop.call_soon_threadsafe(self.hold.pop(key).set)

    def close(self) -> None:
        async def shut() -> None:
            self.server.close()
            for task in self.connections:
                task.cancel()
            await asyncio.gather(*self.connections, return_exceptions=True)
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = await reader.readexactly(size)
                header = parse_header(frame, is_flexible)
                key, version = header.api_key, header.api_version
                body = parse_body(key, version, frame, header.body_offset)
                self.requests.append((key, version, body))
                self.client_ids.add(header.client_id)
                if key in self.hold:
                    await self.hold[key].wait()
                answer = self.answer(key, version, body)
                if answer is None:
                    continue
                writer.write(encode_response(key, version, header.correlation_id, build(response_type(key, version), answer)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.connections.discard(task)
