"""The configuration keys the core itself reads, with Kafka's names and defaults.

Topic-level keys carry their topic name (``retention.ms``) next to the
broker-level default (``log.retention.ms``), exactly as Kafka documents them.
"""

from __future__ import annotations

from typing import Iterator

from josef.config import INT32_MAX, INT64_MAX, Config, ConfigError, ConfigKey, ConfigType, at_least, between, one_of
from josef.replication.replication_quota import check_throttled_replicas
from josef.protocol.sasl_client import outbound_sasl
from josef.server.sasl import ListenerSasl
from josef.server.tls import BROKER_SSL_KEYS, ListenerTls, tls_listeners

B, S, I, L, D, LST = ConfigType.BOOLEAN, ConfigType.STRING, ConfigType.INT, ConfigType.LONG, ConfigType.DOUBLE, ConfigType.LIST

COMPRESSION_TYPES = ("uncompressed", "gzip", "snappy", "lz4", "zstd", "producer")


def _listeners(value: list[str]) -> None:
    for item in value:
        name, sep, rest = item.partition("://")
        if not sep or ":" not in rest:
            raise ConfigError(f"listener {item!r} is not NAME://HOST:PORT")
        port = rest.rsplit(":", 1)[1]
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"listener {item!r} has no valid port")


#: The replica selector of KIP-392 that josef implements, by Kafka's class name.
RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"

#: Kafka's security protocols, and the ones josef's listeners implement.
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SERVED_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def security_protocol_map(entries: list[str]) -> dict[str, str]:
    """``listener.security.protocol.map`` as {LISTENER NAME: PROTOCOL}, upper-cased as Kafka normalises them."""
    protocols: dict[str, str] = {}
    for item in entries:
        given, sep, protocol = item.partition(":")
        name, protocol = given.strip().upper(), protocol.strip().upper()
        if not sep or not name:
            raise ConfigError(f"entry {item!r} is not LISTENER_NAME:SECURITY_PROTOCOL")
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"entry {item!r} names no security protocol ({', '.join(SECURITY_PROTOCOLS)})")
        if name in protocols:
            raise ConfigError(f"listener {given.strip()} appears twice")
        protocols[name] = protocol
    return protocols


def listener_security_protocols(config: Config) -> Iterator[tuple[str, str, str]]:
    """``(listener name, listener, security protocol)`` of each of ``listeners``.

    The protocol is the listener name's in ``listener.security.protocol.map``;
    names are compared upper-cased, as Kafka normalises them. A name the map
    lacks is a :class:`ConfigError` (Kafka: "No security protocol defined for
    listener").
    """
    protocols = security_protocol_map(config["listener.security.protocol.map"])
    for listener in config["listeners"]:
        name = listener.partition("://")[0]
        if name.upper() not in protocols:
            raise ConfigError(f"listener {name} ({listener}): no security protocol defined for listener {name} "
                              "in listener.security.protocol.map")
        yield name, listener, protocols[name.upper()]


def inter_broker_listener_name(config: Config) -> str | None:
    """The listener brokers talk to each other on: ``inter.broker.listener.name``; else, when
    ``security.inter.broker.protocol`` is set, the listener named after that protocol (Kafka's rule); else the
    first client listener (josef's default, where Kafka's is the listener named PLAINTEXT)."""
    name = config["inter.broker.listener.name"]
    if config.is_set("security.inter.broker.protocol"):
        if name:
            raise ConfigError("inter.broker.listener.name and security.inter.broker.protocol should not both be set")
        return config["security.inter.broker.protocol"]
    if name:
        return name
    controllers = config["controller.listener.names"]
    return next((t.partition("://")[0] for t in config["listeners"] if t.partition("://")[0] not in controllers), None)


def check_listeners(config: Config) -> None:
    """Refuse to start with a listener whose security protocol josef does not implement.

    Serving such a listener in plaintext would leave clients configured for
    TLS or SASL unable to connect, with nothing in the broker's log saying
    why, and would expose data the operator meant to protect.
    """
    listeners = list(listener_security_protocols(config))
    controllers = config["controller.listener.names"]
    inter_broker = inter_broker_listener_name(config)
    for name, listener, protocol in listeners:
        if protocol not in SERVED_SECURITY_PROTOCOLS:
            raise ConfigError(f"listener {name} ({listener}): security protocol {protocol} is not supported yet; "
                              f"josef serves {', '.join(SERVED_SECURITY_PROTOCOLS)} only")
        if protocol.startswith("SASL_") and (name in controllers or name == inter_broker):
            # How this node authenticates to the others there: a mechanism it has credentials for.
            outbound_sasl(config, name, "sasl.mechanism.controller.protocol" if name in controllers
                          else "sasl.mechanism.inter.broker.protocol")
    sasl_listeners(config)  # the SASL listeners' mechanisms and their JAAS entries
    tls_listeners_of(config)  # the TLS listeners' key and trust stores


def check_tiered_default(config: Config) -> None:
    """``log.remote.storage.enable`` tiers every new topic: without remote storage on, each creation would be refused,
    so the broker refuses to start instead, naming what is missing."""
    if not config["log.remote.storage.enable"]:
        return
    system = "remote.log.storage.system.enable"
    if system not in config.definition or not config[system]:
        raise ConfigError(f"log.remote.storage.enable=true needs {system}=true (tiered storage, josef-storage-tiered)")


def sasl_listeners(config: Config) -> dict[str, ListenerSasl]:
    """The SASL mechanisms of each SASL listener, by listener name; ConfigError for a bad configuration."""
    return {name: ListenerSasl.from_config(config, name)
            for name, _, protocol in listener_security_protocols(config) if protocol.startswith("SASL_")}


def tls_listeners_of(config: Config) -> dict[str, ListenerTls]:
    """The TLS (SSL, SASL_SSL) listeners' contexts, by listener name; ConfigError for stores that cannot be used."""
    return tls_listeners(config, [(name, protocol) for name, _, protocol in listener_security_protocols(config)])


def metadata_quorum_name(config: Config) -> str:
    """The metadata quorum backend to run: ``metadata.quorum`` when set; otherwise ``zookeeper`` for a node with
    ``zookeeper.connect`` and no ``process.roles``, as Kafka 3.x ran such a node in ZooKeeper mode (its
    ``server.properties`` work unchanged, with the metadata-zk plugin installed); otherwise ``kraft``."""
    if config.is_set("metadata.quorum") or config.is_set("process.roles"):
        return config["metadata.quorum"]
    connect = (config["zookeeper.connect"] if "zookeeper.connect" in config.definition
               else config.unknown.get("zookeeper.connect"))
    return "zookeeper" if connect else config["metadata.quorum"]


def _process_roles(value: list[str]) -> None:
    one_of("broker", "controller")(value)
    if not value:
        raise ConfigError("must name broker, controller or both")


CORE_KEYS = (
    # Identity and roles
    ConfigKey("node.id", I, 1, "The node's id, as broker and as controller.", at_least(0)),
    ConfigKey("broker.id", I, 1, "A synonym of node.id (Kafka's name for it in ZooKeeper mode); either sets both.",
              at_least(0)),
    ConfigKey("process.roles", LST, ["broker", "controller"], "The roles of this process: broker, controller or both (KRaft combined mode).", _process_roles),
    ConfigKey("broker.heartbeat.interval.ms", I, 2000, "How often a broker heartbeats to the active controller.", at_least(1)),
    ConfigKey("broker.session.timeout.ms", I, 9000,
              "How long the controller waits for a broker's heartbeat before fencing it.", at_least(1)),
    ConfigKey("metadata.quorum", S, "kraft", "Name of the metadata quorum backend (kraft, zookeeper...)."),
    ConfigKey("metadata.log.max.record.bytes.between.snapshots", L, 20971520,
              "Bytes of committed metadata log after which the metadata quorum writes a snapshot and trims its log "
              "(every backend that keeps snapshots).", at_least(1)),
    ConfigKey("log.storage", S, "local", "Name of the log storage backend (local, tiered...)."),
    ConfigKey("authorizer.class.name", S, "allow-all",
              "Name of the authorizer that decides every request: allow-all (the default: no authorization), or "
              "org.apache.kafka.metadata.authorizer.StandardAuthorizer (alias acl) for Kafka's ACLs."),
    ConfigKey("principal.builder.class", S, "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder",
              "Name of the principal builder (register_principal_builders) that names each authenticated connection: "
              "Kafka's default takes SASL's user name, or a client certificate's subject through "
              "ssl.principal.mapping.rules."),
    ConfigKey("super.users", S, None,
              "Principals the ACL authorizer allows everything, separated by semicolons: User:admin;User:broker."),
    ConfigKey("allow.everyone.if.no.acl.found", B, False,
              "Whether the ACL authorizer allows an operation on a resource that has no ACL at all (else denies)."),
    ConfigKey("create.topic.policy.class.name", S, None,
              "Name of the create-topic policy (registered through register_policies, josef.policy) that every topic "
              "the controller creates must satisfy; unset, none."),
    ConfigKey("alter.config.policy.class.name", S, None,
              "Name of the alter-config policy (registered through register_policies, josef.policy) that every "
              "AlterConfigs and IncrementalAlterConfigs change the controller decides must satisfy; unset, none."),
    # Delegation tokens (josef.delegation_tokens)
    ConfigKey("delegation.token.secret.key", ConfigType.PASSWORD, None,
              "The secret that signs delegation tokens (their HMAC-SHA512); the same on every broker and controller. "
              "Unset, delegation tokens are disabled (DELEGATION_TOKEN_AUTH_DISABLED).", sensitive=True),
    ConfigKey("delegation.token.max.lifetime.ms", L, 604800000,
              "The longest a delegation token may live, renewals included; a token's own maximum may be shorter.",
              at_least(1)),
    ConfigKey("delegation.token.expiry.time.ms", L, 86400000,
              "How long a delegation token lives before it must be renewed (and the longest one renewal extends it).",
              at_least(1)),
    ConfigKey("delegation.token.expiry.check.interval.ms", L, 3600000,
              "How often the active controller removes the delegation tokens past their expiry.", at_least(1)),
    # Network
    ConfigKey("listeners", LST, ["PLAINTEXT://localhost:9092"], "Addresses the broker listens on, NAME://HOST:PORT (port 0 picks a free one).", _listeners),
    ConfigKey("listener.security.protocol.map", LST,
              ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT", "SSL:SSL", "SASL_PLAINTEXT:SASL_PLAINTEXT", "SASL_SSL:SASL_SSL"],
              "Map between listener names and security protocols. This must be defined for the same security protocol "
              "to be usable in more than one port or IP. For example, internal and external traffic can be separated "
              "even if SSL is required for both. Concretely, the user could define listeners with names INTERNAL and "
              "EXTERNAL and this property as: INTERNAL:SSL,EXTERNAL:SSL. As shown, key and value are separated by a "
              "colon and map entries are separated by commas. Each listener name should only appear once in the map.",
              security_protocol_map),
    ConfigKey("controller.listener.names", LST, ["CONTROLLER"],
              "Listeners that serve the controller (its quorum's and brokers' requests), not clients."),
    ConfigKey("http.listeners", LST, [], "Where the node serves /metrics, /health/live, /health/ready (and the "
              "console): http://HOST:PORT, port 0 picks a free one; empty: no HTTP listener."),
    ConfigKey("http.authentication", S, None, "Who may read the HTTP listener's /metrics and pages: none, basic "
              "(HTTP Basic against the SCRAM credentials) or mtls (https:// listeners' client certificates); "
              "unset: basic on a node with secured listeners or an authorizer, else none. Health checks are "
              "always open.", one_of("none", "basic", "mtls")),
    ConfigKey("advertised.listeners", LST, None, "Addresses given to clients in Metadata responses; defaults to listeners.", _listeners),
    ConfigKey("socket.request.max.bytes", I, 104857600, "The largest request frame the broker accepts; larger frames close the connection.", at_least(1)),
    ConfigKey("connections.max.idle.ms", L, 600000, "Idle connections are closed after this long."),
    ConfigKey("sasl.server.max.receive.size", I, 524288,
              "The largest request a client may send on a SASL listener before it has authenticated; a larger one "
              "closes the connection.", at_least(1)),
    ConfigKey("connections.max.reauth.ms", L, 0,
              "The longest an authenticated SASL session lasts before the client must re-authenticate (KIP-368); a "
              "connection that has not by then is closed at its next request. 0: sessions do not expire (unless their "
              "credential does). listener.name.<listener>.<mechanism>.connections.max.reauth.ms overrides it.",
              at_least(0)),
    ConfigKey("sasl.enabled.mechanisms", LST, ["GSSAPI"],
              "The SASL mechanisms SASL listeners offer (listener.name.<listener>.sasl.enabled.mechanisms overrides it "
              "per listener); each is configured by listener.name.<listener>.<mechanism>.sasl.jaas.config. josef "
              "offers PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER."),
    # SASL/OAUTHBEARER (josef.server.oauthbearer): the JWKS validator's settings, each also per listener
    ConfigKey("sasl.oauthbearer.jwks.endpoint.url", S, None,
              "The JWKS (an http, https or file URL) whose keys verify OAUTHBEARER tokens on listeners with "
              "listener.name.<listener>.oauthbearer.sasl.server.callback.handler.class="
              "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler; fetched at start-up "
              "(a broker that cannot fetch it does not start) and refreshed in the background.", per_listener=True),
    ConfigKey("sasl.oauthbearer.jwks.endpoint.refresh.ms", L, 3600000,
              "How often the JWKS is fetched again; a token naming a key id it lacks also triggers a fetch, at most "
              "once a minute per key id.", at_least(1), per_listener=True),
    ConfigKey("sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", L, 100,
              "The first wait before retrying a failed JWKS refresh; doubled after each failure.", at_least(0),
              per_listener=True),
    ConfigKey("sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms", L, 10000,
              "The longest wait between retries of a failed JWKS refresh.", at_least(0), per_listener=True),
    ConfigKey("sasl.oauthbearer.expected.audience", LST, None,
              "Audiences of which an OAUTHBEARER token's aud claim must name one; unset, the audience is not checked.",
              per_listener=True),
    ConfigKey("sasl.oauthbearer.expected.issuer", S, None,
              "The iss claim an OAUTHBEARER token must have; unset, the issuer is not checked.", per_listener=True),
    ConfigKey("sasl.oauthbearer.sub.claim.name", S, "sub",
              "The claim of an OAUTHBEARER token that names its principal (User:<value>).", per_listener=True),
    ConfigKey("sasl.oauthbearer.scope.claim.name", S, "scope",
              "The claim of an OAUTHBEARER token that holds its scope.", per_listener=True),
    ConfigKey("sasl.oauthbearer.clock.skew.seconds", I, 30,
              "Seconds of difference allowed between the broker's clock and the token issuer's (exp, iat, nbf).",
              at_least(0), per_listener=True),
    ConfigKey("sasl.mechanism.inter.broker.protocol", S, "GSSAPI",
              "The SASL mechanism brokers authenticate to each other with when the inter-broker listener is a SASL "
              "one; the username and password options of that listener's JAAS entry for it are this broker's."),
    ConfigKey("sasl.mechanism.controller.protocol", S, "GSSAPI",
              "The SASL mechanism brokers and controllers authenticate to controllers with when the controller "
              "listener is a SASL one; the username and password options of that listener's JAAS entry for it are "
              "this node's."),
    # TLS (josef.server.tls): each also as listener.name.<listener>.ssl.*
    *BROKER_SSL_KEYS,
    # Storage
    ConfigKey("log.dirs", LST, None, "Directories where partition logs live; defaults to log.dir."),
    ConfigKey("log.dir", S, "/tmp/josef-logs", "The log directory when log.dirs is not set."),
    ConfigKey("log.retention.check.interval.ms", L, 300000, "How often retention is applied.", at_least(1)),
    ConfigKey("log.flush.scheduler.interval.ms", L, INT64_MAX, "How often logs are checked against flush.ms."),
    ConfigKey("log.flush.offset.checkpoint.interval.ms", I, 60000, "How often recovery points are checkpointed.", at_least(1)),
    ConfigKey("log.flush.start.offset.checkpoint.interval.ms", I, 60000, "How often log start offsets are checkpointed.", at_least(1)),
    # Topics
    ConfigKey("auto.create.topics.enable", B, True, "Create a topic when a client asks for metadata or produces to a topic that does not exist."),
    ConfigKey("num.partitions", I, 1, "Partitions of an automatically created topic.", at_least(1)),
    ConfigKey("default.replication.factor", I, 1, "Replication factor of an automatically created topic.", at_least(1)),
    ConfigKey("delete.topic.enable", B, True, "Whether DeleteTopics may delete topics."),
    # Replication
    ConfigKey("replica.lag.time.max.ms", L, 30000, "A follower that has not caught up for this long leaves the ISR.", at_least(0)),
    ConfigKey("num.replica.fetchers", I, 1, "Fetcher tasks per leader broker; partitions are spread over them by hash.", at_least(1), dynamic=True),
    ConfigKey("replica.fetch.max.bytes", I, 1048576, "Bytes a follower asks for per partition in one fetch (at least one batch).", at_least(0)),
    ConfigKey("replica.fetch.response.max.bytes", I, 10485760, "Bytes a follower asks for in one fetch in all.", at_least(0)),
    ConfigKey("max.incremental.fetch.session.cache.slots", I, 1000,
              "Incremental fetch sessions (KIP-227) the broker keeps, for consumers and followers together.", at_least(0)),
    ConfigKey("remote.fetch.max.wait.ms", I, 500, "How long a fetch waits for data read from remote storage (tiered storage) before it is answered without it.", at_least(1), dynamic=True),
    ConfigKey("replica.fetch.wait.max.ms", I, 500, "How long a follower's fetch waits at the leader for new data.", at_least(0)),
    ConfigKey("replica.fetch.min.bytes", I, 1, "Bytes a follower's fetch waits for at the leader.", at_least(1)),
    ConfigKey("replica.fetch.backoff.ms", I, 1000, "Pause after a fetch error before fetching that partition again.", at_least(0)),
    ConfigKey("replica.socket.timeout.ms", I, 30000, "How long a follower waits for a fetch response.", at_least(1)),
    ConfigKey("replica.high.watermark.checkpoint.interval.ms", L, 5000, "How often high watermarks are written to replication-offset-checkpoint.", at_least(1)),
    ConfigKey("transaction.partition.verification.enable", B, True,
              "Ask the transaction coordinator before the first transactional write of a producer to a partition (KIP-890), so no transaction is left hanging.",
              dynamic=True),
    ConfigKey("producer.id.expiration.ms", I, 86400000,
              "How long a partition remembers a producer that writes nothing and has no open transaction; one "
              "forgotten is accepted again as a new producer.", at_least(1), dynamic=True),
    ConfigKey("producer.id.expiration.check.interval.ms", I, 600000,
              "How often the broker forgets the producers past producer.id.expiration.ms.", at_least(1)),
    ConfigKey("request.timeout.ms", I, 30000, "How long a broker waits for another broker's answer (transaction markers, partition verification).", at_least(1)),
    ConfigKey("inter.broker.listener.name", S, None, "The listener brokers fetch from each other on; defaults to the first client listener."),
    ConfigKey("security.inter.broker.protocol", S, "PLAINTEXT",
              "Security protocol used to communicate between brokers: when set (and inter.broker.listener.name is "
              "not), brokers talk on the listener named after it (SSL: the listener named SSL).",
              one_of(*SECURITY_PROTOCOLS)),
    ConfigKey("broker.rack", S, None, "The rack of this broker: rack-aware replica placement and follower fetching (KIP-392)."),
    ConfigKey("replica.selector.class", S, None,
              "Where consumers that name their rack (client.rack) should fetch from (KIP-392): "
              f"{RACK_AWARE_SELECTOR} sends them to an in-sync replica in their rack; unset, always the leader.",
              one_of(RACK_AWARE_SELECTOR)),
    # Replication throttles (KIP-73, josef.replication.replication_quota)
    ConfigKey("leader.replication.throttled.rate", L, INT64_MAX,
              "The upper bound (bytes/s) on what this broker serves, as leader, to the followers enumerated in each "
              "topic's leader.replication.throttled.replicas while they are not in sync.", at_least(0), dynamic=True),
    ConfigKey("follower.replication.throttled.rate", L, INT64_MAX,
              "The upper bound (bytes/s) on what this broker fetches, as follower, for the replicas enumerated in each "
              "topic's follower.replication.throttled.replicas while they are not in sync.", at_least(0), dynamic=True),
    # Client quotas (josef.server.quotas)
    ConfigKey("quota.window.num", I, 11, "The number of samples to retain in memory for client quotas.", at_least(1)),
    ConfigKey("quota.window.size.seconds", I, 1, "The time span of each sample for client quotas.", at_least(1)),
    ConfigKey("controller.quota.window.num", I, 11,
              "The number of samples to retain in memory for controller mutation quotas.", at_least(1)),
    ConfigKey("controller.quota.window.size.seconds", I, 1,
              "The time span of each sample for controller mutations quotas.", at_least(1)),
    ConfigKey("replication.quota.window.num", I, 11, "The number of samples replication quotas are measured over.", at_least(1)),
    ConfigKey("replication.quota.window.size.seconds", I, 1, "The time span of each replication quota sample.", at_least(1)),
    ConfigKey("leader.replication.throttled.replicas", LST, [],
              "Replicas whose log is throttled on the leader side, as [PartitionId]:[BrokerId],... or * for all of "
              "the topic's replicas.", check_throttled_replicas, topic_name="leader.replication.throttled.replicas",
              dynamic=True, topic_only=True),
    ConfigKey("follower.replication.throttled.replicas", LST, [],
              "Replicas whose log is throttled on the follower side, as [PartitionId]:[BrokerId],... or * for all of "
              "the topic's replicas.", check_throttled_replicas, topic_name="follower.replication.throttled.replicas",
              dynamic=True, topic_only=True),
    # Leadership (decided by the active controller)
    ConfigKey("auto.leader.rebalance.enable", B, True, "Move leadership back to each partition's preferred replica when leaders are imbalanced."),
    ConfigKey("leader.imbalance.check.interval.seconds", L, 300, "How often the controller checks whether leaders are imbalanced.", at_least(1)),
    ConfigKey("leader.imbalance.per.broker.percentage", I, 10, "The share of a broker's preferred partitions led elsewhere above which the controller rebalances them.", at_least(0)),
    # The log cleaner (compaction)
    ConfigKey("log.cleaner.threads", I, 1, "The number of background threads that compact logs.", at_least(0), dynamic=True),
    ConfigKey("log.cleaner.dedupe.buffer.size", L, 134217728, "Memory for the cleaners' key-to-offset maps, shared by all cleaner threads.", dynamic=True),
    ConfigKey("log.cleaner.io.buffer.size", I, 524288, "Memory for the cleaners' read and write buffers, shared by all cleaner threads.", at_least(0), dynamic=True),
    ConfigKey("log.cleaner.io.buffer.load.factor", D, 0.9, "How full a cleaner's key-to-offset map may get.", dynamic=True),
    ConfigKey("log.cleaner.io.max.bytes.per.second", D, 1.7976931348623157e308, "The cleaners' read plus write rate limit, bytes per second.", dynamic=True),
    ConfigKey("log.cleaner.backoff.ms", L, 15000, "How long a cleaner sleeps when no log needs cleaning.", at_least(0), dynamic=True),
    # Topic-level keys (broker default, topic override)
    ConfigKey("log.cleanup.policy", LST, ["delete"], "delete, compact or both.", one_of("delete", "compact"), topic_name="cleanup.policy", dynamic=True),
    ConfigKey("compression.type", S, "producer", "Codec of stored batches; producer keeps the producer's codec.", one_of(*COMPRESSION_TYPES), topic_name="compression.type", dynamic=True),
    ConfigKey("log.cleaner.min.cleanable.ratio", D, 0.5, "The dirty share of a compacted log above which the cleaner cleans it.", between(0, 1), topic_name="min.cleanable.dirty.ratio", dynamic=True),
    ConfigKey("log.cleaner.min.compaction.lag.ms", L, 0, "The minimum time a record stays uncompacted.", at_least(0), topic_name="min.compaction.lag.ms", dynamic=True),
    ConfigKey("log.cleaner.max.compaction.lag.ms", L, INT64_MAX, "The maximum time a record stays uncompacted: a log holding older dirty records is cleaned whatever its dirty ratio.", at_least(1), topic_name="max.compaction.lag.ms", dynamic=True),
    ConfigKey("log.cleaner.delete.retention.ms", L, 86400000, "How long delete tombstones are kept in compacted topics.", at_least(0), topic_name="delete.retention.ms", dynamic=True),
    ConfigKey("log.segment.delete.delay.ms", L, 60000, "Wait before a deleted segment's files are removed.", at_least(0), topic_name="file.delete.delay.ms", dynamic=True),
    ConfigKey("log.flush.interval.messages", L, INT64_MAX, "Flush a log after this many messages.", at_least(1), topic_name="flush.messages", dynamic=True),
    ConfigKey("log.flush.interval.ms", L, INT64_MAX, "Flush a log when its oldest unflushed data is this old.", at_least(0), topic_name="flush.ms", dynamic=True),
    ConfigKey("log.index.interval.bytes", I, 4096, "Bytes of log between offset index entries.", at_least(0), topic_name="index.interval.bytes", dynamic=True),
    ConfigKey("telemetry.max.bytes", I, 1048576, "Largest client metrics push (KIP-714) the broker accepts.", at_least(1)),
    ConfigKey("message.max.bytes", I, 1048588, "Largest record batch the broker accepts.", at_least(0), topic_name="max.message.bytes", dynamic=True),
    ConfigKey("log.message.timestamp.type", S, "CreateTime", "CreateTime keeps the producer's timestamps; LogAppendTime stamps batches on append.", one_of("CreateTime", "LogAppendTime"), topic_name="message.timestamp.type", dynamic=True),
    ConfigKey("min.insync.replicas", I, 1, "Replicas that must have a write before acks=all succeeds.", at_least(1), topic_name="min.insync.replicas", dynamic=True),
    ConfigKey("log.retention.bytes", L, -1, "Delete old segments when a partition is larger than this (-1: no limit).", topic_name="retention.bytes", dynamic=True),
    ConfigKey("log.retention.ms", L, None, "Delete segments older than this (-1: forever). Overrides log.retention.minutes and .hours.", topic_name="retention.ms", dynamic=True),
    ConfigKey("log.retention.minutes", I, None, "Retention in minutes when log.retention.ms is not set."),
    ConfigKey("log.retention.hours", I, 168, "Retention in hours when neither log.retention.ms nor .minutes is set."),
    # Tiered storage (KIP-405): the topic keys every broker knows, as Kafka's LogConfig has them. The broker keys of
    # remote storage itself (remote.log.storage.*, remote.log.manager.*) come with josef-storage-tiered.
    ConfigKey("log.local.retention.ms", L, -2, "Of a tiered topic, how long segments stay on local disk after they "
              "are in remote storage (-2: retention.ms).", at_least(-2), topic_name="local.retention.ms", dynamic=True),
    ConfigKey("log.local.retention.bytes", L, -2, "Of a tiered topic, the local bytes a partition keeps of what is "
              "in remote storage (-2: retention.bytes).", at_least(-2), topic_name="local.retention.bytes", dynamic=True),
    ConfigKey("log.remote.storage.enable", B, False, "Copy the topic's rolled segments to remote storage (tiered "
              "storage); needs remote.log.storage.system.enable on the brokers. As a broker key (josef's; Kafka has "
              "none) the default of topics that do not set it, internal and compacted topics excepted.",
              topic_name="remote.storage.enable", dynamic=True),
    ConfigKey("remote.log.copy.disable", B, False, "Of a tiered topic: stop copying segments to remote storage and "
              "keep what is there readable (KIP-950).", topic_name="remote.log.copy.disable", dynamic=True,
              topic_only=True),
    ConfigKey("remote.log.delete.on.disable", B, False, "Whether turning remote.storage.enable off deletes the "
              "topic's remote data (KIP-950); it must be true to turn it off.", topic_name="remote.log.delete.on.disable",
              dynamic=True, topic_only=True),
    ConfigKey("log.segment.bytes", I, 1073741824, "Roll a segment when it reaches this size.", at_least(14), topic_name="segment.bytes", dynamic=True),
    ConfigKey("log.index.size.max.bytes", I, 10485760, "Size an offset or time index is preallocated to.", at_least(4), topic_name="segment.index.bytes", dynamic=True),
    ConfigKey("log.roll.ms", L, None, "Roll a segment when its first batch is this old. Overrides log.roll.hours.", at_least(1), topic_name="segment.ms", dynamic=True),
    ConfigKey("log.roll.hours", I, 168, "Roll a segment after this many hours when log.roll.ms is not set.", at_least(1)),
    ConfigKey("log.roll.jitter.ms", L, 0, "Random jitter subtracted from segment.ms.", at_least(0), topic_name="segment.jitter.ms", dynamic=True),
    ConfigKey("log.roll.jitter.hours", I, 0, "Jitter in hours when log.roll.jitter.ms is not set.", at_least(0)),
    ConfigKey("unclean.leader.election.enable", B, False, "Elect a leader outside the ISR when none is left, at the risk of losing data.", topic_name="unclean.leader.election.enable", dynamic=True),
)

del B, S, I, L, D, LST, INT32_MAX
