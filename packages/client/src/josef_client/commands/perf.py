"""``josef perf produce`` and ``josef perf consume``: Kafka's producer and consumer performance tests.

Their output is Kafka's, line for line, so results can be compared with
``kafka-producer-perf-test.sh`` and ``kafka-consumer-perf-test.sh``.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import functools
import random
import time
from pathlib import Path
from typing import Any

import click

from josef_client.commands.common import (
    Group,
    admin_client,
    bootstrap_option,
    client_config,
    make_client,
    parse_pairs,
    read_properties,
    require_topic,
    run,
    stderr,
)

REPORT_INTERVAL_S = 5.0
#: Runs up to this many records measure the latency of every record.
ALL_LATENCIES = 10_000
#: Longer runs measure every n-th record, n at most MAX_SAMPLING, keeping at least MIN_SAMPLES latencies.
MIN_SAMPLES = 10_000
MAX_SAMPLING = 16
#: Records sent between two chances for the producer's sender to run.
YIELD_EVERY = 64
#: Pacing sleeps only when this far ahead of the target rate, so it never sleeps per record at high rates.
PACING_QUANTUM_S = 0.005


@click.group("perf", cls=Group)
def perf() -> None:
    """Producer and consumer performance tests (kafka-producer-perf-test, kafka-consumer-perf-test)."""


def _props(options: tuple[str, ...], trailing: tuple[str, ...], flag: str) -> dict[str, str]:
    """``--flag a=1 b=2`` (Kafka's spelling: the extra pairs arrive as arguments) and ``--flag a=1 --flag b=2``."""
    return parse_pairs(options + trailing, flag)


# produce -------------------------------------------------------------------------------------------------


class ProduceStats:
    """Kafka's ProducerPerformance.Stats: totals, windows, and latencies for the average and percentiles.

    Counting is exact and cheap: each record's future waits in a queue that
    :meth:`drain` empties from the front as records are acknowledged.
    Latency needs a callback per record, which would cost the producer about
    a third of its speed, so only every ``sampling``-th record carries one
    (every record in runs of up to ``ALL_LATENCIES`` records).
    """

    def __init__(self, num_records: int, interval_s: float = REPORT_INTERVAL_S, echo: Any = click.echo) -> None:
        self.start = time.monotonic()
        self.finished: float | None = None
        self.echo = echo
        self.interval_s = interval_s
        self.sampling = 1 if num_records <= ALL_LATENCIES else min(MAX_SAMPLING, max(1, num_records // MIN_SAMPLES))
        self.samples: list[float] = []
        self.pending: collections.deque[tuple[Any, int]] = collections.deque()
        self.count = self.bytes = 0
        self.total_latency = self.max_latency = 0.0
        self.failed = 0
        self.first_error: BaseException | None = None
        self._window_start = self.start
        self._window_count = self._window_bytes = self._window_samples = 0
        self._window_latency = self._window_max = 0.0

    def sent(self, future: Any, size: int) -> None:
        self.pending.append((future, size))

    def latency(self, sent_at: float, metadata: Any, error: BaseException | None) -> None:
        """The delivery callback of a sampled record."""
        if error is not None:
            return
        latency = (time.monotonic() - sent_at) * 1000
        self.samples.append(latency)
        self.total_latency += latency
        self.max_latency = max(self.max_latency, latency)
        self._window_samples += 1
        self._window_latency += latency
        self._window_max = max(self._window_max, latency)

    def drain(self, now: float | None = None) -> None:
        """Count the records acknowledged so far, in order; print a window line when one is due."""
        pending = self.pending
        while pending and pending[0][0].done():
            future, size = pending.popleft()
            error = future.exception()
            if error is None:
                self.count += 1
                self.bytes += size
                self._window_count += 1
                self._window_bytes += size
            else:
                self.failed += 1
                if self.first_error is None:
                    self.first_error = error
                    stderr(f"Error: a record was not delivered: {error}")
        now = time.monotonic() if now is None else now
        if now - self._window_start >= self.interval_s and self._window_count:  # as Kafka's: no window without records
            self.print_window(now)

    async def report(self) -> None:
        """Drain in the background, so windows are printed while sending and while flushing."""
        while True:
            await asyncio.sleep(min(self.interval_s, 0.05))
            self.drain()

    def print_window(self, now: float) -> None:
        elapsed = max(now - self._window_start, 1e-9)
        count = self._window_count
        self.echo(f"{count} records sent, {count / elapsed:.1f} records/sec ({self._window_bytes / elapsed / 1048576:.2f} MB/sec), "
                  f"{self._window_latency / max(self._window_samples, 1):.1f} ms avg latency, {self._window_max:.1f} ms max latency.")
        self._window_start = now
        self._window_count = self._window_bytes = self._window_samples = 0
        self._window_latency = self._window_max = 0.0

    def summary(self, now: float | None = None) -> str:
        elapsed = max((now or self.finished or time.monotonic()) - self.start, 1e-9)
        samples = sorted(self.samples)

        def percentile(p: float) -> int:
            return int(samples[min(int(p * len(samples)), len(samples) - 1)]) if samples else 0

        return (f"{self.count} records sent, {self.count / elapsed:f} records/sec ({self.bytes / elapsed / 1048576:.2f} MB/sec), "
                f"{self.total_latency / max(len(samples), 1):.2f} ms avg latency, {self.max_latency:.2f} ms max latency, "
                f"{percentile(0.5)} ms 50th, {percentile(0.95)} ms 95th, {percentile(0.99)} ms 99th, "
                f"{percentile(0.999)} ms 99.9th.")


def _payloads(record_size: int | None, payload_file: Path | None, delimiter: str) -> list[bytes]:
    if (record_size is None) == (payload_file is None):
        raise click.ClickException("give exactly one of --record-size and --payload-file")
    if record_size is not None:
        rng = random.Random()
        return [bytes(rng.randrange(65, 91) for _ in range(record_size))]  # A-Z, as Kafka's tool sends
    assert payload_file is not None
    try:
        text = payload_file.read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {payload_file}: {exc.strerror or exc}") from None
    payloads = [p for p in text.split(delimiter.encode().decode("unicode_escape").encode()) if p]
    if not payloads:
        raise click.ClickException(f"{payload_file} holds no payloads")
    return payloads


@perf.command("produce", context_settings={"allow_interspersed_args": True})
@bootstrap_option
@click.option("--topic", required=True, help="The topic to produce to.")
@click.option("--num-records", required=True, type=click.IntRange(min=1), help="How many records to send.")
@click.option("--record-size", type=click.IntRange(min=0), help="Bytes of each record's value.")
@click.option("--payload-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Send values picked at random from this file instead (split by --payload-delimiter).")
@click.option("--payload-delimiter", default="\\n", show_default=True, help="Separates the payloads of --payload-file.")
@click.option("--throughput", required=True, type=float,
              help="Target records per second; -1 for as fast as possible.")
@click.option("--producer-props", "producer_props", multiple=True, metavar="KEY=VALUE ...",
              help="Producer configs, as in Kafka: --producer-props acks=1 linger.ms=5.")
@click.option("--producer.config", "producer_config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A properties file of producer configs.")
@click.option("--acks", type=click.Choice(["all", "-1", "0", "1"]), help="Shorthand for --producer-props acks=...")
@click.option("--compression", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
              help="Shorthand for --producer-props compression.type=...")
@click.option("--reporting-interval", "interval_ms", default=int(REPORT_INTERVAL_S * 1000), show_default=True,
              type=click.IntRange(min=1), help="Milliseconds between progress lines.")
@click.argument("more_props", nargs=-1, metavar="")
def produce(bootstrap_server: str, topic: str, num_records: int, record_size: int | None, payload_file: Path | None,
            payload_delimiter: str, throughput: float, producer_props: tuple[str, ...], producer_config: Path | None,
            acks: str | None, compression: str | None, interval_ms: int, more_props: tuple[str, ...]) -> None:
    """Send --num-records records as fast as possible or at --throughput, reporting every 5 s and at the end."""
    from josef_client.producer import AsyncProducer

    if throughput == 0 or (throughput < 0 and throughput != -1):
        raise click.ClickException("--throughput must be positive, or -1 for no limit")
    payloads = _payloads(record_size, payload_file, payload_delimiter)
    flags = {k: v for k, v in (("acks", acks), ("compression.type", compression)) if v is not None}
    config = client_config(bootstrap_server, read_properties(producer_config),
                           _props(producer_props, more_props, "--producer-props"), flags)

    async def go() -> ProduceStats:
        async with admin_client(bootstrap_server) as admin:
            await require_topic(admin, topic, auto_create=True)
        producer = make_client(AsyncProducer, config)
        await producer.start()
        stats = ProduceStats(num_records, interval_ms / 1000)
        reporter = asyncio.ensure_future(stats.report())
        try:
            sent, latency, sampling = stats.sent, stats.latency, stats.sampling
            single = payloads[0] if len(payloads) == 1 else None
            choose = random.Random().choice
            start = stats.start
            for index in range(num_records):
                if throughput > 0:
                    ahead = start + index / throughput - time.monotonic()
                    if ahead > PACING_QUANTUM_S:
                        await asyncio.sleep(ahead)
                if index % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # let the sender, the acknowledgements and the reporter run
                value = single if single is not None else choose(payloads)
                if index % sampling == 0:
                    future = await producer.send(topic, value=value, on_delivery=functools.partial(latency, time.monotonic()))
                else:
                    future = await producer.send(topic, value=value)
                sent(future, len(value))
            await producer.flush()
            stats.finished = time.monotonic()
            stats.drain(stats.finished)
            return stats
        finally:
            reporter.cancel()
            await producer.close()

    stats = run(go())
    click.echo(stats.summary())
    if stats.failed:
        raise click.ClickException(f"{stats.failed} of {num_records} records were not delivered; the first error: {stats.first_error}")


# consume -------------------------------------------------------------------------------------------------


def _kafka_time(ms: float) -> str:
    """Kafka's default --date-format, yyyy-MM-dd HH:mm:ss:SSS, in local time."""
    moment = datetime.datetime.fromtimestamp(ms / 1000)
    return moment.strftime("%Y-%m-%d %H:%M:%S:") + f"{moment.microsecond // 1000:03d}"


CONSUME_HEADER = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
                  "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")


def consume_line(start_ms: float, end_ms: float, setup_ms: float, total_bytes: int, records: int) -> str:
    elapsed = max(end_ms - start_ms, 1e-6) / 1000
    fetch = max(end_ms - start_ms - setup_ms, 1e-6) / 1000
    mb = total_bytes / 1048576
    return (f"{_kafka_time(start_ms)}, {_kafka_time(end_ms)}, {mb:.4f}, {mb / elapsed:.4f}, {records}, "
            f"{records / elapsed:.4f}, {int(setup_ms)}, {int(fetch * 1000)}, {mb / fetch:.4f}, {records / fetch:.4f}")


@perf.command("consume", context_settings={"allow_interspersed_args": True})
@bootstrap_option
@click.option("--topic", required=True, help="The topic to read.")
@click.option("--messages", required=True, type=click.IntRange(min=1), help="How many records to read.")
@click.option("--timeout", "timeout_ms", default=10000, show_default=True, type=click.IntRange(min=0),
              help="Give up when no record arrives for this many ms.")
@click.option("--consumer-props", "consumer_props", multiple=True, metavar="KEY=VALUE ...",
              help="Consumer configs: --consumer-props fetch.max.bytes=1048576 max.poll.records=1000.")
@click.option("--consumer.config", "consumer_config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A properties file of consumer configs.")
@click.option("--fetch-size", type=click.IntRange(min=1), help="max.partition.fetch.bytes.")
@click.option("--from-latest", is_flag=True, help="Read only records produced after the start, not the whole topic.")
@click.option("--hide-header", is_flag=True, help="Print the result line without the header line.")
@click.argument("more_props", nargs=-1, metavar="")
def consume(bootstrap_server: str, topic: str, messages: int, timeout_ms: int, consumer_props: tuple[str, ...],
            consumer_config: Path | None, fetch_size: int | None, from_latest: bool, hide_header: bool,
            more_props: tuple[str, ...]) -> None:
    """Read --messages records from every partition of --topic and report the throughput.

    No group is joined: rebalance.time.ms is the time taken to find the
    partitions and their start offsets.
    """
    from josef.protocol.topic_partition import TopicPartition
    from josef_client.consumer import AsyncConsumer

    flags: dict[str, Any] = {"auto.offset.reset": "latest" if from_latest else "earliest", "enable.auto.commit": False}
    if fetch_size is not None:
        flags["max.partition.fetch.bytes"] = fetch_size
    config = client_config(bootstrap_server, flags, read_properties(consumer_config),
                           _props(consumer_props, more_props, "--consumer-props"))

    async def go() -> tuple[float, float, float, int, int, bool]:
        start_ms = time.time() * 1000
        async with admin_client(bootstrap_server) as admin:
            description = await require_topic(admin, topic)
        tps = [TopicPartition(topic, p.partition) for p in description.partitions]
        consumer = make_client(AsyncConsumer, config)
        try:
            await consumer.start()
            consumer.assign(tps)
            if from_latest:
                await consumer.seek_to_end(*tps)
            else:
                await consumer.seek_to_beginning(*tps)
            setup_ms = time.time() * 1000 - start_ms
            count = total = 0
            last = time.monotonic()
            end_ms = time.time() * 1000
            while count < messages:
                remaining = timeout_ms - (time.monotonic() - last) * 1000
                if remaining <= 0:
                    return start_ms, end_ms, setup_ms, total, count, True
                polled = await consumer.poll(timeout_ms=min(remaining, 1000), max_records=min(messages - count, 100_000))
                if not polled:
                    continue
                for records in polled.values():
                    count += len(records)
                    for record in records:
                        total += (len(record.key) if record.key is not None else 0) + (
                            len(record.value) if record.value is not None else 0)
                last = time.monotonic()
                end_ms = time.time() * 1000
            return start_ms, end_ms, setup_ms, total, count, False
        finally:
            await consumer.close()

    start_ms, end_ms, setup_ms, total, count, timed_out = run(go())
    if timed_out:
        stderr(f"WARNING: Exiting before consuming the expected number of messages: timeout ({timeout_ms} ms) exceeded. "
               "You can use the --timeout option to increase the timeout.")
    if not hide_header:
        click.echo(CONSUME_HEADER)
    click.echo(consume_line(start_ms, end_ms, setup_ms, total, count))
