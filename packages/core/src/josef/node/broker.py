"""A josef node: a broker, a controller or both (``process.roles``), assembled from plugins, on one event loop.

:class:`Broker` wires the selected log storage and metadata quorum to the
replica manager, the controller and the network listeners. It is what
``josef server start`` runs and what the ``josef_broker`` pytest fixture
starts in a background thread.

Listeners named in ``controller.listener.names`` serve the controller's
APIs (and the quorum's own, such as Raft's); the others serve clients.
Every node holds the metadata image the quorum's committed records build.
The broker part reaches the active controller only through its
:class:`josef.node.controller_channel.ControllerChannel` (registration,
heartbeats, producer ids, forwarded admin requests); the controller part
decides while its quorum names this node the active controller.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Awaitable, Callable, Sequence

import anyio
import anyio.abc
import attrs
import pluggy
from kio.schema.errors import ErrorCode

from josef.metadata import meta_properties
from josef.authorizer import AclAuthorizer, Authorizer, adapt
from josef.node.broker_lifecycle import BrokerLifecycle
from josef.node.controller_channel import ControllerChannel
from josef.node.broker_config import check_listeners, check_tiered_default, listener_security_protocols, sasl_listeners, tls_listeners_of, \
    inter_broker_listener_name, metadata_quorum_name
from josef.config import Config, ConfigError
from josef.coordinator.runtime import CoordinatorRuntime
from josef.security import PrincipalBuilder
from josef.services import BrokerServices
from josef.node.peer_channel import PeerChannel
from josef.log import LogStorage
from josef.metadata import bootstrap
from josef.metadata.controller import Controller, ControllerError, ProducerIdBlock
from josef.metadata.features import SupportedFeature
from josef.metadata.image import MetadataDelta, MetadataImage
from josef.metadata.migration import MetadataMigration, configured_migration
from josef.metadata.quorum import MetadataQuorum
from josef.metadata.records import BROKER_RESOURCE, Endpoint, MetadataRecord
from josef.metrics import NodeMetrics
from josef.metrics.node_state import NodeStateMetrics
from josef.metrics.requests import RequestMetrics
from josef.metrics.topics import BrokerTopicMetrics
from josef.plugins import collect, get_plugin_manager
from josef.policy import Policies
from josef.producer.producer_ids import ProducerIdManager
from josef.protocol.api_keys import ApiKey
from josef.replication.replica_manager import ReplicaManager
from josef.server import network
from josef.server.apis import TAKEOVER_APIS, forward, register_broker_apis, register_controller_apis
from josef.server.apis.envelope import QUORUM_APIS_ON_BROKERS
from josef.server.apis.coordinators import find_coordinator
from josef.server.authorization import Authorization
from josef.server.quotas import QuotaMetrics, Quotas
from josef.server.sasl import LISTENER_SASL_KEY
from josef.server.dispatch import Dispatcher
from josef.server.fetch_session import FetchSessionCache
from josef.server.http import HttpListener
from josef.telemetry import ClientTelemetry

log = logging.getLogger(__name__)

#: How often the active controller looks for brokers whose session ran out.
CONTROLLER_SWEEP_S = 0.5


@attrs.frozen
class Listener:
    name: str
    host: str
    port: int


def _process_age_s() -> float:
    """Seconds since this process started (Linux), to report start-up time including imports."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def parse_listener(text: str) -> Listener:
    name, _, rest = text.partition("://")
    host, _, port = rest.rpartition(":")
    return Listener(name, host.strip("[]"), int(port))


class Broker:
    def __init__(self, config: Config, pm: pluggy.PluginManager | None = None, *, auto_format: bool = False) -> None:
        check_listeners(config)
        check_tiered_default(config)
        self.pm = pm or get_plugin_manager()
        self.static_config = config
        self.config = config
        self.node_id: int = config["node.id"]
        self.is_broker = "broker" in config["process.roles"]
        self.is_controller = "controller" in config["process.roles"]
        self.auto_format = auto_format
        self.image = MetadataImage()
        self.started_at = time.monotonic()
        #: Where each listener really listens (a configured port 0 becomes the chosen one).
        self.bound: list[Listener] = []
        self.ready = anyio.Event()
        self._stop_requested = anyio.Event()
        #: Client-facing APIs (broker listeners) and the controller's (controller listeners, or in-process).
        self.dispatcher = Dispatcher(self)
        self.fetch_sessions = FetchSessionCache(config["max.incremental.fetch.session.cache.slots"])
        self.controller_dispatcher = Dispatcher(self)
        #: What ``/metrics`` exports (josef.metrics): the counters handlers add to, and the node's state.
        self.metrics = NodeMetrics()
        self.request_metrics = RequestMetrics()
        self.topic_metrics = BrokerTopicMetrics(lambda: self.image.topics)
        for collector in (self.request_metrics, self.topic_metrics, NodeStateMetrics(self)):
            self.metrics.register(collector)
        self.http = HttpListener(self, config)
        self.telemetry = ClientTelemetry.from_plugins(self.pm, config["telemetry.max.bytes"])
        for receiver in self.telemetry.receivers:
            self.metrics.register_if_collector(receiver)
        if self.is_broker:
            register_broker_apis(self.dispatcher, telemetry_receivers=bool(self.telemetry.receivers))
        if self.is_controller:
            register_controller_apis(self.controller_dispatcher)
        factories = collect(self.pm, "register_coordinators", "coordinator") if self.is_broker else {}
        #: SASL mechanisms of the SASL listeners, by listener name (check_listeners has validated them).
        self.sasl = sasl_listeners(self.config)
        #: TLS contexts of the SSL and SASL_SSL listeners, by listener name (reloaded on dynamic config changes).
        self.tls = tls_listeners_of(self.config)
        self.services = BrokerServices(self)
        #: Plugins' background work (:meth:`spawn`): waiting to start, then the task group it runs in.
        self._plugin_tasks: list[Callable[[], Awaitable[None]]] | anyio.abc.TaskGroup = []
        self.coordinators = CoordinatorRuntime(self, {name: factory(self.services) for name, factory in factories.items()})
        for coordinator in self.coordinators.coordinators.values():
            self.metrics.register_if_collector(coordinator)
            for key, handler, low, high in coordinator.apis():
                self.dispatcher.register(key, handler, low, high, replace=key in TAKEOVER_APIS)
        if self.coordinators.coordinators:
            self.dispatcher.register(ApiKey.FIND_COORDINATOR, find_coordinator, 0, 6)
        self._listeners: list[Any] = []
        self.storage: LogStorage
        self.quorum: MetadataQuorum
        #: The controller part; None on a broker-only node.
        self.controller: Controller | None = None
        #: The backend this controller migrates the cluster from, mirroring its commits there (KIP-866); or None.
        self.migration: MetadataMigration | None = None
        self.channel = ControllerChannel(self)
        #: Requests to other brokers (transaction markers, partition verification).
        self.peers = PeerChannel(self)
        self.lifecycle = BrokerLifecycle(self, self.channel)
        self.replicas: ReplicaManager
        self._replicas_loaded = self._coordinating = False
        self.producer_ids = ProducerIdManager(self._allocate_producer_ids)
        prefixes = tuple(config[key.name] for key in config.definition.keys() if key.prefix and config[key.name])
        ignored = sorted(k for k in config.unknown if not LISTENER_SASL_KEY.fullmatch(k) and not k.startswith(prefixes))
        if ignored:
            log.warning("ignoring configuration keys no plugin declares: %s", ", ".join(ignored))
        #: The feature levels this node supports (KIP-584), from the ``register_features`` hook.
        self.features: dict[str, SupportedFeature] = dict(collect(self.pm, "register_features", "feature").items())
        self.authorizer: Authorizer = adapt(collect(self.pm, "register_authorizers", "authorizer").get(
            config["authorizer.class.name"])(config))
        if isinstance(self.authorizer, AclAuthorizer):
            self.authorizer.load_acls({})
        #: Who each authenticated connection is (``principal.builder.class``).
        self.principal_builder: PrincipalBuilder = collect(self.pm, "register_principal_builders", "principal builder").get(
            config["principal.builder.class"])(config)
        # The request pipeline: authorization, client quotas, then the stages plugins add.
        quotas = []
        for dispatcher in (self.dispatcher, self.controller_dispatcher):
            dispatcher.add_stage(Authorization(self.authorizer))
            quotas.append(Quotas(config, controller=dispatcher is self.controller_dispatcher))
            dispatcher.add_stage(quotas[-1])
        self.metrics.register(QuotaMetrics(quotas))
        for name, factory in collect(self.pm, "register_request_stages", "request stage").items():
            stage = factory(self.services)
            for dispatcher in (self.dispatcher, self.controller_dispatcher):
                dispatcher.add_stage(stage)
        #: Kafka's create-topic and alter-config policies (josef.policy), which the controller part applies.
        self.policies = Policies.from_plugins(self.pm, config) if self.is_controller else Policies()

    @property
    def cluster_id(self) -> str:
        return self.quorum.cluster_id

    @property
    def stopping(self) -> bool:
        """A stop was requested: the node is moving its leadership away and will close."""
        return self._stop_requested.is_set()

    @property
    def controller_on_broker_listener(self) -> bool:
        """Controllers are reached on broker listeners (the quorum's optional ``controller_on_broker_listener``)."""
        return bool(getattr(self.quorum, "controller_on_broker_listener", False))

    # Lifecycle ------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start, serve until cancelled, then shut down cleanly."""
        meta_properties.check(self.config, auto_format=self.auto_format)
        base = collect(self.pm, "register_log_storage", "log storage").get(self.config["log.storage"])(self.config)
        self.storage = base
        for _, layer in collect(self.pm, "register_log_storage_layers", "log storage layer").items():
            self.storage = layer(self.storage, self.config, self.services) or self.storage
        self.quorum = collect(self.pm, "register_metadata_quorum", "metadata quorum").get(
            metadata_quorum_name(self.config))(self.config, base)
        for plugin_object in {id(o): o for o in (base, self.storage, self.quorum)}.values():
            self.metrics.register_if_collector(plugin_object)
        for key, handler, low, high in self.quorum.apis():
            if self.is_controller:
                self.controller_dispatcher.register(key, handler, low, high)
            if self.is_broker and key in QUORUM_APIS_ON_BROKERS:
                # Kafka's brokers answer DescribeQuorum, AddRaftVoter and RemoveRaftVoter by asking the active controller.
                self.dispatcher.register(key, forward, low, high)
        if self.is_controller:
            self.controller = Controller(self.quorum, self.config, lambda: self.image)
            self.migration = self._migration_source()
            if self.is_broker and self.controller_on_broker_listener:
                for key, api in self.controller_dispatcher.apis.items():
                    if key not in self.dispatcher.apis:  # a Kafka 3.x ZooKeeper-mode node: no controller listener
                        self.dispatcher.register(key, api.handler, api.min_version, api.max_version)
        if self.is_broker:
            self.replicas = ReplicaManager(self)
        try:
            async with anyio.create_task_group() as tg:
                await self.http.start()
                for sasl in self.sasl.values():  # e.g. OAUTHBEARER's JWKS, fetched before any listener accepts
                    await tg.start(sasl.run)
                await self._listen(tg, controller=True)
                if self.controller_on_broker_listener and self.is_broker:
                    # Other nodes reach this node's controller on its broker listener: bound before the quorum starts,
                    # so that an election names it (Kafka 3.x's ZooKeeper mode started its socket server first too).
                    await self._listen(tg, controller=False)
                if self.migration is not None:
                    await self.migration.start(self, tg, lambda: self.quorum.controller_id == self.node_id)
                await self.quorum.start(self, tg)
                self._apply_dynamic_broker_config()
                if self.controller is not None:
                    tg.start_soon(self._controller_duties, self.controller)
                if self.is_broker:
                    await self._start_broker(tg)
                    log.info("josef broker %s ready on %s in %.2fs (process age %.2fs; cluster %s)", self.node_id,
                             self._describe_bound(), time.monotonic() - self.started_at, _process_age_s(),
                             self.cluster_id)
                else:
                    log.info("josef controller %s ready on %s in %.2fs (process age %.2fs; cluster %s)",
                             self.node_id, self._describe_bound(), time.monotonic() - self.started_at,
                             _process_age_s(), self.cluster_id)
                self.ready.set()
                task_status.started()
                await self._stop_requested.wait()
                if self.is_broker:
                    await self.lifecycle.controlled_shutdown()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._shutdown()

    def _migration_source(self) -> MetadataMigration | None:
        """The backend this controller's configuration migrates the cluster from (KIP-866), if any."""
        migration = configured_migration(self.pm, self.config)
        if migration is not None:
            log.info("migrating the cluster's metadata to KRaft: this controller mirrors its commits into the old "
                     "backend while it is the active controller")
        return migration

    def request_stop(self) -> None:
        """Stop cleanly: a controlled shutdown (leadership moved away while the node still runs), then close.

        Call on the broker's event loop. Cancelling :meth:`run` instead stops
        at once, without a controlled shutdown.
        """
        self._stop_requested.set()

    # The metadata listener (josef.metadata.quorum.MetadataListener) -------------------------

    def on_commit(self, offset: int, records: Sequence[MetadataRecord]) -> None:
        previous = self.image
        self.image, delta = previous.apply(offset, records)
        if self.migration is not None:
            self.migration.on_commit(offset, records, previous, self.image)
        self._published(delta)

    def on_snapshot(self, offset: int, records: Sequence[MetadataRecord]) -> None:
        previous = self.image
        self.image, _ = MetadataImage().apply(offset, records)
        self._published(self.image.changes_since(previous))

    def current_image(self) -> MetadataImage:
        return self.image

    def on_broker_session_end(self, broker_id: int, epoch: int) -> None:
        if self.controller is not None and self.controller.heartbeats.end(broker_id, epoch):
            log.info("broker %d (epoch %d) lost its session with the metadata quorum: fencing it", broker_id, epoch)

    def _published(self, delta: MetadataDelta) -> None:
        if delta.changed_acls and isinstance(self.authorizer, AclAuthorizer):
            self.authorizer.load_acls(self.image.acls)
        if (BROKER_RESOURCE, "") in delta.changed_configs or (BROKER_RESOURCE, str(self.node_id)) in delta.changed_configs:
            self._apply_dynamic_broker_config()
        if self._replicas_loaded:
            self.replicas.apply_delta(delta, self.image)
        if self._coordinating:
            self.coordinators.on_metadata(delta, self.image)

    def partitions_installed(self) -> None:
        """The replica manager hosts partitions whose logs finished opening: coordinators may now lead some."""
        if self._coordinating:
            self.coordinators.on_metadata(MetadataDelta(), self.image)

    async def _start_broker(self, tg: anyio.abc.TaskGroup) -> None:
        """Register with the active controller, then serve partitions once unfenced, as Kafka's BrokerServer does.

        Partitions are loaded only then: the unfencing heartbeat proves the
        image reached this broker's registration, so it holds every topic
        that existed, and logs it lacks are truly stray.
        """
        if not self.controller_on_broker_listener:
            await self._listen(tg, controller=False)
        await self.lifecycle.register()
        tg.start_soon(self.lifecycle.run)
        await self.lifecycle.unfenced.wait()
        self.replicas.load(self.image)
        self._replicas_loaded = True
        await tg.start(self.replicas.run)
        await tg.start(self.coordinators.run)
        self._coordinating = True
        self.coordinators.on_metadata(MetadataDelta(), self.image)
        self._plugin_tasks, pending = tg, self._plugin_tasks
        for function in pending:
            tg.start_soon(function)

    def spawn(self, function: Callable[[], Awaitable[None]]) -> None:
        """Run a plugin's background work (:meth:`josef.services.BrokerServices.spawn`) once the broker serves."""
        if isinstance(self._plugin_tasks, list):
            self._plugin_tasks.append(function)
        else:
            self._plugin_tasks.start_soon(function)

    async def _controller_duties(self, controller: Controller) -> None:
        """While this node is the active controller: finalize a new cluster's features, fence silent brokers, elect leaders, remove expired delegation tokens."""
        levels = bootstrap.levels(self.config, self.features)
        first_records = bootstrap.records(self.config)
        while True:
            if self.quorum.controller_id == self.node_id:
                try:
                    await controller.bootstrap(levels, first_records)
                    await controller.fence_expired_brokers()
                    await controller.elect_leaders_when_due()
                    await controller.expire_delegation_tokens_when_due()
                except ControllerError as exc:
                    log.debug("controller duties: %s", exc.message)
            else:
                controller.resign()
            await anyio.sleep(CONTROLLER_SWEEP_S)

    async def _allocate_producer_ids(self) -> ProducerIdBlock:
        response = await self.channel.call(ApiKey.ALLOCATE_PRODUCER_IDS,
                                           {"broker_id": self.node_id, "broker_epoch": self.lifecycle.epoch})
        if response.error_code != ErrorCode.none:
            raise ControllerError(response.error_code, f"the controller gave no producer ids: {response.error_code.name}")
        return ProducerIdBlock(self.node_id, response.producer_id_start, response.producer_id_len)

    def _is_controller_listener(self, name: str) -> bool:
        return name in self.config["controller.listener.names"]

    async def _listen(self, tg: anyio.abc.TaskGroup, *, controller: bool) -> None:
        for _, text, protocol in listener_security_protocols(self.config):
            spec = parse_listener(text)
            if self._is_controller_listener(spec.name) != controller:
                continue
            if controller and not self.is_controller:
                raise ConfigError(f"listener {spec.name} is a controller listener (controller.listener.names), "
                                  f"but process.roles has no controller")
            dispatcher = self.controller_dispatcher if controller else self.dispatcher
            listener = await network.bind(spec.host, spec.port)
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            self._listeners.append(listener)
            self.bound.append(Listener(spec.name, spec.host, port))
            tg.start_soon(network.serve_listener, listener, dispatcher, spec.name,
                          self.config["socket.request.max.bytes"], self.config["connections.max.idle.ms"], protocol,
                          self.tls.get(spec.name))

    def dispatcher_for(self, listener_name: str) -> Dispatcher:
        """The APIs a listener serves: the controller's on controller listeners, the broker's on the others."""
        return self.controller_dispatcher if self._is_controller_listener(listener_name) else self.dispatcher

    def client_listeners(self) -> list[Listener]:
        """The bound listeners that serve clients (not the controller's)."""
        return [l for l in self.bound if not self._is_controller_listener(l.name)]

    def _describe_bound(self) -> str:
        """The bound listeners, clients' first (tools and tests read the first PLAINTEXT address from the line)."""
        ordered = sorted(self.bound, key=lambda l: self._is_controller_listener(l.name))
        return ", ".join(f"{l.name}://{l.host}:{l.port}" for l in ordered)

    @property
    def inter_broker_listener(self) -> str:
        """The listener followers fetch from their leaders on: ``inter.broker.listener.name``, or the first client one."""
        return inter_broker_listener_name(self.config) or "PLAINTEXT"

    def broker_endpoints(self) -> list[Endpoint]:
        """The client listeners as advertised to clients (``advertised.listeners`` over the bound ones)."""
        return [e for e in self.endpoints() if not self._is_controller_listener(e.name)]

    def endpoints(self) -> list[Endpoint]:
        """Every bound listener as other nodes and clients reach it, controller listeners included, with its
        security protocol (``advertised.listeners`` over the bound address; a wildcard host becomes this host's name)."""
        advertised = [parse_listener(t) for t in (self.config["advertised.listeners"] or [])]
        protocols = {name: protocol for name, _, protocol in listener_security_protocols(self.config)}
        endpoints = []
        for bound in self.bound:
            spec = next((a for a in advertised if a.name == bound.name), bound)
            host = spec.host if spec.host not in ("", "0.0.0.0", "::") else socket.gethostname()
            endpoints.append(Endpoint(bound.name, host, spec.port or bound.port, protocols.get(bound.name, "PLAINTEXT")))
        return endpoints

    def _apply_dynamic_broker_config(self) -> None:
        definition = self.static_config.definition
        try:
            own, cluster = ({k: definition[k].parse(v) for k, v in self.image.config(BROKER_RESOURCE, name).items()}
                            for name in (str(self.node_id), ""))
        except (ConfigError, KeyError) as exc:
            log.error("ignoring dynamic broker configuration: %s", exc)
            return
        self.config = self.static_config.with_dynamic(own, cluster)
        for tls in self.tls.values():  # ssl.* or listener.name.<l>.ssl.* updates: re-read the stores (Kafka's reload)
            tls.reload(self.config)
        if self.is_broker and hasattr(self, "replicas"):
            self.replicas.apply_broker_config(self.config, self.image)

    async def _shutdown(self) -> None:
        for listener in self._listeners:
            await listener.aclose()
        self.coordinators.close()
        await self.channel.close()
        await self.peers.close()
        if self.migration is not None:
            await self.migration.close()
        if hasattr(self, "quorum"):
            await self.quorum.close()
        if hasattr(self, "replicas"):
            self.replicas.close()
        await self.http.close()
        log.info("josef %s %s stopped", "broker" if self.is_broker else "controller", self.node_id)
