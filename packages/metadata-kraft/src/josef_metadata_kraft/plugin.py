"""Registers the KRaft quorum, its configuration keys and the ``josef storage`` commands."""

from __future__ import annotations

import click

from josef import hookimpl
from josef.config import ConfigKey, ConfigType
from josef.hookspecs import Register
from josef_metadata_kraft.commands import storage
from josef_metadata_kraft.quorum import SingleVoterQuorum


@hookimpl
def register_metadata_quorum(register: Register) -> None:
    register("kraft", SingleVoterQuorum)


@hookimpl
def register_configs(register: Register) -> None:
    register(ConfigKey("controller.quorum.voters", ConfigType.LIST, None,
                       "The KRaft voters, ID@HOST:PORT,...; empty means this node alone."))


@hookimpl
def register_commands(cli: click.Group) -> None:
    cli.add_command(storage)
