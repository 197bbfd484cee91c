"""Registers the KRaft quorum, its configuration keys, and the ``josef storage`` and ``josef metadata`` commands."""

from __future__ import annotations

import click

from josef import hookimpl
from josef.config import ConfigKey, ConfigType, at_least
from josef.hookspecs import Register
from josef_metadata_kraft.commands import storage
from josef_metadata_kraft.kraft_quorum import KRaftQuorum
from josef_metadata_kraft.migrate import metadata

#: The plugin API versions this plugin works with (checked when the plugin manager loads it).
JOSEF_PLUGIN_API = ">=1.5,<2"  # 1.5: metadata.log.max.record.bytes.between.snapshots is the core's


@hookimpl
def register_metadata_quorum(register: Register) -> None:
    register("kraft", KRaftQuorum)


@hookimpl
def register_configs(register: Register) -> None:
    register(ConfigKey("controller.quorum.voters", ConfigType.LIST, None,
                       "The KRaft voters, ID@HOST:PORT,... (their controller listeners); empty means this node alone, "
                       "reached in-process."))
    register(ConfigKey("controller.quorum.bootstrap.servers", ConfigType.LIST, None,
                       "HOST:PORT,... of controllers to find a dynamic quorum (KIP-853) through, when "
                       "controller.quorum.voters is not set; the voters then come from the metadata log."))
    for name, default, doc in (
        ("controller.quorum.election.timeout.ms", 1000,
         "How long a voter waits without hearing from a leader before it starts an election (randomised up to twice)."),
        ("controller.quorum.election.backoff.max.ms", 1000, "The longest back-off after a lost election."),
        ("controller.quorum.fetch.timeout.ms", 2000,
         "How long a follower goes without a successful fetch before it looks for a new leader."),
        ("controller.quorum.request.timeout.ms", 2000, "How long a Raft request waits for its response."),
        ("controller.quorum.retry.backoff.ms", 20, "How long to wait before sending a failed Raft request again."),
    ):
        register(ConfigKey(name, ConfigType.INT, default, doc, at_least(0)))


@hookimpl
def register_commands(cli: click.Group) -> None:
    cli.add_command(storage)
    cli.add_command(metadata)
