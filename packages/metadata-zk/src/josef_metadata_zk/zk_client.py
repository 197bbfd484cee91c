"""How a node talks to ZooKeeper: Kafka 3.x's ``zookeeper.*`` client keys turned into a kazoo client.

- ``zookeeper.session.timeout.ms`` and ``zookeeper.connection.timeout.ms``:
  the session asked for, and how long start-up waits to connect;
- ``zookeeper.max.in.flight.requests``: how many requests a node sends
  before it waits for their answers (:func:`pipelined`);
- ``zookeeper.ssl.*`` (KIP-515): TLS to the ensemble's ``secureClientPort``
  when ``zookeeper.ssl.client.enable`` is true, with PEM key and trust
  stores (kazoo reads PEM files; Kafka's JKS and PKCS12 are refused with a
  way out); the key store, when given, is this node's certificate for an
  ensemble that asks for one (``ssl.clientAuth``), and with it ZooKeeper's
  x509 provider authenticates the node (``zookeeper.ssl.protocol``,
  ``.enabled.protocols``, ``.cipher.suites``, ``.crl.enable`` and
  ``.ocsp.enable`` are not declared: kazoo takes Python's defaults, and the
  broker lists them among the keys it ignores);
- ``zookeeper.set.acl``: the znodes a node creates get Kafka's secure ACL,
  all rights to the identity that created them and read to anyone, so
  only the cluster's own nodes change its metadata; that needs an
  authenticated session, which here is a TLS client certificate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import anyio
import anyio.to_thread
import attrs
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult
from kazoo.security import ACL, CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE

from josef.config import Config, ConfigError

#: Kafka's secure ACL (ZkData.defaultAcls with zookeeper.set.acl): the session's authenticated identities may do
#: anything, the world may read.
SECURE_ACL: tuple[ACL, ...] = (*CREATOR_ALL_ACL, *READ_ACL_UNSAFE)
_PEM = "PEM"


@attrs.frozen
class ZooKeeperClientSettings:
    """What :func:`client` needs of a node's configuration."""

    hosts: str
    session_s: float
    connection_s: float
    max_in_flight: int
    acl: tuple[ACL, ...]
    tls: dict[str, Any]

    @classmethod
    def from_config(cls, config: Config, hosts: str) -> ZooKeeperClientSettings:
        session_ms = config["zookeeper.session.timeout.ms"]
        connection_ms = config["zookeeper.connection.timeout.ms"]
        tls = _tls_options(config) if config["zookeeper.ssl.client.enable"] else {}
        if config["zookeeper.set.acl"] and not tls.get("certfile"):
            raise ConfigError("zookeeper.set.acl=true needs an authenticated ZooKeeper session: here, TLS with a client "
                              "certificate (zookeeper.ssl.client.enable=true and zookeeper.ssl.keystore.location)")
        return cls(hosts=hosts, session_s=session_ms / 1000,
                   connection_s=(connection_ms if connection_ms is not None else session_ms) / 1000,
                   max_in_flight=config["zookeeper.max.in.flight.requests"],
                   acl=SECURE_ACL if config["zookeeper.set.acl"] else tuple(OPEN_ACL_UNSAFE), tls=tls)

    def client(self) -> KazooClient:
        """A kazoo client, not started; every znode it creates gets :attr:`acl`."""
        return KazooClient(hosts=self.hosts, timeout=self.session_s, default_acl=list(self.acl), **self.tls)

    def connect(self, where: str) -> KazooClient:
        """A started client; a clear error naming ``zookeeper.connect`` (``where``) when the ensemble cannot be
        reached within ``zookeeper.connection.timeout.ms``."""
        zk = self.client()
        try:
            zk.start(timeout=self.connection_s)
        except KazooTimeoutError:
            zk.close()
            tls = " over TLS (zookeeper.ssl.client.enable)" if self.tls else ""
            raise ConfigError(f"cannot reach ZooKeeper at zookeeper.connect={where}{tls} within "
                              f"{self.connection_s * 1000:.0f} ms (zookeeper.connection.timeout.ms)") from None
        return zk


def stop(zk: KazooClient) -> None:
    """End the session (its ephemeral znodes go at once) and release the client."""
    try:
        zk.stop()
    finally:
        zk.close()


async def stop_in_thread(zk: KazooClient | None) -> None:
    """:func:`stop` from the event loop, in a worker thread, even while the caller is being cancelled."""
    if zk is not None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(stop, zk)


def _tls_options(config: Config) -> dict[str, Any]:
    for kind in ("keystore", "truststore"):
        store_type = (config[f"zookeeper.ssl.{kind}.type"] or _PEM).upper()
        if config[f"zookeeper.ssl.{kind}.location"] and store_type != _PEM:
            raise ConfigError(f"zookeeper.ssl.{kind}.type={store_type}: josef's ZooKeeper client reads PEM stores only "
                              f"(set zookeeper.ssl.{kind}.type=PEM; convert with "
                              f"`openssl pkcs12 -in store.p12 -nodes -out store.pem`)")
    truststore = config["zookeeper.ssl.truststore.location"]
    if not truststore:
        raise ConfigError("zookeeper.ssl.client.enable=true needs zookeeper.ssl.truststore.location (PEM): the "
                          "authorities that signed the ensemble's certificates")
    algorithm = (config["zookeeper.ssl.endpoint.identification.algorithm"] or "").strip().lower()
    if algorithm not in ("", "https"):
        raise ConfigError(f"zookeeper.ssl.endpoint.identification.algorithm must be HTTPS or empty, not {algorithm}")
    options: dict[str, Any] = {"use_ssl": True, "ca": truststore, "verify_certs": True,
                               "check_hostname": algorithm == "https"}
    keystore = config["zookeeper.ssl.keystore.location"]
    if keystore:  # one PEM file with the key and its certificate chain, as Kafka's PEM key stores are
        options.update(certfile=keystore, keyfile=keystore, keyfile_password=config["zookeeper.ssl.keystore.password"])
    return options


def pipelined(calls: Iterable[Callable[[], IAsyncResult]], limit: int) -> Iterator[IAsyncResult]:
    """The answers of ``calls`` (each sends one request), in order, with at most ``limit`` of them sent and not yet
    taken (``zookeeper.max.in.flight.requests``): the next is sent once the caller took the answer ``limit`` before."""
    pending: deque[IAsyncResult] = deque()
    for call in calls:
        if len(pending) >= limit:
            yield pending.popleft()
        pending.append(call())
    yield from pending
