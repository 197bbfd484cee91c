"""A recording TCP proxy: real clients' request frames, captured on their way to a broker.

Clients learn where brokers are from the broker's answers (Metadata,
FindCoordinator, DescribeCluster) and connect there directly, which would
leave the proxy after the first request. So the proxy rewrites the
addresses in those answers to its own: every connection a client makes
goes through it, and every request frame it sends is recorded, whole and
in order, with its size prefix. Used to build the corpus the fuzzer
mutates (:func:`capture_client_sessions`).
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import threading
import uuid
from typing import Any, Callable

import attrs

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import decode_response, encode_response, is_flexible, parse_header

_REWRITTEN = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER})


class RecordingProxy:
    """Listens on a free port of 127.0.0.1 and forwards to ``upstream``; :attr:`frames` are the requests seen."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.frames: list[bytes] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._spawn(self._accept)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="fuzz-proxy")
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                broker = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, broker]
            asked: dict[int, tuple[int, int]] = {}
            self._spawn(self._requests, client, broker, asked)
            self._spawn(self._responses, broker, client, asked)

    def _requests(self, client: socket.socket, broker: socket.socket, asked: dict[int, tuple[int, int]]) -> None:
        for frame in _frames(client):
            header = parse_header(frame[4:], is_flexible)
            asked[header.correlation_id] = (header.api_key, header.api_version)
            with self._lock:
                self.frames.append(frame)
            if not _send(broker, frame):
                break
        _shut(broker)

    def _responses(self, broker: socket.socket, client: socket.socket, asked: dict[int, tuple[int, int]]) -> None:
        for frame in _frames(broker):
            (correlation,) = struct.unpack_from(">i", frame, 4)
            key, version = asked.pop(correlation, (-1, -1))
            if key in _REWRITTEN:
                frame = self._rewritten(key, version, frame)
            if not _send(client, frame):
                break
        _shut(client)

    def _rewritten(self, key: int, version: int, frame: bytes) -> bytes:
        """The answer with every broker address (the upstream's host and port) replaced by the proxy's."""
        correlation, response = decode_response(key, version, frame[4:])
        response = _replace_addresses(response, self.upstream, ("127.0.0.1", self.port))
        return encode_response(key, version, correlation, response)

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                _shut(sock)
                sock.close()
        for thread in self._threads:
            thread.join(5)


def _replace_addresses(entity: Any, old: tuple[str, int], new: tuple[str, int]) -> Any:
    """``entity`` (a kio response) with every (host, port) pair equal to ``old`` made ``new``, nested entries too."""
    changes = {}
    for field in dataclasses.fields(entity):
        value = getattr(entity, field.name)
        if dataclasses.is_dataclass(value):
            changes[field.name] = _replace_addresses(value, old, new)
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            changes[field.name] = tuple(_replace_addresses(v, old, new) for v in value)
    names = {f.name for f in dataclasses.fields(entity)}
    if {"host", "port"} <= names and getattr(entity, "port") == old[1]:
        changes.update(host=new[0], port=new[1])
    return dataclasses.replace(entity, **changes) if changes else entity


def _frames(sock: socket.socket):
    """The size-prefixed frames read from ``sock`` (prefix included), until it closes."""
    buffer = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        while len(buffer) >= 4:
            (size,) = struct.unpack_from(">i", buffer, 0)
            if size < 0 or len(buffer) < 4 + size:
                break
            yield buffer[:4 + size]
            buffer = buffer[4 + size:]


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


@attrs.frozen
class Capture:
    """The request frames real clients sent (size prefixes included), and the steps of their sessions that failed."""

    frames: list[bytes]
    errors: list[str]


def capture_client_sessions(upstream: tuple[str, int]) -> Capture:
    """Run a confluent-kafka produce/consume/group session and a kafka-python admin session through a
    :class:`RecordingProxy` in front of ``upstream`` (host, port), and record what they send.

    A step that fails (the broker answering an error) is noted and the
    session goes on: the frames are what matters here. Needs confluent-kafka
    and kafka-python (josef's dev dependencies).
    """
    proxy = RecordingProxy(upstream)
    errors: list[str] = []
    try:
        _confluent_session(proxy.bootstrap, errors)
        _kafka_python_admin_session(proxy.bootstrap, errors)
    finally:
        proxy.close()
    return Capture(list(proxy.frames), errors)


def _step(errors: list[str], what: str, action: Callable[[], Any]) -> Any:
    try:
        return action()
    except Exception as exc:
        errors.append(f"{what}: {exc!r}")
        return None


def _confluent_session(bootstrap: str, errors: list[str]) -> None:
    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"capture-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    _step(errors, "create topic", lambda: admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30))
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                         "compression.type": "lz4", "linger.ms": 5})
    for i in range(50):
        producer.produce(topic, key=str(i % 5).encode(), value=b"v" * (i * 7), headers={"h": b"x"})
    if producer.flush(30):
        errors.append("idempotent produce did not finish")
    txn = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"txn-{topic}"})

    def transaction() -> None:
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce(topic, value=b"in a transaction")
        txn.commit_transaction(30)
    _step(errors, "transaction", transaction)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"group-{topic}",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    seen = 0
    for _ in range(100):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen += 1
            if seen % 10 == 0:
                _step(errors, "commit", lambda: consumer.commit(message, asynchronous=False))
        if seen >= 51:
            break
    if seen < 51:
        errors.append(f"the consumer read {seen} of 51 records")
    consumer.close()
    _step(errors, "delete topic", lambda: admin.delete_topics([topic])[topic].result(30))


def _kafka_python_admin_session(bootstrap: str, errors: list[str]) -> None:
    from kafka import TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions, NewTopic

    topic = f"capture-admin-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    calls = [
        ("create topic", lambda: admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"retention.ms": "60000"})])),
        ("describe topic configs", lambda: admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])),
        ("describe broker configs", lambda: admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "1")])),
        ("alter configs", lambda: admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                                      configs={"retention.ms": "120000"})])),
        ("create partitions", lambda: admin.create_partitions({topic: NewPartitions(3)})),
        ("list topics", admin.list_topics),
        ("describe topics", lambda: admin.describe_topics([topic])),
        ("describe cluster", admin.describe_cluster),
        ("describe metadata quorum", admin.describe_metadata_quorum),
        ("describe features", admin.describe_features),
        ("describe log dirs", admin.describe_log_dirs),
        ("list offsets", lambda: admin.list_partition_offsets({TopicPartition(topic, 0): -1})),
        ("describe producers", lambda: admin.describe_producers([TopicPartition(topic, 0)])),
        ("list transactions", admin.list_transactions),
    ]
    try:
        for what, call in calls:
            _step(errors, what, call)
        groups = [g["group_id"] for g in _step(errors, "list groups", admin.list_groups) or []]
        if groups:
            _step(errors, "describe groups", lambda: admin.describe_groups(groups))
            _step(errors, "list group offsets", lambda: admin.list_group_offsets({groups[0]: None}))
        _step(errors, "delete topics", lambda: admin.delete_topics([topic]))
    finally:
        admin.close()
