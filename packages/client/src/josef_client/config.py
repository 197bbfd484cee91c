"""Client configuration: Kafka's property names, as a dict or as keyword arguments with underscores.

``Producer({"bootstrap.servers": "b:9092", "linger.ms": 5})`` and
``Producer(bootstrap_servers="b:9092", linger_ms=5)`` are the same; an unknown
or mistyped key fails at once, suggesting the closest known one.
"""

from __future__ import annotations

import difflib
import ssl
from typing import Any, Callable, Iterable, Mapping

from josef.config import ConfigError, ConfigKey, ConfigType, at_least, one_of
from josef.protocol.sasl_client import ClientSasl, client_sasl
from josef.protocol.tls import CLIENT_SSL_KEYS, TlsSettings, client_context

B, S, I, L, LST, C = (ConfigType.BOOLEAN, ConfigType.STRING, ConfigType.INT, ConfigType.LONG,
                      ConfigType.LIST, ConfigType.CLASS)


def _acks(value: Any) -> None:
    if str(value) not in ("all", "-1", "0", "1"):
        raise ConfigError("must be all, -1, 0 or 1")


def _callable_or_none(value: Any) -> None:
    if value is not None and not callable(value):
        raise ConfigError("must be a callable")


COMMON = (
    ConfigKey("bootstrap.servers", LST, None, "host:port pairs to find the cluster from."),
    ConfigKey("client.id", S, "josef", "Sent with every request; shows in broker logs and quotas."),
    ConfigKey("request.timeout.ms", I, 30000, "How long to wait for a response before failing the request.", at_least(1)),
    ConfigKey("retry.backoff.ms", L, 100, "Wait before retrying a failed request.", at_least(0)),
    ConfigKey("reconnect.backoff.ms", L, 50, "Wait before reconnecting to a broker.", at_least(0)),
    ConfigKey("metadata.max.age.ms", L, 300000, "Refresh metadata at least this often.", at_least(0)),
    ConfigKey("socket.connection.setup.timeout.ms", L, 10000, "How long a TCP connect may take.", at_least(1)),
    ConfigKey("security.protocol", S, "PLAINTEXT",
              "PLAINTEXT, SSL (TLS, configured by the ssl.* keys as Kafka's clients are), SASL_PLAINTEXT or SASL_SSL "
              "(SASL, configured by the sasl.* keys).", one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
    ConfigKey("sasl.mechanism", S, "GSSAPI", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (GSSAPI, Kafka's "
              "default, is not offered)."),
    ConfigKey("sasl.jaas.config", S, None,
              "The login module and credentials, as Kafka's clients take them: "
              "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"alice\" password=\"...\";",
              sensitive=True),
    ConfigKey("sasl.username", S, None, "The SASL user name, as librdkafka takes it (instead of sasl.jaas.config)."),
    ConfigKey("sasl.password", S, None, "The SASL password, as librdkafka takes it.", sensitive=True),
    ConfigKey("sasl.oauthbearer.token.provider", C, None,
              "OAUTHBEARER: a callable returning a token (a JWT), called for every authentication and "
              "re-authentication, in a worker thread (it may block); without it, sasl.oauthbearer.token.endpoint.url "
              "or the unsecuredLogin* options of OAuthBearerLoginModule in sasl.jaas.config make the tokens.",
              _callable_or_none),
    ConfigKey("sasl.oauthbearer.token.endpoint.url", S, None,
              "OAUTHBEARER: the OAuth token endpoint of the client-credentials flow, with "
              "sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer."
              "OAuthBearerLoginCallbackHandler and the clientId, clientSecret (and scope) options of "
              "OAuthBearerLoginModule in sasl.jaas.config."),
    ConfigKey("sasl.login.callback.handler.class", S, None,
              "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler for the OAUTHBEARER "
              "client-credentials flow (sasl.oauthbearer.token.endpoint.url); no other handler is offered."),
    ConfigKey("interceptor.classes", LST, [], "Names of registered interceptors, called in this order."),
    *CLIENT_SSL_KEYS,
)

PRODUCER = COMMON + (
    ConfigKey("acks", S, "all", "Acknowledgements the leader waits for: 0, 1 or all (-1).", _acks),
    ConfigKey("linger.ms", L, 5, "Wait this long for more records before sending a batch.", at_least(0)),
    ConfigKey("batch.size", I, 16384, "Largest batch, in bytes, per partition.", at_least(0)),
    ConfigKey("buffer.memory", L, 33554432, "Bytes of records waiting to be sent before send() blocks.", at_least(0)),
    ConfigKey("max.block.ms", L, 60000, "How long send() may block on a full buffer or missing metadata.", at_least(0)),
    ConfigKey("compression.type", S, "none", "none, gzip, snappy, lz4 or zstd.", one_of("none", "gzip", "snappy", "lz4", "zstd")),
    ConfigKey("retries", I, 2147483647, "Times a failed batch is retried (within delivery.timeout.ms).", at_least(0)),
    ConfigKey("delivery.timeout.ms", I, 120000, "Upper bound on the time from send() to success or failure.", at_least(0)),
    ConfigKey("max.in.flight.requests.per.connection", I, 5, "Unacknowledged produce requests per broker.", at_least(1)),
    ConfigKey("enable.idempotence", B, True, "Exactly one copy of each record per partition, in order, despite retries."),
    ConfigKey("transactional.id", S, None, "Makes the producer transactional (and idempotent); a newer producer with the same id fences this one."),
    ConfigKey("transaction.timeout.ms", I, 60000, "The coordinator aborts a transaction left open longer than this.", at_least(1)),
    ConfigKey("max.request.size", I, 1048576, "Largest produce request, and so the largest record.", at_least(1)),
    ConfigKey("partitioner.class", S, "murmur2", "Name of a registered partitioner (murmur2 is the Java client's)."),
    ConfigKey("partitioner.ignore.keys", B, False, "Use sticky partitioning even for records with keys."),
    ConfigKey("key.serializer", C, None, "A callable turning keys into bytes.", _callable_or_none),
    ConfigKey("value.serializer", C, None, "A callable turning values into bytes.", _callable_or_none),
)

CONSUMER = COMMON + (
    ConfigKey("group.id", S, None, "Consumer group; needed for commits and subscriptions."),
    ConfigKey("auto.offset.reset", S, "latest", "Where to start without a valid position: earliest, latest or none.", one_of("earliest", "latest", "none")),
    ConfigKey("enable.auto.commit", B, True, "Commit positions every auto.commit.interval.ms, on rebalance and on close (with group.id)."),
    ConfigKey("auto.commit.interval.ms", I, 5000, "How often positions are committed when enable.auto.commit is set.", at_least(0)),
    ConfigKey("group.instance.id", S, None, "A stable id that makes this consumer a static group member (KIP-345)."),
    ConfigKey("group.protocol", S, "classic", "classic (JoinGroup/SyncGroup, client-side assignors) or consumer (KIP-848).",
              one_of("classic", "consumer")),
    ConfigKey("group.remote.assignor", S, None, "group.protocol=consumer: the server-side assignor the group uses (uniform, range...); the broker's default if unset."),
    ConfigKey("session.timeout.ms", I, 45000, "The coordinator drops a member whose heartbeats stop for this long.", at_least(1)),
    ConfigKey("heartbeat.interval.ms", I, 3000, "Time between heartbeats to the group coordinator.", at_least(1)),
    ConfigKey("max.poll.interval.ms", I, 300000, "Longest time between polls before the member leaves the group; also the rebalance timeout.", at_least(1)),
    ConfigKey("partition.assignment.strategy", LST, ["range", "cooperative-sticky"],
              "Names of registered assignors, in order of preference (the group uses the first all members have)."),
    ConfigKey("exclude.internal.topics", B, True, "Pattern subscriptions never match internal topics (__consumer_offsets...)."),
    ConfigKey("client.rack", S, None, "The rack of this consumer, sent to rack-aware assignors."),
    ConfigKey("default.api.timeout.ms", I, 60000, "Default timeout of blocking calls such as commit() and committed().", at_least(0)),
    ConfigKey("fetch.min.bytes", I, 1, "Bytes the broker waits for before answering a fetch.", at_least(0)),
    ConfigKey("fetch.max.wait.ms", I, 500, "Longest the broker holds a fetch waiting for fetch.min.bytes.", at_least(0)),
    ConfigKey("fetch.max.bytes", I, 52428800, "Largest fetch response.", at_least(0)),
    ConfigKey("max.partition.fetch.bytes", I, 1048576, "Largest part of a fetch response for one partition.", at_least(0)),
    ConfigKey("max.poll.records", I, 500, "Most records one poll() returns.", at_least(1)),
    ConfigKey("isolation.level", S, "read_uncommitted", "read_committed hides aborted and open transactions.", one_of("read_uncommitted", "read_committed")),
    ConfigKey("check.crcs", B, True, "Verify the CRC-32C of fetched batches."),
    ConfigKey("key.deserializer", C, None, "A callable turning key bytes into objects.", _callable_or_none),
    ConfigKey("value.deserializer", C, None, "A callable turning value bytes into objects.", _callable_or_none),
)

_CONSUMER_KEYS = {key.name: key for key in CONSUMER}
#: A share consumer (KIP-932) takes the consumer's keys that still apply to it, and its own acknowledgement mode.
SHARE_CONSUMER = COMMON + tuple(_CONSUMER_KEYS[name] for name in (
    "max.poll.records", "fetch.min.bytes", "fetch.max.wait.ms", "fetch.max.bytes", "max.partition.fetch.bytes",
    "client.rack", "key.deserializer", "value.deserializer")) + (
    ConfigKey("group.id", S, None, "The share group; required."),
    ConfigKey("share.acknowledgement.mode", S, "implicit",
              "implicit: a poll's records are accepted by the next poll or commit; explicit: each record is "
              "acknowledged with acknowledge().", one_of("implicit", "explicit")),
)

ADMIN = COMMON


def build_config(kind: str, keys: Iterable[ConfigKey], config: Mapping[str, Any] | None,
                 kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every key's value from ``config`` and ``kwargs`` (underscores for dots), validated, with defaults."""
    known = {key.name: key for key in keys}
    raw: dict[str, Any] = dict(config or {})
    raw.update({name.replace("_", "."): value for name, value in kwargs.items()})
    for name in raw:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown {kind} configuration {name!r}{hint}")
    values = {name: key.parse(raw[name]) if name in raw else key.default for name, key in known.items()}
    if not values["bootstrap.servers"]:
        raise ConfigError(f"{kind} configuration bootstrap.servers is required")
    return values


def sasl_credentials(config: Mapping[str, Any]) -> ClientSasl | None:
    """What a client's connections authenticate with: None unless ``security.protocol`` is SASL_PLAINTEXT or SASL_SSL.

    Read once per client, so missing credentials fail when the client is made.
    """
    if not config["security.protocol"].startswith("SASL_"):
        return None
    return client_sasl(config.get)


def ssl_context(config: Mapping[str, Any]) -> ssl.SSLContext | None:
    """The TLS context of a client's connections: None unless ``security.protocol`` is SSL or SASL_SSL.

    Built once per client from Kafka's client keys (trust store, key store
    for mutual TLS, ``ssl.endpoint.identification.algorithm``), so a bad
    store fails when the client is made, not at its first request.
    """
    if config["security.protocol"] not in ("SSL", "SASL_SSL"):
        return None
    return client_context(TlsSettings.from_lookup(config.get), "client")


Serializer = Callable[[Any], bytes | None]

del B, S, I, L, LST, C
