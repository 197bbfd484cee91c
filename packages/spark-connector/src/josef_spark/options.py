"""The options of Spark's Kafka source and sink, parsed and checked when a query is defined.

Names and meanings follow Spark's built-in ``kafka`` format, so a job moves to
``josef`` by changing only the format name. Spark hands options over
case-insensitively (lower-cased keys); every check here raises
:class:`OptionError` naming the option, so a mistake fails at ``load()`` or
``save()``/``start()``, not in a task on an executor.

Offsets use the JSON shapes of Spark's Kafka source: ``{"topic": {"0": 23}}``
for offsets (``-2`` earliest, ``-1`` latest), ``{"topic": [0, 1]}`` for
``assign`` and ``{"topic": {"0": 1700000000000}}`` for timestamps.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Mapping

import attrs

from josef_client import ConfigError
from josef_client.config import CONSUMER, PRODUCER, build_config

EARLIEST, LATEST = -2, -1

#: Kafka client keys Spark's source sets itself (kafka.* cannot override them).
RESERVED_SOURCE_KEYS = frozenset({"auto.offset.reset", "key.deserializer", "value.deserializer",
                                  "enable.auto.commit", "interceptor.classes"})
RESERVED_SINK_KEYS = frozenset({"key.serializer", "value.serializer", "transactional.id"})

#: Options Spark itself adds or passes to every source and sink.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})
READ_OPTIONS = SPARK_OPTIONS | frozenset({
    "subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets", "startingtimestamp",
    "endingtimestamp", "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy", "maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay",
    "minpartitions", "maxrecordsperpartition", "groupidprefix", "failondataloss", "includeheaders",
    "kafkaconsumer.polltimeoutms", "remotereads",
})
#: With remoteReads=direct, the brokers' keys that name their remote storage and configure it, as server.properties
#: has them (Kafka's default remote.log.storage.manager.impl.prefix): what executors need to read it themselves.
REMOTE_CLASS_KEY = "remote.log.storage.manager.class.name"
REMOTE_PREFIX = "rsm.config."

#: Spark's default maxTriggerDelay, and its group id prefixes when neither kafka.group.id nor groupIdPrefix is set.
DEFAULT_MAX_TRIGGER_DELAY = "15m"
BATCH_GROUP_PREFIX, STREAMING_GROUP_PREFIX = "spark-kafka-relation", "spark-kafka-source"
#: The suffixes of Spark's time strings (JavaUtils.timeStringAsMs), in milliseconds; no suffix is milliseconds.
TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
WRITE_OPTIONS = SPARK_OPTIONS | frozenset({"topic", "exactlyonce", "transactionalidprefix", "writeid"})
#: The start of the transactional ids (and group ids) of exactly-once writes when transactionalIdPrefix is not set.
DEFAULT_TRANSACTIONAL_ID_PREFIX = "josef-spark"
#: writeId goes into transactional ids and group ids: a bound that keeps them readable (Kafka's is 32767 bytes).
MAX_WRITE_ID_LENGTH = 200


class OptionError(ValueError):
    """An option of the ``josef`` data source is missing, malformed or conflicts with another."""


@attrs.frozen
class OffsetSpec:
    """Where reading starts or ends: ``kind`` is earliest, latest, offsets, timestamp or timestamps."""

    kind: Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]
    #: offsets: {(topic, partition): offset or -2/-1}; timestamps: {(topic, partition): ms}
    per_partition: Mapping[tuple[str, int], int] = attrs.field(factory=dict)
    timestamp: int = -1


@attrs.frozen
class ReadOptions:
    bootstrap_servers: str
    #: Exactly one is set: topic names, a pattern, or explicit partitions.
    subscribe: tuple[str, ...] | None
    subscribe_pattern: re.Pattern[str] | None
    assign: tuple[tuple[str, int], ...] | None
    starting: OffsetSpec
    ending: OffsetSpec
    timestamp_strategy: Literal["error", "latest"]
    max_offsets_per_trigger: int | None
    #: Streaming: a micro-batch waits for this many new offsets, or until max_trigger_delay_ms passed since the last.
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int | None
    #: Split offset ranges so that no Spark task reads more than this many offsets.
    max_records_per_partition: int | None
    #: ``kafka.group.id`` if given (also in client_config), else the prefix of a unique id per query (groupIdPrefix).
    group_id: str | None
    group_id_prefix: str
    fail_on_data_loss: bool
    include_headers: bool
    poll_timeout_ms: int
    #: The ``kafka.*`` options, prefix removed, for josef's consumer and admin client.
    client_config: Mapping[str, Any]
    #: remoteReads=direct: the remote storage's class name and ``rsm.config.*`` settings (prefix removed), so
    #: executors read the records below the brokers' local logs from there. None: every record through the brokers.
    remote_storage: RemoteStorageOptions | None = None


@attrs.frozen
class RemoteStorageOptions:
    class_name: str
    settings: Mapping[str, str]


@attrs.frozen
class WriteOptions:
    bootstrap_servers: str
    topic: str | None
    client_config: Mapping[str, Any]
    #: Each task's rows in one transaction, with its (partition, batch) recorded so no attempt writes them twice.
    exactly_once: bool = True
    transactional_id_prefix: str = DEFAULT_TRANSACTIONAL_ID_PREFIX
    #: Batch writes: the user's name for the write, the same on every run of the job, so a re-run writes only
    #: what earlier runs did not commit. None: a new write id per write.
    write_id: str | None = None


def _kafka_options(options: Mapping[str, str], reserved: frozenset[str], known: frozenset[str],
                   kind: str) -> tuple[str, dict[str, str]]:
    remote = kind == "source"
    unknown = sorted(k for k in options if not k.startswith("kafka.") and k.lower() not in known
                     and not (remote and (k == REMOTE_CLASS_KEY or k.startswith(REMOTE_PREFIX))))
    if unknown:
        raise OptionError(f"unknown {kind} option(s) {', '.join(unknown)}; the josef format takes "
                          f"{', '.join(sorted(known - SPARK_OPTIONS))} and kafka.* client options")
    client = {k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}
    for key in sorted(client):
        if key in reserved:
            raise OptionError(f"kafka.{key} is not supported: the josef {kind} sets it itself")
    servers = client.pop("bootstrap.servers", None)
    if not servers:
        raise OptionError("kafka.bootstrap.servers must be set (host:port[,host:port...])")
    return servers, client


def _check_client_config(kind: str, definitions: Any, servers: str, client: Mapping[str, str]) -> None:
    try:
        build_config(kind, definitions, {"bootstrap.servers": servers, **client}, {})
    except (ConfigError, ValueError) as exc:
        raise OptionError(f"bad kafka.* option: {exc}") from None


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, not {text!r}")
    return text.strip().lower() == "true"


def _positive(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name} must be a positive integer, not {text!r}") from None
    if value <= 0:
        raise OptionError(f"{name} must be a positive integer, not {value}")
    return value


def _duration_ms(options: Mapping[str, str], name: str, default: str) -> int:
    """A Spark time string (``15m``, ``30s``, ``500ms``, ``500``: milliseconds) in milliseconds."""
    text = options.get(name.lower(), default).strip().lower()
    match = re.fullmatch(r"(\d+)\s*([a-z]*)", text)
    if not match or match.group(2) not in ("", *TIME_UNITS_MS):
        raise OptionError(f"{name} must be a duration like 15m, 30s or 500ms "
                          f"(units {', '.join(TIME_UNITS_MS)}; none means ms), not {text!r}")
    return int(int(match.group(1)) * TIME_UNITS_MS.get(match.group(2), 1))


def _json(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{name} is not valid JSON ({exc.msg}): {text!r}") from None


def _partition_map(name: str, text: str, what: str) -> dict[tuple[str, int], int]:
    """``{"topic": {"0": n}}`` as {(topic, 0): n}."""
    data = _json(name, text)
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise OptionError(f'{name} must be a JSON object of topics to {{"partition": {what}}}, not {text!r}')
    result = {}
    for topic, partitions in data.items():
        for partition, value in partitions.items():
            try:
                key = (topic, int(partition))
            except ValueError:
                raise OptionError(f"{name}: {partition!r} of topic {topic!r} is not a partition number") from None
            if not isinstance(value, int) or isinstance(value, bool):
                raise OptionError(f"{name}: {topic}-{partition} must map to an integer {what}, not {value!r}")
            result[key] = value
    return result


def _offset_spec(options: Mapping[str, str], end: Literal["starting", "ending"], default: str) -> OffsetSpec:
    prefix = end
    timestamp = options.get(f"{prefix}timestamp")
    by_timestamp = options.get(f"{prefix}offsetsbytimestamp")
    offsets = options.get(f"{prefix}offsets")
    # As in Spark: a global timestamp beats per-partition timestamps, which beat offsets.
    if timestamp is not None:
        try:
            ms = int(timestamp)
        except ValueError:
            raise OptionError(f"{prefix}Timestamp must be milliseconds since the epoch, not {timestamp!r}") from None
        if ms < 0:
            raise OptionError(f"{prefix}Timestamp must not be negative: {ms}")
        return OffsetSpec("timestamp", timestamp=ms)
    if by_timestamp is not None:
        per_partition = _partition_map(f"{prefix}OffsetsByTimestamp", by_timestamp, "timestamp")
        if any(ms < 0 for ms in per_partition.values()):
            raise OptionError(f"{prefix}OffsetsByTimestamp: timestamps must not be negative")
        return OffsetSpec("timestamps", per_partition)
    text = (offsets if offsets is not None else default).strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(text.lower())  # type: ignore[arg-type]
    if not text.startswith("{"):
        raise OptionError(f'{prefix}Offsets must be "earliest", "latest" or JSON like {{"topic":{{"0":23}}}}, '
                          f"not {text!r}")
    per_partition = _partition_map(f"{prefix}Offsets", text, "offset")
    bad = {k: v for k, v in per_partition.items() if v < EARLIEST}
    if bad:
        (topic, partition), value = next(iter(bad.items()))
        raise OptionError(f"{prefix}Offsets: {topic}-{partition} has offset {value}; use an offset >= 0, "
                          "-2 for earliest or -1 for latest")
    return OffsetSpec("offsets", per_partition)


def read_options(options: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Parse and check the options of a read: ``streaming`` for readStream, None when not yet known (at ``load()``)."""
    options = {k.lower() if not k.startswith("kafka.") else k: v for k, v in options.items()}
    servers, client = _kafka_options(options, RESERVED_SOURCE_KEYS, READ_OPTIONS, "source")
    _check_client_config("consumer", CONSUMER, servers, client)
    strategies = [name for name in ("subscribe", "subscribePattern", "assign") if name.lower() in options]
    if len(strategies) != 1:
        raise OptionError("exactly one of subscribe, subscribePattern or assign must be set"
                          + (f"; got {', '.join(strategies)}" if strategies else ""))
    subscribe = pattern = assign = None
    if "subscribe" in options:
        subscribe = tuple(t.strip() for t in options["subscribe"].split(",") if t.strip())
        if not subscribe:
            raise OptionError("subscribe must name at least one topic (comma-separated)")
    elif "subscribepattern" in options:
        try:
            pattern = re.compile(options["subscribepattern"])
        except re.error as exc:
            raise OptionError(f"subscribePattern is not a valid regular expression: {exc}") from None
    else:
        data = _json("assign", options["assign"])
        if (not isinstance(data, dict) or not data
                or not all(isinstance(v, list) and all(isinstance(p, int) and p >= 0 for p in v) for v in data.values())):
            raise OptionError(f'assign must be JSON like {{"topicA":[0,1],"topicB":[2,4]}}, not {options["assign"]!r}')
        assign = tuple(sorted((topic, p) for topic, partitions in data.items() for p in partitions))

    starting = _offset_spec(options, "starting", "latest" if streaming else "earliest")
    ending = _offset_spec(options, "ending", "latest")
    ending_given = any(f"ending{s}" in options for s in ("offsets", "timestamp", "offsetsbytimestamp"))
    if streaming and ending_given:
        raise OptionError("endingOffsets, endingTimestamp and endingOffsetsByTimestamp are for batch queries only")
    if streaming is False:
        if starting.kind == "latest":
            raise OptionError('startingOffsets="latest" is not valid for batch queries; use "earliest" or JSON offsets')
        if starting.kind == "offsets" and LATEST in starting.per_partition.values():
            raise OptionError("startingOffsets: -1 (latest) is not valid for batch queries")
        if ending.kind == "earliest":
            raise OptionError('endingOffsets="earliest" is not valid for batch queries; use "latest" or JSON offsets')
        if ending.kind == "offsets" and EARLIEST in ending.per_partition.values():
            raise OptionError("endingOffsets: -2 (earliest) is not valid for batch queries")
    if assign is not None:
        for spec, name in ((starting, "starting"), (ending, "ending")):
            extra = set(spec.per_partition) - set(assign)
            if extra:
                topic, partition = sorted(extra)[0]
                raise OptionError(f"{name} offsets name {topic}-{partition}, which assign does not list")
    strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f'startingOffsetsByTimestampStrategy must be "error" or "latest", not {strategy!r}')
    max_per_trigger = _positive(options, "maxOffsetsPerTrigger")
    min_per_trigger = _positive(options, "minOffsetsPerTrigger")
    max_delay_ms = _duration_ms(options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY)
    if streaming is False:
        for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if name.lower() in options:
                raise OptionError(f"{name} is for streaming queries only")
    if min_per_trigger is not None and max_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise OptionError(f"minOffsetsPerTrigger ({min_per_trigger}) is higher than maxOffsetsPerTrigger "
                          f"({max_per_trigger})")
    if "group.id" in client and not client["group.id"].strip():
        raise OptionError("kafka.group.id must not be empty")
    prefix = options.get("groupidprefix", STREAMING_GROUP_PREFIX if streaming else BATCH_GROUP_PREFIX).strip()
    if not prefix:
        raise OptionError("groupIdPrefix must not be empty")
    return ReadOptions(
        bootstrap_servers=servers, subscribe=subscribe, subscribe_pattern=pattern, assign=assign,
        starting=starting, ending=ending, timestamp_strategy=strategy,  # type: ignore[arg-type]
        max_offsets_per_trigger=max_per_trigger, min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=max_delay_ms, min_partitions=_positive(options, "minPartitions"),
        max_records_per_partition=_positive(options, "maxRecordsPerPartition"),
        group_id=client.get("group.id"), group_id_prefix=prefix,
        fail_on_data_loss=_flag(options, "failOnDataLoss", True), include_headers=_flag(options, "includeHeaders", False),
        poll_timeout_ms=_positive(options, "kafkaConsumer.pollTimeoutMs") or 120_000, client_config=client,
        remote_storage=_remote_storage(options),
    )


def _remote_storage(options: Mapping[str, str]) -> RemoteStorageOptions | None:
    """remoteReads: ``broker`` (the default: Spark's Kafka source's way) or ``direct`` with the remote storage keys."""
    mode = options.get("remotereads", "broker").strip().lower()
    given = sorted(k for k in options if k == REMOTE_CLASS_KEY or k.startswith(REMOTE_PREFIX))
    if mode == "broker":
        if given:
            raise OptionError(f"{given[0]} is for remoteReads=direct only (the brokers read remote storage otherwise)")
        return None
    if mode != "direct":
        raise OptionError(f"remoteReads must be broker or direct, not {mode!r}")
    class_name = options.get(REMOTE_CLASS_KEY, "").strip()
    if not class_name:
        raise OptionError(f"remoteReads=direct needs {REMOTE_CLASS_KEY} and the {REMOTE_PREFIX}* settings of the "
                          "brokers' remote storage, as their server.properties has them")
    try:
        from josef.plugins import PluginError
        from josef_storage_tiered.remote import select
    except ImportError:
        raise OptionError("remoteReads=direct needs josef-storage-tiered beside josef-spark, on the driver and the "
                          "executors: pip install 'josef-spark[tiered]'") from None
    settings = {k[len(REMOTE_PREFIX):]: v for k, v in options.items() if k.startswith(REMOTE_PREFIX)}
    try:
        select(class_name, settings)
    except PluginError as exc:  # a class name no installed backend answers to
        raise OptionError(f"{REMOTE_CLASS_KEY}: {exc}") from None
    return RemoteStorageOptions(class_name, settings)


def write_options(options: Mapping[str, str], *, streaming: bool = False) -> WriteOptions:
    """Parse and check the options of a batch write, or of a streaming one."""
    options = {k.lower() if not k.startswith("kafka.") else k: v for k, v in options.items()}
    servers, client = _kafka_options(options, RESERVED_SINK_KEYS, WRITE_OPTIONS, "sink")
    _check_client_config("producer", PRODUCER, servers, client)
    topic = options.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("topic must not be empty")
    exactly_once = _flag(options, "exactlyOnce", True)
    if exactly_once and str(client.get("enable.idempotence", "true")).strip().lower() == "false":
        raise OptionError("exactlyOnce writes are transactional, so idempotent: drop kafka.enable.idempotence=false "
                          "or set exactlyOnce=false")
    prefix = options.get("transactionalidprefix", DEFAULT_TRANSACTIONAL_ID_PREFIX).strip()
    if not prefix:
        raise OptionError("transactionalIdPrefix must not be empty")
    write_id = options.get("writeid")
    if write_id is not None:
        write_id = write_id.strip()
        if streaming:
            raise OptionError("writeId is for batch writes: a streaming query's writes are named by its id, "
                              "kept in its checkpoint")
        if not exactly_once:
            raise OptionError("writeId needs exactlyOnce=true: it names the transactions a re-run finds")
        if not write_id or len(write_id) > MAX_WRITE_ID_LENGTH:
            raise OptionError(f"writeId must be 1 to {MAX_WRITE_ID_LENGTH} characters")
    return WriteOptions(servers, topic.strip() if topic else None, client, exactly_once, prefix, write_id)
