"""The contracts between josef's core and its plugins.

Every extension point of josef is one of these pluggy hooks. A plugin is a
module with ``@hookimpl`` functions, published through the ``josef`` entry-point
group; the core registers its own built-ins through the same hooks, so a
built-in and a third-party implementation are on equal footing.

Most hooks follow one pattern: the hook receives a ``register(name, obj)``
callable and calls it once per implementation it offers. Implementations are
then *selected by name* from configuration (``log.storage=local``), so a
deployment states what it wants and a typo fails with the list of what is
installed (see :mod:`josef.plugins`).

Threading rule for every ``register_*`` hook: it is called once per plugin
manager, synchronously, while the broker, client or CLI is being assembled and
before any event loop work starts. Hooks must not block or do I/O; the
objects they register are constructed later, by the caller that selects them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    import click

hookspec = pluggy.HookspecMarker("josef")
hookimpl = pluggy.HookimplMarker("josef")

Register = Callable[[str, Any], None]


@hookspec
def register_log_storage(register: Register) -> None:
    """Offer log storage backends for partition data.

    Called when a broker is assembled. Call ``register(name, factory)`` for
    each backend; ``factory(config)`` receives the broker's
    :class:`josef.config.Config` and returns a :class:`josef.log.LogStorage`.
    The broker selects one with ``log.storage`` (default ``local``).
    Returns nothing.
    """


@hookspec
def register_log_storage_layers(register: Register) -> None:
    """Offer layers over the selected log storage, as tiered storage layers over local storage.

    Called when a broker is assembled, once ``log.storage`` has built its
    backend. Call ``register(name, factory)``; ``factory(storage, config,
    services)`` receives the :class:`josef.log.LogStorage` built so far,
    the broker's :class:`josef.config.Config` and its
    :class:`josef.services.BrokerServices`, and returns a ``LogStorage``
    that wraps ``storage`` (its logs wrapping ``storage``'s), or None when
    ``config`` does not turn the layer on (tiered storage:
    ``remote.log.storage.system.enable``). Every registered layer is asked,
    in the order of their names, each over what the one before returned.
    A layer reaches the storage under it only through the contract, so it
    composes over any backend. The metadata quorum keeps its own log in the
    bottom storage, never in a layer. Returns nothing.
    """


@hookspec
def register_metadata_quorum(register: Register) -> None:
    """Offer metadata quorum backends (KRaft, ZooKeeper, ...).

    Called when a broker is assembled. Call ``register(name, factory)`` for
    each backend; ``factory(config, log_storage)`` receives the broker's
    :class:`josef.config.Config` and its :class:`josef.log.LogStorage` (a
    backend may keep its own log there) and returns a
    :class:`josef.metadata.quorum.MetadataQuorum`. Selected with
    ``metadata.quorum`` (default ``kraft``). Returns nothing.
    """


@hookspec
def register_metadata_migrations(register: Register) -> None:
    """Offer a metadata backend as the source of a migration to KRaft (KIP-866; ZooKeeper's).

    Called when a node with the controller role is assembled, and by
    ``josef metadata migrate``. Call ``register(name, factory)`` with the
    name the backend has in ``register_metadata_quorum``;
    ``factory(config)`` receives the node's :class:`josef.config.Config` and
    returns a :class:`josef.metadata.migration.MetadataMigration` when that
    configuration asks to migrate from this backend (ZooKeeper's:
    ``zookeeper.metadata.migration.enable=true``), else None. A node whose
    own quorum is that backend is never asked. Plugin API 1.5. Returns
    nothing.
    """


@hookspec
def register_coordinators(register: Register) -> None:
    """Offer coordinators (group, transaction, share) that own a set of API keys.

    Called when a broker is assembled. Call ``register(name, factory)``;
    ``factory(services)`` receives the broker's
    :class:`josef.services.BrokerServices` (never the broker itself) and
    returns a :class:`josef.coordinator.runtime.Coordinator`:
    its ``apis()`` lists ``(api key, handler, lowest, highest version)`` of
    the requests it answers (registered with the broker's dispatcher) and
    ``new_shard(context)`` builds the state machine of one partition of its
    internal topic, which the coordinator runtime loads and unloads with
    partition leadership. Every installed coordinator is started; two
    coordinators claiming one API key is an error, and so is claiming a
    key the core answers, except those in
    ``josef.server.apis.TAKEOVER_APIS`` (InitProducerId, which the
    transaction coordinator answers for idempotent producers too).
    Returns nothing.
    """


@hookspec
def register_authorizers(register: Register) -> None:
    """Offer authorizers that decide whether a principal may do an operation.

    Called when a broker is assembled. Call ``register(name, factory)``;
    ``factory(config)`` returns a :class:`josef.authorizer.Authorizer`.
    Selected with ``authorizer.class.name`` (default ``allow-all``; the core
    also registers Kafka's ACL authorizer,
    ``org.apache.kafka.metadata.authorizer.StandardAuthorizer``).
    ``authorize(context, actions)`` is called on the event loop once per
    request with every action the request needs, and must not block.
    Returns nothing.
    """


@hookspec
def register_principal_builders(register: Register) -> None:
    """Offer principal builders: who a connection is once it authenticated (Kafka's ``KafkaPrincipalBuilder``).

    Called when a broker is assembled. Call ``register(name, factory)``;
    ``factory(config)`` returns a :class:`josef.security.PrincipalBuilder`.
    Selected with ``principal.builder.class`` (default Kafka's
    ``org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder``,
    which the core registers: SASL's user name, or a client certificate's
    subject through ``ssl.principal.mapping.rules``). Returns nothing.
    """


@hookspec
def register_request_stages(register: Register) -> None:
    """Offer stages of the request pipeline: code that runs around every request, whatever its API.

    Called when a broker is assembled. Call ``register(name, factory)``;
    ``factory(services)`` gets the :class:`josef.services.BrokerServices`
    and returns ``async stage(ctx, request, next)``, which answers the
    request, normally with ``await next(ctx, request)`` and work before or
    after it (a metric, an audit line, a refusal). Every installed stage
    runs, after the core's authorization, on client and controller
    listeners alike; requests a node makes to itself skip them. ``next``
    may return a :class:`josef.server.dispatch.Later` whose body is awaited
    afterwards. Returns nothing.
    """


@hookspec
def register_partitioners(register: Register) -> None:
    """Offer client-side partitioners for josef's producer.

    Called when a producer is created. Call ``register(name, factory)``;
    ``factory(config)`` returns an object with
    ``partition(topic, key, value, partitions) -> int``. Selected with the
    producer's ``partitioner.class``. Called on the producer's event loop for
    every record: keep it cheap. Returns nothing.
    """


@hookspec
def register_assignors(register: Register) -> None:
    """Offer partition assignors (``range``, ``roundrobin``, ``sticky``, ``server:uniform``...).

    Called when a consumer or the group coordinator is assembled, with the
    plugin manager of that consumer or broker. Call ``register(name,
    factory)``; ``factory()`` returns an assignor. A client-side assignor
    (chosen with ``partition.assignment.strategy``; josef-client offers
    Kafka's four) has ``assign(cluster_partitions, subscriptions)`` mapping
    each member id to its partitions, given the partition count of every
    topic and each member's
    :class:`josef.protocol.consumer_protocol.Subscription`. A server-side
    assignor of KIP-848 groups is registered as ``server:NAME`` and chosen
    with ``group.consumer.assignors`` (the group coordinator offers
    ``uniform`` and ``range``). Returns nothing.
    """


@hookspec
def register_interceptors(register: Register) -> None:
    """Offer producer and consumer interceptors.

    Called when a producer or consumer is created. Call
    ``register(name, factory)``; ``factory(config)`` returns an interceptor.
    Interceptors listed in ``interceptor.classes`` are called in that order;
    following Kafka's contract, an exception raised by one is logged and the
    chain goes on. Returns nothing.
    """


@hookspec
def register_remote_storage(register: Register) -> None:
    """Offer remote storage backends for tiered storage (S3, GCS, a local dir...).

    Called when tiered log storage is assembled. Call
    ``register(name, factory)``; ``factory(settings)`` receives the broker's
    keys under ``remote.log.storage.manager.impl.prefix`` (``rsm.config.``),
    prefix removed, and returns a
    :class:`josef.remote_storage.RemoteStorageManager`. Selected with
    ``remote.log.storage.manager.class.name``. Its methods are called from
    worker threads, never the event loop. Returns nothing.
    """


@hookspec
def register_client_telemetry(register: Register) -> None:
    """Offer receivers of client metrics (KIP-714), as Kafka's metrics reporters implementing ClientTelemetry.

    Called when a broker is assembled. Call ``register(name, factory)``;
    ``factory()`` returns a :class:`josef.telemetry.ClientTelemetryReceiver`.
    Every registered receiver is active: each push of metrics is handed to
    every receiver on the event loop as ``receive_push(push)``, a
    :class:`josef.telemetry.ClientTelemetryPush` carrying the decompressed
    OTLP payload and the client it came from (instance id, client id,
    software name and version, address, principal, listener), and
    ``receive_push`` must not block; one that raises is logged and the
    client answered INVALID_RECORD, as Kafka does. (A receiver of plugin API
    1.4, with ``receive(client_instance_id, payload, terminating)`` instead,
    still works.)

    What clients are asked for comes from the client-metrics config
    resources (``josef client-metrics``, kafka-client-metrics.sh): the
    metrics of every resource whose ``match`` selects the client, at the
    shortest of their intervals. While there is no such resource, clients
    are asked for the union of the receivers' optional ``requested_metrics``
    at the shortest ``push_interval_ms``. With no receiver installed, the
    broker does not advertise the telemetry APIs, as Kafka's does not, so
    clients never ask. Returns nothing.
    """


@hookspec
def register_http_routes(register: Register) -> None:
    """Serve pages or an API on the node's HTTP listener (``http.listeners``) next to ``/metrics`` (plugin API 1.5).

    Called when a node with an HTTP listener starts it. Call
    ``register(name, factory)``; ``factory(services)`` gets the node's
    :class:`josef.services.BrokerServices` (on a controller-only node its
    broker parts are absent: check ``services.is_broker``) and returns an
    ``aiohttp.web.Application``, mounted at ``/<name>/``; ``/`` redirects to
    the first by name. Its handlers run on the node's event loop
    and must not block; the listener's authentication (``http.authentication``)
    applies to them as to ``/metrics``: a handler finds who asks in
    ``request[josef.server.http.PRINCIPAL]``, and
    ``request[josef.server.http.AUTHORIZATION_CONTEXT]`` to ask
    ``services.authorizer`` whether they may do more than read. Returns
    nothing.
    """


@hookspec
def register_features(register: Register) -> None:
    """Declare the feature flags (KIP-584) this plugin implements, with the levels it supports.

    Called when a broker or the ``josef storage`` command is assembled. Call
    ``register(name, feature)`` with a Kafka feature name
    (``metadata.version``, ``group.version``, ...) and a
    :class:`josef.metadata.features.SupportedFeature`: the lowest and highest
    level this node can run at, and the level a new cluster is formatted
    with. The broker advertises them in ApiVersions and its registration; the
    controller refuses an UpdateFeatures level some broker does not support.
    A feature registered twice is an error naming both plugins. Returns
    nothing.
    """


@hookspec
def register_configs(register: Register) -> None:
    """Declare configuration keys.

    Called once when a :class:`josef.config.ConfigDef` is built, before any
    ``server.properties`` is parsed. Call ``register(key)`` with a
    :class:`josef.config.ConfigKey` per key (name, type, default,
    documentation, validator, and the topic-level name when a topic may
    override it). A key registered twice is an error naming both plugins.
    Returns nothing.
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add sub-commands to the ``josef`` command line.

    Called once when the ``josef`` command is built, with the root
    :class:`click.Group`; add commands or groups to it with
    ``cli.add_command`` or the ``@cli.command()`` decorator. Command bodies
    run synchronously in the CLI process. Returns nothing.
    """


@hookspec
def register_record_decoders(register: Register) -> None:
    """Offer decoders of an internal topic's records, for ``josef dump-log`` (Kafka's ``--offsets-decoder``...).

    Called when ``josef dump-log`` runs with a decoder flag, never by the
    broker. Call ``register(name, decoder)``; ``--NAME-decoder`` selects it
    (the group coordinator registers ``offsets``, the transaction coordinator
    ``transaction-log``). ``decoder(key, value)`` receives one record's key
    (bytes) and value (bytes, None for a tombstone) and returns the key as
    ``{"type": <record type>, "data": {...}}`` and the value as ``{"version":
    <version>, "data": {...}}`` (None for a tombstone): dicts with Kafka's
    JSON field names, which the tool prints as Kafka's JSON converters do.
    It raises :class:`LookupError` with the record type for a type it does
    not know and :class:`ValueError` for bytes it cannot read; the tool
    prints those as Kafka's does and goes on. A topic whose records have no
    key (``__remote_log_metadata``, whose decoder tiered storage registers
    as ``remote-log-metadata``) has a decoder with the attribute ``keyless =
    True``: it is called with key None and returns ``(None, text)``, the
    text printed as the payload. Returns nothing.
    """


@hookspec
def register_policies(register: Register) -> None:
    """Offer topic policies: Kafka's CreateTopicPolicy and AlterConfigPolicy.

    Called when a node with the controller role is assembled. Call
    ``register(name, factory)``; ``factory(config)`` receives the node's
    :class:`josef.config.Config` (Kafka's ``configure()``) and returns a
    policy: a :class:`josef.policy.CreateTopicPolicy`
    (``validate_create_topic(request)``), a
    :class:`josef.policy.AlterConfigPolicy` (``validate_alter_config(request)``)
    or both. Selected by name with ``create.topic.policy.class.name`` and
    ``alter.config.policy.class.name`` (unset by default: no policy); a name
    nobody registered stops start-up with the list of installed ones, and
    each selected policy is built once per node, once for both keys if they
    name the same one. The controller calls them on its event loop, so they
    must not block: for every topic a CreateTopics request creates
    (``validate_only`` ones, automatic and internal topics too) and every
    resource an AlterConfigs or IncrementalAlterConfigs request changes,
    after its own validation and before anything is written. Raising
    :class:`josef.policy.PolicyViolation` refuses that topic or resource alone
    with POLICY_VIOLATION and the exception's message. CreatePartitions is
    not checked, as in Kafka. Returns nothing.
    """
