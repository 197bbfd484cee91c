"""The Kafka APIs the core answers, one module per family."""

from __future__ import annotations

from josef.server.apis import (
    admin,
    api_versions,
    cluster,
    configs,
    fetch,
    offsets,
    produce,
    producer,
)
from josef.server.dispatch import Dispatcher

#: (API key, handler, lowest version, highest version) the core answers; capped by what kio knows.
CORE_APIS = (
    (0, produce.produce, 3, 13),
    (1, fetch.fetch, 4, 18),
    (2, offsets.list_offsets, 1, 11),
    (3, cluster.metadata, 0, 13),
    (18, api_versions.api_versions, 0, 4),
    (19, admin.create_topics, 2, 7),
    (20, admin.delete_topics, 1, 6),
    (21, offsets.delete_records, 0, 2),
    (22, producer.init_producer_id, 0, 5),
    (23, offsets.offset_for_leader_epoch, 2, 4),
    (32, configs.describe_configs, 1, 4),
    (33, configs.alter_configs, 0, 2),
    (37, admin.create_partitions, 0, 3),
    (44, configs.incremental_alter_configs, 0, 1),
    (60, cluster.describe_cluster, 0, 2),
)


def register_core_apis(dispatcher: Dispatcher) -> None:
    for key, handler, low, high in CORE_APIS:
        dispatcher.register(key, handler, low, high)
