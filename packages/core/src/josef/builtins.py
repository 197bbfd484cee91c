"""The core's own hook implementations, registered before any plugin."""

from __future__ import annotations

from josef.authorizer import AllowAll
from josef.broker_config import CORE_KEYS
from josef.client.partitioner import Murmur2Partitioner, RoundRobinPartitioner
from josef.hookspecs import Register, hookimpl


@hookimpl
def register_configs(register: Register) -> None:
    for key in CORE_KEYS:
        register(key)


@hookimpl
def register_authorizers(register: Register) -> None:
    register("allow-all", AllowAll)


@hookimpl
def register_partitioners(register: Register) -> None:
    register("murmur2", Murmur2Partitioner)
    register("round-robin", RoundRobinPartitioner)


@hookimpl
def register_commands(cli) -> None:  # type: ignore[no-untyped-def]  # a click.Group
    """josef's Kafka-style tools: topics, configs, console-producer, console-consumer, perf."""
    from josef.commands import register

    register(cli)


@hookimpl
def register_assignors(register: Register) -> None:
    """The classic protocol's client-side assignors, as Kafka's Java client names them."""
    from josef.client.assignors import (
        CooperativeStickyAssignor,
        RangeAssignor,
        RoundRobinAssignor,
        StickyAssignor,
    )

    for assignor in (RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor):
        register(assignor.name, assignor)
