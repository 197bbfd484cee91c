"""josef's idempotent producer: lost acknowledgements are retried and the log holds each record once, in order.

A TCP proxy between producer and broker (the broker advertises the proxy's
address) swallows one Produce response after the broker has appended the
batch, then cuts the connection, exactly what a network failure after the
append looks like to the client.
"""

import asyncio
import socket
import struct
import threading
import time

import pytest

from josef.protocol.records import iter_batches, iter_records
from josef.protocol.topic_partition import TopicPartition
from josef.node.runner import BrokerThread
from josef.testing import broker_overrides
from josef_client.producer import AsyncProducer


class LossyProxy:
    """Forwards one port to another on its own thread; can drop the next Produce response and cut the connection."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.target_port = -1
        self.cut_next_produce = threading.Event()
        self.cut_done = threading.Event()
        self.on_cut = None
        self.connections = 0
        self.connect_delay_s = 0.0  # how long connections after the first wait before reaching the broker
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.connections > 1:
                time.sleep(self.connect_delay_s)
            server = socket.create_connection(("127.0.0.1", self.target_port))
            pending: list[int] = []  # API keys of requests in flight, in order
            threading.Thread(target=self._requests, args=(client, server, pending), daemon=True).start()
            threading.Thread(target=self._responses, args=(server, client, pending), daemon=True).start()

    @staticmethod
    def _frame(sock: socket.socket) -> bytes | None:
        head = sock.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        body = sock.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
        return head + body

    def _requests(self, client: socket.socket, server: socket.socket, pending: list[int]) -> None:
        try:
            while (frame := self._frame(client)) is not None:
                pending.append(struct.unpack_from(">h", frame, 4)[0])
                server.sendall(frame)
        except OSError:
            pass
        finally:
            server.close()

    def _responses(self, server: socket.socket, client: socket.socket, pending: list[int]) -> None:
        try:
            while (frame := self._frame(server)) is not None:
                api_key = pending.pop(0)
                if api_key == 0 and self.cut_next_produce.is_set():
                    self.cut_next_produce.clear()
                    if self.on_cut is not None:
                        self.on_cut()
                    self.cut_done.set()
                    break  # the broker appended; the client never hears of it
                client.sendall(frame)
        except OSError:
            pass
        finally:
            for sock in (client, server):  # shutdown wakes the other thread's blocked recv; close alone does not
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxied_broker(tmp_path):
    proxy = LossyProxy()
    broker = BrokerThread(broker_overrides(tmp_path, **{"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"}))
    broker.start()
    proxy.target_port = broker.port
    yield proxy, broker
    broker.stop()
    proxy.close()


def stored_values(broker, topic):
    log = broker.broker.replicas.get(TopicPartition(topic, 0)).log
    data = log.read(log.log_start_offset, 1 << 30, log.log_end_offset)
    return [r.value for pos, h in iter_batches(data) for r in iter_records(memoryview(data)[pos:pos + h.size])]


def produce_through_cut(proxy, broker, topic):
    async def main():
        async with AsyncProducer(bootstrap_servers=f"127.0.0.1:{proxy.port}", linger_ms=2, request_timeout_ms=5000,
                                 retry_backoff_ms=50) as producer:
            assert producer._idempotent and producer.producer_id >= 0
            futures = [await producer.send(topic, f"{i}".encode()) for i in range(500)]
            await producer.flush()
            proxy.cut_next_produce.set()
            futures += [await producer.send(topic, f"{i}".encode()) for i in range(500, 1000)]
            results = [await f for f in futures]
            assert proxy.cut_done.is_set()
            return results

    return asyncio.run(main())


def test_lost_acknowledgement_is_retried_once(proxied_broker):
    proxy, broker = proxied_broker
    results = produce_through_cut(proxy, broker, "lost-ack")
    assert [md.offset for md in results] == list(range(1000))
    assert stored_values(broker, "lost-ack") == [f"{i}".encode() for i in range(1000)]


def test_lost_acknowledgement_then_broker_restart(proxied_broker):
    proxy, broker = proxied_broker
    before = broker.broker
    proxy.on_cut = broker.restart  # the broker restarts before the client learns its connection is gone
    results = produce_through_cut(proxy, broker, "lost-ack-restart")
    assert broker.broker is not before
    assert [md.offset for md in results] == list(range(1000))
    assert stored_values(broker, "lost-ack-restart") == [f"{i}".encode() for i in range(1000)]


def test_batches_ready_while_the_leader_connection_opens_go_out_in_order(proxied_broker, caplog):
    """Requests wait for a live connection instead of racing each other to it: no sequence overtakes another."""
    proxy, broker = proxied_broker
    proxy.connect_delay_s = 0.5  # the bootstrap connection is quick, the leader's is slow to come up

    async def main():
        async with AsyncProducer(bootstrap_servers=f"127.0.0.1:{proxy.port}", linger_ms=0, batch_size=200) as producer:
            futures = [await producer.send("slow-leader", f"{i}".encode(), partition=0) for i in range(3000)]
            leader = producer.cluster.leader(TopicPartition("slow-leader", 0))
            while (connecting := producer.cluster.connecting(leader)) is None:
                await asyncio.sleep(0.01)  # the sender starts connecting on its first pass
            while not connecting.done():
                assert producer._in_flight[leader] == 0  # nothing is written or waiting for the connection
                await asyncio.sleep(0.01)
            return [await f for f in futures]

    caplog.set_level("DEBUG", logger="josef_client.producer")
    results = asyncio.run(main())
    assert [md.offset for md in results] == list(range(3000))
    assert stored_values(broker, "slow-leader") == [f"{i}".encode() for i in range(3000)]
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]
