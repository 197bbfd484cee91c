"""What a broker-side plugin may use of the node it runs in.

Coordinators (``register_coordinators``) and the request handlers they
register get a :class:`BrokerServices`, never the broker: the metadata image,
configuration, plugin manager and authorizer, the coordinator runtime (their
internal topics' partitions), producer ids, and requests to other brokers.
The node behind it is private and changes freely; this surface is part of the
plugin API (:mod:`josef.plugin_api`) and changes only as that API's version says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

import pluggy
from kio.schema.errors import ErrorCode

from josef.authorizer import Authorizer, CallerFacade
from josef.config import Config
from josef.metadata.controller import ControllerError
from josef.metadata.image import MetadataImage
from josef.metadata.quorum import NotControllerError
from josef.plugin_api import deprecated_property

if TYPE_CHECKING:
    from josef.coordinator.runtime import CoordinatorRuntime
    from josef.led_partitions import LedPartitions
    from josef.metrics import NodeMetrics
    from josef.node.broker import Broker
    from josef.server.dispatch import Handler


class ProducerIdUnavailable(Exception):
    """No producer id can be handed out now; ``code`` is the Kafka error to answer the client with."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BrokerServices:
    """The narrow view of one broker that its plugins are given."""

    __slots__ = ("_broker",)

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    @property
    def node_id(self) -> int:
        return self._broker.node_id

    @property
    def is_broker(self) -> bool:
        """The node has the broker role (``process.roles``): it hosts partitions and coordinators."""
        return self._broker.is_broker

    @property
    def config(self) -> Config:
        """The broker's configuration, with dynamic changes applied (read it each time; do not keep values)."""
        return self._broker.config

    @property
    def image(self) -> MetadataImage:
        """The metadata image this broker has applied; a new object after every change, never mutated."""
        return self._broker.image

    @property
    def plugins(self) -> pluggy.PluginManager:
        """The broker's plugin manager, to collect what other plugins register (assignors...)."""
        return self._broker.pm

    @property
    def authorizer(self) -> Authorizer:
        """The broker's authorizer, ``authorize(context, actions)`` (plugin API 1.0's one-action call still works,
        with a deprecation warning)."""
        return CallerFacade(self._broker.authorizer)

    @property
    def partitions(self) -> LedPartitions:
        """Reads of the partitions this broker leads, their long poll and their state changes (plugin API 1.5):
        :class:`josef.led_partitions.LedPartitions`."""
        from josef.led_partitions import LedPartitions

        return LedPartitions(self._broker)

    @property
    def metrics(self) -> NodeMetrics:
        """The node's metrics (plugin API 1.5): ``metrics.register(collector)`` exports a prometheus-client
        collector's families on ``/metrics`` (:mod:`josef.metrics`). A plugin object the node builds (a
        coordinator, a log storage, a metadata quorum, a telemetry receiver) that has ``collect()`` is
        exported without asking."""
        return self._broker.metrics

    @property
    def coordinators(self) -> CoordinatorRuntime:
        """The coordinator runtime: shards of internal-topic partitions (``shard_for``, ``shards``, ``spawn``...)."""
        return self._broker.coordinators

    async def new_producer_id(self) -> int:
        """A producer id no other producer of the cluster has (from the block the metadata quorum gave this broker).

        May wait for the controller to hand out a new block; raises
        :class:`ProducerIdUnavailable` with the error a client should be answered when none can be had.
        """
        try:
            return await self._broker.producer_ids.generate()
        except ControllerError as exc:
            raise ProducerIdUnavailable(exc.code, exc.message) from exc
        except NotControllerError as exc:  # Kafka's answer while a broker waits for its next block: retriable
            raise ProducerIdUnavailable(ErrorCode.coordinator_load_in_progress, str(exc)) from exc

    def core_handler(self, api_key: int) -> Handler:
        """The core's own handler of an API a coordinator takes over (``josef.server.apis.TAKEOVER_APIS``),
        for the requests it leaves to the core (InitProducerId without a transactional id)."""
        from josef.server.apis import TAKEOVER_APIS

        return TAKEOVER_APIS[api_key]

    def spawn(self, function: Callable[[], Awaitable[None]]) -> None:
        """Run ``function()`` on the broker's event loop as background work, from when the broker serves its
        partitions until it stops (then it is cancelled). An exception it raises stops the broker: catch what
        a retry can mend."""
        self._broker.spawn(function)

    async def call_peer(self, node_id: int, api_key: int, body: Mapping[str, Any], *, version: int | None = None) -> Any:
        """Send a request to broker ``node_id`` over the inter-broker listener and return its decoded response."""
        return await self._broker.peers.call(node_id, api_key, body, version=version)

    # Kept for coordinators written against the broker object (josef 0.1), for one minor version.

    @deprecated_property("BrokerServices.plugins", "2.0")
    def pm(self) -> pluggy.PluginManager:
        return self._broker.pm

    @deprecated_property("BrokerServices.new_producer_id()", "2.0")
    def producer_ids(self) -> Any:
        return self._broker.producer_ids

    @deprecated_property("BrokerServices.call_peer()", "2.0")
    def peers(self) -> Any:
        return self._broker.peers
