"""The client's hook implementations, found through the ``josef`` entry point like any plugin's.

Producers, consumers and the group coordinator build their plugin manager
from the entry points, so installing ``josef-client`` is what makes its
partitioners and assignors selectable by name, and adds its tools to the
``josef`` command.
"""

from __future__ import annotations

import click

from josef.hookspecs import Register, hookimpl
from josef_client.assignors import (
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
)
from josef_client.partitioner import Murmur2Partitioner, RoundRobinPartitioner

#: The plugin API versions this plugin works with (checked when the plugin manager loads it).
JOSEF_PLUGIN_API = ">=1.4,<2"


@hookimpl
def register_partitioners(register: Register) -> None:
    register("murmur2", Murmur2Partitioner)
    register("round-robin", RoundRobinPartitioner)


@hookimpl
def register_assignors(register: Register) -> None:
    """The classic protocol's client-side assignors, as Kafka's Java client names them."""
    for assignor in (RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor):
        register(assignor.name, assignor)


@hookimpl
def register_commands(cli: click.Group) -> None:
    """The Kafka-style tools: topics, configs, console-producer, console-consumer, perf, consumer-groups, transactions...

    and ``cluster status``, added to the core's ``cluster`` group (where ``cluster start`` runs a local cluster).
    """
    from josef_client.commands import register
    from josef_client.commands.client_metrics import client_metrics
    from josef_client.commands.cluster_status import cluster_status
    from josef_client.commands.leader_election import leader_election
    from josef_client.commands.metadata_quorum import metadata_quorum
    from josef_client.commands.reassign_partitions import reassign_partitions

    register(cli)
    for command in (metadata_quorum, leader_election, reassign_partitions, client_metrics):
        cli.add_command(command)
    cluster = cli.commands.get("cluster")
    if isinstance(cluster, click.Group):  # a core without the group has nowhere to put it
        cluster.add_command(cluster_status)
