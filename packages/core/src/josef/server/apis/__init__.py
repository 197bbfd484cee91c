"""The Kafka APIs the core answers, one module per family."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from josef.protocol import fetch_codec, produce_codec
from josef.protocol.api_keys import ApiKey
from josef.server.apis import (
    acls,
    admin,
    authentication,
    alter_partition,
    api_versions,
    brokers,
    client_quotas,
    cluster,
    config_resources,
    configs,
    delegation_tokens,
    elect_leaders,
    envelope,
    features,
    fetch,
    log_dirs,
    offsets,
    produce,
    producer,
    producers,
    reassignments,
    scram_credentials,
    telemetry,
    topic_partitions,
    txn_markers,
)
from josef.server.dispatch import Dispatcher, Handler, RequestContext

#: (API key, handler, lowest version, highest version) the controller answers: Kafka's ControllerApis.
CONTROLLER_APIS = (
    (ApiKey.API_VERSIONS, api_versions.api_versions, 0, 4),
    # A SASL controller listener (Kafka's ControllerApis answers these too); the broker registers its own below.
    (ApiKey.SASL_HANDSHAKE, authentication.sasl_handshake, 0, 1),
    (ApiKey.SASL_AUTHENTICATE, authentication.sasl_authenticate, 0, 2),
    (ApiKey.CREATE_TOPICS, admin.create_topics, 2, 7),
    (ApiKey.DELETE_TOPICS, admin.delete_topics, 1, 6),
    (ApiKey.ALTER_CONFIGS, configs.alter_configs, 0, 2),
    (ApiKey.CREATE_PARTITIONS, admin.create_partitions, 0, 3),
    (ApiKey.INCREMENTAL_ALTER_CONFIGS, configs.incremental_alter_configs, 0, 1),
    (ApiKey.ELECT_LEADERS, elect_leaders.elect_leaders, 0, 2),
    (ApiKey.ALTER_PARTITION_REASSIGNMENTS, reassignments.alter_partition_reassignments, 0, 1),
    (ApiKey.LIST_PARTITION_REASSIGNMENTS, reassignments.list_partition_reassignments, 0, 0),
    (ApiKey.ALTER_CLIENT_QUOTAS, client_quotas.alter_client_quotas, 0, 1),
    (ApiKey.CREATE_ACLS, acls.create_acls, 1, 3),
    (ApiKey.DELETE_ACLS, acls.delete_acls, 1, 3),
    (ApiKey.DESCRIBE_ACLS, acls.describe_acls, 1, 3),
    (ApiKey.ALTER_USER_SCRAM_CREDENTIALS, scram_credentials.alter_user_scram_credentials, 0, 0),
    (ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, scram_credentials.describe_user_scram_credentials, 0, 0),
    (ApiKey.CREATE_DELEGATION_TOKEN, delegation_tokens.controller_create_delegation_token, 1, 3),
    (ApiKey.RENEW_DELEGATION_TOKEN, delegation_tokens.controller_renew_delegation_token, 1, 2),
    (ApiKey.EXPIRE_DELEGATION_TOKEN, delegation_tokens.controller_expire_delegation_token, 1, 2),
    (ApiKey.DESCRIBE_CLUSTER, cluster.describe_cluster, 0, 2),
    (ApiKey.UPDATE_FEATURES, features.update_features, 0, 2),
    (ApiKey.BROKER_REGISTRATION, brokers.broker_registration, 0, 4),
    (ApiKey.BROKER_HEARTBEAT, brokers.broker_heartbeat, 0, 1),
    (ApiKey.ALLOCATE_PRODUCER_IDS, brokers.allocate_producer_ids, 0, 0),
    (ApiKey.ASSIGN_REPLICAS_TO_DIRS, brokers.assign_replicas_to_dirs, 0, 0),
    (ApiKey.ALTER_PARTITION, alter_partition.alter_partition, 2, 3),
    (ApiKey.ENVELOPE, envelope.envelope, 0, 0),
)

#: Admin requests a broker passes to the active controller (in an Envelope) and answers with its response.
FORWARDED = envelope.ENVELOPED - envelope.QUORUM_APIS_ON_BROKERS - envelope.CHECKED_BEFORE_FORWARDING
async def forward(ctx: RequestContext, request: Any) -> Any:
    """A client's admin request, decided by the active controller (Kafka's ForwardingManager)."""
    return await ctx.broker.channel.forward(ctx, request)


#: (API key, handler, lowest version, highest version) the broker answers; capped by what kio knows.
CORE_APIS = tuple((key, forward if key in FORWARDED else handler, low, high) for key, handler, low, high in (
    (ApiKey.PRODUCE, produce.produce, 3, 13),
    (ApiKey.FETCH, fetch.fetch, 4, 18),
    (ApiKey.LIST_OFFSETS, offsets.list_offsets, 1, 11),
    (ApiKey.METADATA, cluster.metadata, 0, 13),
    (ApiKey.DELETE_RECORDS, offsets.delete_records, 0, 2),
    (ApiKey.INIT_PRODUCER_ID, producer.init_producer_id, 0, 5),
    (ApiKey.WRITE_TXN_MARKERS, txn_markers.write_txn_markers, 1, 2),
    (ApiKey.OFFSET_FOR_LEADER_EPOCH, offsets.offset_for_leader_epoch, 2, 4),
    (ApiKey.DESCRIBE_CONFIGS, configs.describe_configs, 1, 4),
    (ApiKey.LIST_CONFIG_RESOURCES, config_resources.list_config_resources, 0, 1),
    (ApiKey.DESCRIBE_PRODUCERS, producers.describe_producers, 0, 0),
    (ApiKey.DESCRIBE_TOPIC_PARTITIONS, topic_partitions.describe_topic_partitions, 0, 0),
    (ApiKey.SASL_HANDSHAKE, authentication.sasl_handshake, 0, 1),
    (ApiKey.SASL_AUTHENTICATE, authentication.sasl_authenticate, 0, 2),
    (ApiKey.DESCRIBE_CLIENT_QUOTAS, client_quotas.describe_client_quotas, 0, 1),
    (ApiKey.DESCRIBE_LOG_DIRS, log_dirs.describe_log_dirs, 1, 5),
    (ApiKey.ALTER_REPLICA_LOG_DIRS, log_dirs.alter_replica_log_dirs, 1, 2),
    # Refused on the client's own connection when it cannot hold a token (Kafka's allowTokenRequests), else forwarded.
    (ApiKey.CREATE_DELEGATION_TOKEN, delegation_tokens.create_delegation_token, 1, 3),
    (ApiKey.RENEW_DELEGATION_TOKEN, delegation_tokens.renew_delegation_token, 1, 2),
    (ApiKey.EXPIRE_DELEGATION_TOKEN, delegation_tokens.expire_delegation_token, 1, 2),
    (ApiKey.DESCRIBE_DELEGATION_TOKEN, delegation_tokens.describe_delegation_token, 1, 3),
    *(api for api in CONTROLLER_APIS
      if api[0] in FORWARDED or api[0] in (ApiKey.API_VERSIONS, ApiKey.DESCRIBE_CLUSTER, ApiKey.DESCRIBE_ACLS,
                                           ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS)),
))

#: Core APIs a coordinator plugin may answer instead (``Coordinator.apis``): the transaction
#: coordinator takes InitProducerId over, answering transactional ids as well as idempotent producers.
#: Each maps to the core's own handler, which the plugin may hand the requests it leaves to the core
#: (:meth:`josef.services.BrokerServices.core_handler`).
TAKEOVER_APIS: Mapping[int, Handler] = MappingProxyType({ApiKey.INIT_PRODUCER_ID: producer.init_producer_id})

#: Client telemetry (KIP-714): advertised, as Kafka does, only when a receiver is installed, so
#: clients of a broker that would discard their metrics never collect or push them.
TELEMETRY_APIS = (
    (ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, telemetry.get_telemetry_subscriptions, 0, 0),
    (ApiKey.PUSH_TELEMETRY, telemetry.push_telemetry, 0, 0),
)


#: The APIs read by josef's own codecs instead of kio (see :mod:`josef.server.dispatch`).
DECODERS = {ApiKey.PRODUCE: produce_codec.decode_request, ApiKey.FETCH: fetch_codec.decode_request}


def register_broker_apis(dispatcher: Dispatcher, *, telemetry_receivers: bool) -> None:
    for key, handler, low, high in CORE_APIS + (TELEMETRY_APIS if telemetry_receivers else ()):
        dispatcher.register(key, handler, low, high, decode=DECODERS.get(key))


def register_controller_apis(dispatcher: Dispatcher) -> None:
    for key, handler, low, high in CONTROLLER_APIS:
        dispatcher.register(key, handler, low, high)
