"""A broker's registration and heartbeats: Kafka's BrokerLifecycleManager.

A broker registers with the active controller (getting a broker epoch),
then heartbeats every ``broker.heartbeat.interval.ms`` with the metadata
offset it has applied. The controller unfences it once that offset reaches
its registration, fences it when heartbeats stop for
``broker.session.timeout.ms``, and on a clean stop moves its leadership
away before telling it to shut down (controlled shutdown).

It names its log directories by their ``directory.id`` (KIP-858): the
online ones in the registration, the failed ones in every heartbeat, the
first heartbeat after a failure going out at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
from kio.schema.errors import ErrorCode

from josef.metadata import meta_properties
from josef.config import ConfigError
from josef.node.controller_channel import ControllerChannel, ControllerUnavailableError
from josef.metadata.records import SECURITY_PROTOCOLS, random_uuid, uuid_from_text
from josef.protocol.api_keys import ApiKey

if TYPE_CHECKING:
    from josef.node.broker import Broker

log = logging.getLogger(__name__)

#: Registration errors no retry can mend: the broker stops.
FATAL = frozenset({ErrorCode.inconsistent_cluster_id, ErrorCode.unsupported_version,
                   ErrorCode.invalid_registration})
#: How long a clean stop waits for the controller to agree (Kafka bounds it by its shutdown timeout).
CONTROLLED_SHUTDOWN_TIMEOUT_S = 10.0


class BrokerLifecycle:
    def __init__(self, node: Broker, channel: ControllerChannel) -> None:
        self._node = node
        self._channel = channel
        self.incarnation_id = random_uuid()
        self.epoch = -1
        self.fenced = True
        self.unfenced = anyio.Event()
        self._interval = node.config["broker.heartbeat.interval.ms"] / 1000
        self._directory_ids: dict[str, str] = {}
        self._wake = anyio.Event()

    def report_offline_dirs(self) -> None:
        """A log directory failed: heartbeat now rather than at the next interval. Call on the event loop."""
        self._wake.set()

    def _dir_ids(self, offline: bool) -> list[Any]:
        failed = set(self._node.storage.offline_dirs())
        return [uuid_from_text(i) for path, i in self._directory_ids.items() if (path in failed) == offline]

    async def register(self) -> None:
        """Register until the controller accepts; raises ConfigError for a registration it can never accept."""
        node = self._node
        self._directory_ids = meta_properties.directory_ids(node.config)
        body = {
            "broker_id": node.node_id, "cluster_id": node.cluster_id, "incarnation_id": self.incarnation_id,
            "listeners": [{"name": e.name, "host": e.host, "port": e.port,
                           "security_protocol": SECURITY_PROTOCOLS[e.security_protocol]}
                          for e in node.broker_endpoints()],
            "features": [{"name": n, "min_supported_version": f.min_level, "max_supported_version": f.max_level}
                         for n, f in sorted(node.features.items())],
            "rack": node.config["broker.rack"],
            "is_migrating_zk_broker": False, "log_dirs": self._dir_ids(offline=False),
            # KIP-966: the epoch of this process's registration, else the one the last clean stop recorded (-1: unclean).
            "previous_broker_epoch": self.epoch if self.epoch != -1 else node.storage.clean_shutdown_epoch(),
        }
        while True:
            try:
                response = await self._channel.call(ApiKey.BROKER_REGISTRATION, body)
            except ControllerUnavailableError as exc:
                log.warning("broker %d cannot register yet: %s", node.node_id, exc)
                continue
            if response.error_code == ErrorCode.none:
                self.epoch = response.broker_epoch
                log.info("broker %d registered with broker epoch %d", node.node_id, self.epoch)
                return
            if response.error_code in FATAL:
                raise ConfigError(f"the controller refused to register broker {node.node_id}: "
                                  f"{response.error_code.name}")
            log.warning("broker %d registration: %s; trying again", node.node_id, response.error_code.name)
            await anyio.sleep(self._interval)

    async def _heartbeat(self, want_shut_down: bool = False, timeout_s: float | None = None) -> Any:
        response = await self._channel.call(ApiKey.BROKER_HEARTBEAT, {
            "broker_id": self._node.node_id, "broker_epoch": self.epoch,
            "current_metadata_offset": self._node.image.offset, "want_fence": False,
            "want_shut_down": want_shut_down, "offline_log_dirs": self._dir_ids(offline=True)}, timeout_s=timeout_s)
        if response.error_code in (ErrorCode.stale_broker_epoch, ErrorCode.broker_id_not_registered):
            # The controller no longer knows this registration (a new cluster, a lost session): start again.
            log.warning("broker %d heartbeat: %s; registering again", self._node.node_id, response.error_code.name)
            self.fenced = True
            await self.register()
        elif response.error_code == ErrorCode.none:
            if response.is_fenced != self.fenced:
                log.info("broker %d is %s", self._node.node_id, "fenced" if response.is_fenced else "unfenced")
            self.fenced = response.is_fenced
            if not self.fenced:
                self.unfenced.set()
        return response

    async def run(self) -> None:
        """Heartbeat until cancelled; the first one right away, so a caught-up broker is unfenced at once."""
        while True:
            try:
                await self._heartbeat()
            except ControllerUnavailableError as exc:
                log.warning("broker %d heartbeat: %s", self._node.node_id, exc)
            # A fenced broker asks again soon: it is waiting to be let in.
            with anyio.move_on_after(self._interval if not self.fenced else min(self._interval, 0.05)):
                await self._wake.wait()
            self._wake = anyio.Event()

    async def controlled_shutdown(self) -> None:
        """Ask to shut down until the controller has moved this broker's leadership away (bounded in time).

        Without an active controller (the whole cluster stopping, a quorum
        lost) there is nobody to agree with: the broker stops at once.
        """
        with anyio.move_on_after(CONTROLLED_SHUTDOWN_TIMEOUT_S) as scope:
            while True:
                if self._node.quorum.controller_id < 0:
                    log.warning("broker %d: no active controller; stopping without a controlled shutdown",
                                self._node.node_id)
                    return
                try:
                    response = await self._heartbeat(want_shut_down=True, timeout_s=self._interval)
                except ControllerUnavailableError:
                    continue
                if response.error_code == ErrorCode.none and response.should_shut_down:
                    log.info("broker %d: controlled shutdown complete", self._node.node_id)
                    return
                await anyio.sleep(0.05)
        if scope.cancelled_caught:
            log.warning("broker %d: controlled shutdown did not complete in %.0f s; stopping anyway",
                        self._node.node_id, CONTROLLED_SHUTDOWN_TIMEOUT_S)
