"""Requests from this broker to other brokers: transaction markers, partition verification.

Kafka sends these through its inter-broker send threads (the transaction
marker channel, the ``AddPartitionsToTxnManager``). josef keeps one
connection per peer on ``inter.broker.listener.name`` and pipelines requests
on it; a request to this broker itself is handled in process, so a single
node needs no socket to talk to itself and coordinators do not care where a
partition leader lives.

A failed connection is dropped and the error raised to the caller, who
decides whether and when to retry (markers are retried until written,
verification fails the produce with a retriable error).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

import anyio

from josef.protocol.connection import Connection
from josef.protocol.errors import KafkaConnectionError, KafkaTimeoutError
from josef.protocol.sasl_client import outbound_sasl
from josef.protocol.tls import outbound_context

if TYPE_CHECKING:
    from josef.node.broker import Broker

log = logging.getLogger(__name__)


class PeerChannel:
    """Connections from this broker to the others, by broker id."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._connections: dict[int, Connection] = {}
        self._opening: dict[int, anyio.Lock] = {}

    def endpoint_of(self, node_id: int) -> tuple[str, int] | None:
        """Where ``node_id`` listens for brokers (its inter-broker listener), from the metadata image."""
        registration = self._broker.image.brokers.get(node_id)
        endpoint = registration.endpoint(self._broker.inter_broker_listener) if registration is not None else None
        return (endpoint.host, endpoint.port) if endpoint is not None else None

    async def call(self, node_id: int, api_key: int, body: Mapping[str, Any], *, version: int | None = None) -> Any:
        """Send one request to broker ``node_id`` and return its (kio) response.

        ``version`` defaults to the newest both sides speak. Raises
        :class:`KafkaConnectionError` when the broker is unknown or
        unreachable and :class:`KafkaTimeoutError` after
        ``request.timeout.ms``; the connection is then dropped.
        """
        if node_id == self._broker.node_id:
            return await self._broker.dispatcher.call(api_key, body, version=version)
        try:
            conn = await self._connection(node_id)
            return await conn.request(api_key, body, version=version)
        except (KafkaConnectionError, KafkaTimeoutError):
            await self._drop(node_id)
            raise

    async def _connection(self, node_id: int) -> Connection:
        lock = self._opening.setdefault(node_id, anyio.Lock())
        async with lock:
            conn = self._connections.get(node_id)
            if conn is None or conn.closed:
                endpoint = self.endpoint_of(node_id)
                if endpoint is None:
                    raise KafkaConnectionError(
                        f"broker {node_id} is not registered with a {self._broker.inter_broker_listener} listener")
                conn = self._connections[node_id] = await Connection.open(
                    *endpoint, client_id=f"broker-{self._broker.node_id}",
                    request_timeout_ms=self._broker.config["request.timeout.ms"],
                    ssl_context=outbound_context(self._broker.config, self._broker.inter_broker_listener),
                    sasl=outbound_sasl(self._broker.config, self._broker.inter_broker_listener,
                                       "sasl.mechanism.inter.broker.protocol"))
            return conn

    async def _drop(self, node_id: int) -> None:
        conn = self._connections.pop(node_id, None)
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        for node_id in list(self._connections):
            await self._drop(node_id)
