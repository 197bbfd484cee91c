"""Registers the ZooKeeper metadata quorum, Kafka 3.x's ``zookeeper.*`` configuration keys and ``josef zookeeper-shell``."""

from __future__ import annotations

import click

from josef import hookimpl
from josef.config import ConfigKey, ConfigType, at_least
from josef.hookspecs import Register
from josef_metadata_zk.shell import zookeeper_shell
from josef_metadata_zk.zk_quorum import ZooKeeperQuorum

#: The plugin API versions this plugin works with (checked when the plugin manager loads it).
JOSEF_PLUGIN_API = ">=1.5,<2"  # 1.5: MetadataListener.endpoints, metadata.log.max.record.bytes.between.snapshots


@hookimpl
def register_metadata_quorum(register: Register) -> None:
    register("zookeeper", ZooKeeperQuorum)


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


@hookimpl
def register_commands(cli: click.Group) -> None:
    cli.add_command(zookeeper_shell)
