"""The broker's line to the active controller: Kafka's NodeToControllerChannelManager.

Everything a broker asks of the controller goes through here: its
registration and heartbeats, producer-id blocks, topics it creates itself
(auto-creation, internal topics), and the admin requests clients send it
(CreateTopics, configs, quotas, features...), which are forwarded unchanged
and answered with the controller's response.

Where the active controller is depends on the metadata quorum. When it can
only be reached in-process (a single-node quorum, no controller listener),
the controller's own handler is called directly; otherwise the request goes
over the network to the controller listener of the node the quorum names,
and is sent again to the next controller when the answer is NOT_CONTROLLER,
the connection fails or the quorum names another controller before the
answer came, for up to 30 seconds. A client's request travels in
an Envelope with its principal and address, as Kafka's brokers forward it.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

import anyio
from kio.schema.errors import ErrorCode

from josef.node.broker_config import inter_broker_listener_name
from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.error_responses import error_codes, error_response
from josef.protocol.errors import KafkaConnectionError, KafkaTimeoutError, UnsupportedVersionError
from josef.protocol.messages import decode_response, encode_request
from josef.protocol.sasl_client import (
    ClientSasl,
    SaslAuthenticationFailed,
    outbound_sasl,
    refused_by_controller,
    unauthorized_by_controller,
)
from josef.protocol.tls import outbound_context
from josef.server.apis.envelope import address_bytes, principal_bytes
from josef.server.dispatch import RequestContext

if TYPE_CHECKING:
    from josef.node.broker import Broker

log = logging.getLogger(__name__)

#: How long a request may look for an active controller: Kafka's ``controller.socket.timeout.ms`` default.
CONTROLLER_TIMEOUT_S = 30.0
#: How long to wait before asking again when there is no controller, or it moved.
RETRY_BACKOFF_S = 0.05
#: How often a request in flight checks that the controller it was sent to still leads the quorum.
CONTROLLER_WATCH_S = 0.1
#: What :meth:`ControllerChannel._while_active` gives when the controller changed before it answered.
_MOVED = object()


class ControllerUnavailableError(KafkaTimeoutError):
    """No active controller answered within the request timeout."""


class ControllerChannel:
    def __init__(self, node: Broker) -> None:
        self._node = node
        self._connections: dict[int, Connection] = {}
        self._timeout_s = CONTROLLER_TIMEOUT_S

    async def call(self, api_key: int, body: Mapping[str, Any], *, timeout_s: float | None = None) -> Any:
        """Send one request to the active controller and return its (kio) response.

        Raises :class:`ControllerUnavailableError` when none answered within
        ``timeout_s`` (30 s by default).
        """
        return await self._send(api_key, None, body, timeout_s)

    async def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                           configs: Mapping[str, str] | None = None) -> tuple[ErrorCode, str | None]:
        """Create a topic for the broker itself (auto-creation, internal topics): its error code and message."""
        try:
            response = await self.call(ApiKey.CREATE_TOPICS, {
                "topics": [{"name": name, "num_partitions": partitions, "replication_factor": replication_factor,
                            "assignments": [], "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()]}],
                "timeout": int(self._timeout_s * 1000), "validate_only": False})
        except ControllerUnavailableError as exc:
            return ErrorCode.request_timed_out, str(exc)
        [result] = response.topics
        await self._storage_settled()
        return result.error_code, result.error_message

    async def forward(self, ctx: RequestContext, request: Any) -> Any:
        """Answer a client's admin request with the active controller's response to it."""
        try:
            response = await self._send(ctx.api_key, ctx, request)
        except ControllerUnavailableError as exc:
            return error_response(ctx.api_key, ctx.api_version, request, ErrorCode.request_timed_out, str(exc))
        await self._storage_settled()
        return response

    async def _storage_settled(self) -> None:
        """Wait (a bounded time) until this broker opened and deleted the logs of the metadata it applied so far.

        Logs are opened and deleted in a worker thread after the metadata
        changes (:meth:`josef.replication.replica_manager.ReplicaManager.apply_delta`); a
        client that created a topic through this broker finds it served here
        when the answer comes, as before, rather than answered
        NOT_LEADER_OR_FOLLOWER for a moment.
        """
        if self._node.is_broker:
            with anyio.move_on_after(self._timeout_s):
                await self._node.replicas.storage_settled()

    async def _send(self, api_key: int, ctx: RequestContext | None, request: Any,
                    timeout_s: float | None = None) -> Any:
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            controller_id = self._node.quorum.controller_id
            if controller_id >= 0:
                endpoint = self._node.quorum.controller_endpoint(controller_id)
                if endpoint is None:
                    # In-process; NOT_CONTROLLER while this node's quorum is (re)taking the controllership, as a
                    # ZooKeeper-backed node does after its session expired: asked again, as a remote one would be.
                    response = await self._node.controller_dispatcher.call(api_key, request, ctx=ctx)
                    if ErrorCode.not_controller not in error_codes(response):
                        return response
                else:
                    try:
                        response = await self._while_active(controller_id, functools.partial(
                            self._over_network, controller_id, endpoint, api_key, ctx, request))
                    except (KafkaConnectionError, KafkaTimeoutError, UnsupportedVersionError) as exc:
                        log.debug("controller %d at %s:%d: %s", controller_id, *endpoint, exc)
                        await self._drop(controller_id)
                    else:
                        if response is not _MOVED and ErrorCode.not_controller not in error_codes(response):
                            if ctx is None and getattr(response, "error_code", None) == \
                                    ErrorCode.cluster_authorization_failed:  # this node's own principal: no retry mends it
                                raise unauthorized_by_controller(controller_id, self._outbound_sasl())
                            return response
                        await self._drop(controller_id)
            if time.monotonic() >= deadline:
                raise ControllerUnavailableError(f"no active controller answered within {timeout_s:.0f} s")
            await anyio.sleep(RETRY_BACKOFF_S)

    async def _while_active(self, controller_id: int, request: Callable[[], Awaitable[Any]]) -> Any:
        """``request``'s answer, or ``_MOVED`` as soon as the quorum names another controller than ``controller_id``.

        A controller that froze (a stopped process, a cut link) keeps its
        connections open and answers nothing, so waiting for the request
        timeout would hold every heartbeat of this broker for 30 s, and the
        new controller would fence it meanwhile. Kafka's channel waits, too;
        the quorum already knows better, so the request goes to the new
        controller at once (every request sent here may be sent again, as on
        a lost connection).
        """
        answer: Any = _MOVED
        failure: BaseException | None = None

        async def send(scope: anyio.CancelScope) -> None:
            nonlocal answer, failure
            try:
                answer = await request()
            except Exception as exc:  # noqa: BLE001 - raised below, outside the task group
                failure = exc
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, tg.cancel_scope)
            while self._node.quorum.controller_id == controller_id:
                await anyio.sleep(CONTROLLER_WATCH_S)
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return answer

    def _listener(self) -> str:
        """The listener whose security settings reach the controller: the controller listener, or the inter-broker
        listener where controllers are reached on broker listeners (a Kafka 3.x ZooKeeper-mode cluster)."""
        if self._node.controller_on_broker_listener:
            name = inter_broker_listener_name(self._node.config)
            if name is not None:
                return name
        return (self._node.config["controller.listener.names"] or ["CONTROLLER"])[0]

    def _outbound_sasl(self) -> ClientSasl | None:
        mechanism = ("sasl.mechanism.inter.broker.protocol" if self._node.controller_on_broker_listener
                     else "sasl.mechanism.controller.protocol")
        return outbound_sasl(self._node.config, self._listener(), mechanism)

    async def _over_network(self, controller_id: int, endpoint: tuple[str, int], api_key: int,
                            ctx: RequestContext | None, request: Any) -> Any:
        conn = self._connections.get(controller_id)
        if conn is None or conn.closed:
            listener = self._listener()
            sasl = self._outbound_sasl()
            try:
                conn = self._connections[controller_id] = await Connection.open(
                    *endpoint, client_id=f"broker-{self._node.node_id}-to-controller",
                    request_timeout_ms=int(self._timeout_s * 1000),
                    ssl_context=outbound_context(self._node.config, listener), sasl=sasl)
            except SaslAuthenticationFailed as exc:
                assert sasl is not None
                raise refused_by_controller(self._node.node_id, controller_id, listener, sasl, exc) from None
        if ctx is None:
            return await conn.request(api_key, request)
        # A client's request travels in an Envelope, with the client it came from (Kafka's ForwardingManager).
        frame = encode_request(api_key, ctx.api_version, ctx.correlation_id, (ctx.client_id or "").encode(), request)
        wrapped = await conn.request(ApiKey.ENVELOPE, {
            "request_data": frame[4:], "request_principal": principal_bytes(ctx.principal, ctx.session.token_authenticated),
            "client_host_address": address_bytes(ctx.client_host)})
        if wrapped.error_code != ErrorCode.none or wrapped.response_data is None:
            return error_response(api_key, ctx.api_version, request, wrapped.error_code or ErrorCode.unknown_server_error,
                                  f"the controller refused the forwarded request: {wrapped.error_code.name}")
        return decode_response(api_key, ctx.api_version, wrapped.response_data)[1]

    async def _drop(self, controller_id: int) -> None:
        conn = self._connections.pop(controller_id, None)
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        for controller_id in list(self._connections):
            await self._drop(controller_id)
