"""``josef console-producer`` and ``josef console-consumer``: lines from stdin to a topic, records to stdout.

They take the flags and ``--property`` names of Kafka's console tools. The
consumer joins no group: it reads every partition of the topic (or the one
given with ``--partition``) from where it is told to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import click

from josef_client.commands.common import (
    Command,
    admin_client,
    bootstrap_option,
    client_config,
    make_client,
    parse_bool,
    parse_pairs,
    quiet_broken_pipe,
    read_properties,
    require_topic,
    run,
    stderr,
    unescape,
    user_errors,
)

#: Properties of Kafka's LineMessageReader that josef's console producer understands.
READER_PROPERTIES = {"parse.key": "false", "key.separator": "\t", "ignore.error": "false", "null.marker": None,
                     "parse.headers": "false", "headers.delimiter": "\t", "headers.separator": ",",
                     "headers.key.separator": ":"}

#: Properties of Kafka's DefaultMessageFormatter that josef's console consumer understands.
FORMATTER_PROPERTIES = {"print.timestamp": "false", "print.key": "false", "print.value": "true",
                        "print.partition": "false", "print.offset": "false", "print.headers": "false",
                        "key.separator": "\t", "line.separator": "\n", "headers.separator": ",",
                        "null.literal": "null"}


def _properties(given: tuple[str, ...], known: dict[str, str | None], tool: str) -> dict[str, str | None]:
    values = dict(known)
    for name, value in parse_pairs(given, "--property").items():
        if name not in known:
            raise click.ClickException(f"unknown {tool} --property {name!r}; known: {', '.join(sorted(known))}")
        values[name] = value
    return values


# console-producer ------------------------------------------------------------------------------------------


class LineReader:
    """Turns stdin lines into (key, value, headers) the way Kafka's LineMessageReader does."""

    def __init__(self, props: dict[str, str | None]) -> None:
        self.parse_key = parse_bool(props["parse.key"] or "", "parse.key")
        self.parse_headers = parse_bool(props["parse.headers"] or "", "parse.headers")
        self.ignore_error = parse_bool(props["ignore.error"] or "", "ignore.error")
        self.key_separator = unescape(props["key.separator"] or "").encode()
        self.headers_delimiter = unescape(props["headers.delimiter"] or "").encode()
        self.headers_separator = unescape(props["headers.separator"] or "").encode()
        self.header_key_separator = unescape(props["headers.key.separator"] or "").encode()
        marker = props["null.marker"]
        self.null_marker = None if marker is None else unescape(marker).encode()
        for name, value in (("key.separator", self.key_separator), ("headers.delimiter", self.headers_delimiter),
                            ("headers.separator", self.headers_separator),
                            ("headers.key.separator", self.header_key_separator)):
            if not value:
                raise click.ClickException(f"property {name} must not be empty")

    def _null(self, value: bytes | None) -> bytes | None:
        return None if value is not None and value == self.null_marker else value

    def parse(self, line: bytes, number: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
        headers: list[tuple[str, bytes | None]] = []
        rest: bytes = line
        if self.parse_headers:
            head, sep, tail = rest.partition(self.headers_delimiter)
            if not sep:
                if not self.ignore_error:
                    raise click.ClickException(f"No headers delimiter found on line number {number}: '{_show(line)}'")
            else:
                rest = tail
                for item in head.split(self.headers_separator) if head else ():
                    name, hsep, value = item.partition(self.header_key_separator)
                    headers.append((name.decode("utf-8", "replace"), self._null(value) if hsep else None))
        key: bytes | None = None
        if self.parse_key:
            k, sep, value = rest.partition(self.key_separator)
            if not sep:
                if not self.ignore_error:
                    raise click.ClickException(f"No key separator found on line number {number}: '{_show(line)}'")
                return None, self._null(rest), headers
            key, rest = self._null(k), value
        return key, self._null(rest), headers


def _show(line: bytes) -> str:
    text = line.decode("utf-8", "replace")
    return text if len(text) <= 200 else text[:200] + "..."


def _lines(stream: BinaryIO) -> Any:
    for raw in stream:
        line = raw[:-1] if raw.endswith(b"\n") else raw
        yield line[:-1] if line.endswith(b"\r") else line


@click.command("console-producer", cls=Command)
@bootstrap_option
@click.option("--topic", required=True, help="The topic to produce to.")
@click.option("--property", "properties", multiple=True, metavar="KEY=VALUE",
              help="How lines are read: parse.key, key.separator (default tab), parse.headers, headers.delimiter, "
                   "headers.separator, headers.key.separator, null.marker, ignore.error (repeatable).")
@click.option("--producer-property", "producer_properties", multiple=True, metavar="KEY=VALUE",
              help="A producer config (repeatable); overrides --producer.config.")
@click.option("--producer.config", "producer_config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A properties file of producer configs.")
@click.option("--request-required-acks", type=click.Choice(["all", "-1", "0", "1"]), help="acks (default all).")
@click.option("--compression-codec", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]), help="compression.type.")
@click.option("--sync", is_flag=True, help="Wait for each record to be acknowledged before reading the next line.")
def console_producer(bootstrap_server: str, topic: str, properties: tuple[str, ...], producer_properties: tuple[str, ...],
                     producer_config: Path | None, request_required_acks: str | None, compression_codec: str | None,
                     sync: bool) -> None:
    """Send each line of stdin to TOPIC as one record (with a key, given --property parse.key=true)."""
    from josef_client.producer import Producer

    reader = LineReader(_properties(properties, READER_PROPERTIES, "console-producer"))
    flags = {k: v for k, v in (("acks", request_required_acks), ("compression.type", compression_codec)) if v is not None}
    config = client_config(bootstrap_server, read_properties(producer_config), flags,
                           parse_pairs(producer_properties, "--producer-property"))

    async def check() -> None:
        async with admin_client(bootstrap_server) as admin:
            await require_topic(admin, topic, auto_create=True)

    run(check())
    producer = make_client(Producer, config)
    failures: list[BaseException] = []

    def delivered(metadata: Any, error: BaseException | None) -> None:
        if error is not None:
            if not failures:
                stderr(f"Error: a record was not delivered: {error}")
            failures.append(error)

    sent = 0
    try:
        with user_errors():
            for number, line in enumerate(_lines(sys.stdin.buffer), 1):
                key, value, headers = reader.parse(line, number)
                future = producer.send(topic, value=value, key=key, headers=headers or None, on_delivery=delivered)
                sent += 1
                if sync:
                    with contextlib.suppress(Exception):  # a failure is reported by the delivery callback
                        future.result()
            producer.flush()
    except KeyboardInterrupt:
        pass
    finally:
        with user_errors():
            producer.close()
    if failures:
        raise click.ClickException(f"{len(failures)} of {sent} records were not delivered; the first error: {failures[0]}")


# console-consumer -----------------------------------------------------------------------------------------


TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


class Formatter:
    """Writes records the way Kafka's DefaultMessageFormatter does: fields joined by key.separator."""

    def __init__(self, props: dict[str, str | None]) -> None:
        flag = {name: parse_bool(props[name] or "", name) for name in props if name.startswith("print.")}
        self.timestamp, self.key, self.value = flag["print.timestamp"], flag["print.key"], flag["print.value"]
        self.partition, self.offset, self.headers = flag["print.partition"], flag["print.offset"], flag["print.headers"]
        self.separator = unescape(props["key.separator"] or "").encode()
        self.line_separator = unescape(props["line.separator"] or "").encode()
        self.headers_separator = unescape(props["headers.separator"] or "").encode()
        self.null = unescape(props["null.literal"] or "").encode()

    def _bytes(self, value: Any) -> bytes:
        if value is None:
            return self.null
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        return str(value).encode()

    def format(self, record: Any) -> bytes:
        fields = []
        if self.timestamp:
            kind = record.timestamp_type
            kind = TIMESTAMP_TYPES.get(kind, getattr(kind, "name", str(kind))) if not isinstance(kind, str) else kind
            fields.append(b"NO_TIMESTAMP" if record.timestamp < 0 else f"{kind}:{record.timestamp}".encode())
        if self.partition:
            fields.append(f"Partition:{record.partition}".encode())
        if self.offset:
            fields.append(f"Offset:{record.offset}".encode())
        if self.headers:
            headers = record.headers or ()
            fields.append(self.headers_separator.join(
                name.encode() + b":" + self._bytes(value) for name, value in headers) if headers else b"NO_HEADERS")
        if self.key:
            fields.append(self._bytes(record.key))
        if self.value:
            fields.append(self._bytes(record.value))
        return self.separator.join(fields) + self.line_separator


def parse_offset(text: str | None) -> int | str | None:
    if text is None:
        return None
    lowered = text.strip().lower()
    if lowered in ("earliest", "latest"):
        return lowered
    try:
        offset = int(lowered)
    except ValueError:
        offset = -1
    if offset < 0:
        raise click.ClickException(f"--offset {text!r} is not valid: give earliest, latest or an offset >= 0")
    return offset


@click.command("console-consumer", cls=Command)
@bootstrap_option
@click.option("--topic", required=True, help="The topic to read.")
@click.option("--partition", type=click.IntRange(min=0), help="Read only this partition (default: all of them).")
@click.option("--offset", "offset_text", metavar="OFFSET|earliest|latest",
              help="Where to start in --partition (default: latest, or earliest with --from-beginning).")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest record instead of the end.")
@click.option("--max-messages", type=click.IntRange(min=1), help="Stop after this many records.")
@click.option("--timeout-ms", type=click.IntRange(min=0), help="Stop when no record arrives for this long.")
@click.option("--property", "properties", multiple=True, metavar="KEY=VALUE",
              help="How records are printed: print.key, print.value, print.timestamp, print.partition, print.offset, "
                   "print.headers, key.separator, line.separator, headers.separator, null.literal (repeatable).")
@click.option("--consumer-property", "consumer_properties", multiple=True, metavar="KEY=VALUE",
              help="A consumer config (repeatable); overrides --consumer.config.")
@click.option("--consumer.config", "consumer_config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A properties file of consumer configs.")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              help="read_committed hides aborted transactions.")
@quiet_broken_pipe
def console_consumer(bootstrap_server: str, topic: str, partition: int | None, offset_text: str | None,
                     from_beginning: bool, max_messages: int | None, timeout_ms: int | None,
                     properties: tuple[str, ...], consumer_properties: tuple[str, ...], consumer_config: Path | None,
                     isolation_level: str | None) -> None:
    """Print the records of TOPIC to stdout, one a line; a summary goes to stderr at the end."""
    from josef.protocol.topic_partition import TopicPartition
    from josef_client.consumer import AsyncConsumer

    formatter = Formatter(_properties(properties, FORMATTER_PROPERTIES, "console-consumer"))
    offset = parse_offset(offset_text)
    if offset is not None and partition is None:
        raise click.ClickException("--partition is required when --offset is given")
    if offset is not None and from_beginning:
        raise click.ClickException("--from-beginning and --offset cannot be combined")
    flags = {"auto.offset.reset": "earliest" if from_beginning else "latest", "enable.auto.commit": False}
    if isolation_level:
        flags["isolation.level"] = isolation_level
    config = client_config(bootstrap_server, flags, read_properties(consumer_config),
                           parse_pairs(consumer_properties, "--consumer-property"))
    out = sys.stdout.buffer
    count = 0
    started = False

    async def go() -> None:
        nonlocal count, started
        async with admin_client(bootstrap_server) as admin:
            description = await require_topic(admin, topic)
        indexes = [p.partition for p in description.partitions]
        if partition is not None:
            if partition not in indexes:
                raise click.ClickException(f"topic {topic!r} has no partition {partition} (it has {len(indexes)})")
            indexes = [partition]
        tps = [TopicPartition(topic, p) for p in indexes]
        consumer = make_client(AsyncConsumer, config)
        stop = asyncio.Event()
        _on_signals(stop.set)
        try:
            await consumer.start()
            started = True
            consumer.assign(tps)
            if offset == "earliest" or (offset is None and from_beginning):
                await consumer.seek_to_beginning(*tps)
            elif offset == "latest" or offset is None:
                await consumer.seek_to_end(*tps)
            else:
                consumer.seek(tps[0], offset)
            last = time.monotonic()
            while not stop.is_set():
                wait_ms = 500.0
                if timeout_ms is not None:
                    wait_ms = max(0.0, min(wait_ms, timeout_ms - (time.monotonic() - last) * 1000))
                polled = await _poll_or_stop(consumer, wait_ms, stop,
                                             None if max_messages is None else max_messages - count)
                if not polled:
                    if timeout_ms is not None and (time.monotonic() - last) * 1000 >= timeout_ms:
                        break
                    continue
                last = time.monotonic()
                chunk = []
                for records in polled.values():
                    for record in records:
                        chunk.append(formatter.format(record))
                count += len(chunk)
                out.write(b"".join(chunk))
                out.flush()
                if max_messages is not None and count >= max_messages:
                    break
        finally:
            await consumer.close()

    try:
        run(go())
    finally:
        if started:
            stderr(f"Processed a total of {count} messages")


def _on_signals(callback: Callable[[], None]) -> None:
    """Ctrl-C and SIGTERM end the consumer cleanly: the summary is still printed."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, callback)
        except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
            pass


async def _poll_or_stop(consumer: Any, wait_ms: float, stop: asyncio.Event, limit: int | None) -> dict[Any, Any]:
    poll = asyncio.ensure_future(consumer.poll(timeout_ms=wait_ms, max_records=limit))
    stopped = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({poll, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if poll in done:
        return poll.result()
    poll.cancel()
    try:
        await poll
    except asyncio.CancelledError:
        pass
    return {}


@click.command("console-share-consumer", cls=Command)
@bootstrap_option
@click.option("--topic", required=True, help="The topic to read.")
@click.option("--group", default="console-share-consumer", show_default=True, help="The share group to join.")
@click.option("--max-messages", type=click.IntRange(min=1), help="Stop after this many records.")
@click.option("--timeout-ms", type=click.IntRange(min=0), help="Stop when no record arrives for this long.")
@click.option("--reject", is_flag=True, help="Acknowledge every record with REJECT instead of ACCEPT.")
@click.option("--release", is_flag=True, help="Acknowledge every record with RELEASE (it is delivered again).")
@click.option("--property", "properties", multiple=True, metavar="KEY=VALUE",
              help="How records are printed, as console-consumer's --property (print.key, print.offset...).")
@click.option("--consumer-property", "consumer_properties", multiple=True, metavar="KEY=VALUE",
              help="A share consumer setting (repeatable).")
@click.option("--consumer.config", "consumer_config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A properties file of share consumer settings.")
def console_share_consumer(bootstrap_server: str, topic: str, group: str, max_messages: int | None,
                           timeout_ms: int | None, reject: bool, release: bool, properties: tuple[str, ...],
                           consumer_properties: tuple[str, ...], consumer_config: Path | None) -> None:
    """Print the records a share group member is given from TOPIC (kafka-console-share-consumer), acknowledging
    each (ACCEPT, or --reject / --release); a summary goes to stderr at the end."""
    from josef_client.share_consumer import AcknowledgeType, AsyncShareConsumer

    if reject and release:
        raise click.ClickException("give --reject or --release, not both")
    kind = AcknowledgeType.REJECT if reject else AcknowledgeType.RELEASE if release else AcknowledgeType.ACCEPT
    formatter = Formatter(_properties(properties, FORMATTER_PROPERTIES, "console-share-consumer"))
    config = client_config(bootstrap_server, {"group.id": group, "share.acknowledgement.mode": "explicit"},
                           read_properties(consumer_config), parse_pairs(consumer_properties, "--consumer-property"))
    config.pop("enable.auto.commit", None)
    out = sys.stdout.buffer
    count = 0

    async def go() -> None:
        nonlocal count
        consumer = make_client(AsyncShareConsumer, config)
        stop = asyncio.Event()
        _on_signals(stop.set)
        try:
            await consumer.start()
            consumer.subscribe([topic])
            last = time.monotonic()
            while not stop.is_set() and (max_messages is None or count < max_messages):
                wait_ms = 500.0
                if timeout_ms is not None:
                    wait_ms = max(0.0, min(wait_ms, timeout_ms - (time.monotonic() - last) * 1000))
                records = await consumer.poll(wait_ms)
                if not records:
                    if timeout_ms is not None and (time.monotonic() - last) * 1000 >= timeout_ms:
                        break
                    continue
                last = time.monotonic()
                if max_messages is not None:
                    for record in records[max_messages - count:]:
                        consumer.acknowledge(record, AcknowledgeType.RELEASE)  # not shown: for someone else
                    records = records[:max_messages - count]
                for record in records:
                    consumer.acknowledge(record, kind)
                out.write(b"".join(formatter.format(record) for record in records))
                out.flush()
                count += len(records)
            await consumer.commit_sync()
        finally:
            await consumer.close()

    try:
        run(go())
    finally:
        stderr(f"Processed a total of {count} messages")
