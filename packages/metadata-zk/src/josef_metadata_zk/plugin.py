"""Registers the ZooKeeper metadata quorum, Kafka 3.x's ``zookeeper.*`` configuration keys and ``josef zookeeper-shell``."""

from __future__ import annotations

import click

from josef import hookimpl
from josef.config import ConfigKey, ConfigType, at_least
from josef.hookspecs import Register
from josef_metadata_zk.migration import migration_from_zookeeper
from josef_metadata_zk.shell import zookeeper_shell
from josef_metadata_zk.zk_quorum import ZooKeeperQuorum

#: The plugin API versions this plugin works with (checked when the plugin manager loads it).
#: 1.5: MetadataListener.endpoints and on_broker_session_end, metadata.log.max.record.bytes.between.snapshots.
JOSEF_PLUGIN_API = ">=1.5,<2"


@hookimpl
def register_metadata_quorum(register: Register) -> None:
    register("zookeeper", ZooKeeperQuorum)


@hookimpl
def register_metadata_migrations(register: Register) -> None:
    register("zookeeper", migration_from_zookeeper)


@hookimpl
def register_configs(register: Register) -> None:
    register(ConfigKey("zookeeper.connect", ConfigType.STRING, None,
                       "The ZooKeeper ensemble, host:port[,host:port...][/chroot]; the chroot is created when missing."))
    register(ConfigKey("zookeeper.session.timeout.ms", ConfigType.INT, 18000,
                       "The ZooKeeper session timeout: a node silent this long loses its session, its registration "
                       "and, if it was the active controller, the controllership.", at_least(1)))
    register(ConfigKey("zookeeper.connection.timeout.ms", ConfigType.INT, None,
                       "How long a node waits to connect to ZooKeeper at start-up; unset: the session timeout.",
                       at_least(1)))
    register(ConfigKey("zookeeper.max.in.flight.requests", ConfigType.INT, 10,
                       "How many requests a node sends to ZooKeeper before it waits for their answers.", at_least(1)))
    register(ConfigKey("zookeeper.set.acl", ConfigType.BOOLEAN, False,
                       "Create znodes with Kafka's secure ACL: all rights to the node's authenticated identity (a TLS "
                       "client certificate), read to anyone."))
    register(ConfigKey("zookeeper.ssl.client.enable", ConfigType.BOOLEAN, False,
                       "Connect to ZooKeeper over TLS (the ensemble's secureClientPort), with the zookeeper.ssl.* keys."))
    register(ConfigKey("zookeeper.clientCnxnSocket", ConfigType.STRING, None,
                       "Java's ZooKeeper client socket class (ClientCnxnSocketNetty for TLS); accepted for Kafka's "
                       "properties files, unused here: zookeeper.ssl.client.enable turns TLS on."))
    for kind, what in (("keystore", "this node's key and certificate chain in one file, for an ensemble that asks for "
                                    "client certificates"),
                       ("truststore", "the certificates of the authorities that signed the ensemble's")):
        register(ConfigKey(f"zookeeper.ssl.{kind}.location", ConfigType.STRING, None, f"A PEM file: {what}."))
        register(ConfigKey(f"zookeeper.ssl.{kind}.password", ConfigType.PASSWORD, None,
                           f"The password of zookeeper.ssl.{kind}.location (of the key, for PEM)."))
        register(ConfigKey(f"zookeeper.ssl.{kind}.type", ConfigType.STRING, None,
                           f"The format of zookeeper.ssl.{kind}.location: PEM (JKS and PKCS12 are refused)."))
    register(ConfigKey("zookeeper.metadata.migration.enable", ConfigType.BOOLEAN, False,
                       "On a KRaft controller: the cluster is migrating from the ZooKeeper ensemble of "
                       "zookeeper.connect (josef metadata migrate); the active controller is the one ZooKeeper's "
                       "brokers reach, and mirrors every metadata commit into ZooKeeper until this is turned off."))
    register(ConfigKey("zookeeper.ssl.endpoint.identification.algorithm", ConfigType.STRING, "HTTPS",
                       "HTTPS: check the ZooKeeper server's host name against its certificate; empty: do not."))


@hookimpl
def register_commands(cli: click.Group) -> None:
    cli.add_command(zookeeper_shell)
