"""``josef dump-log``: Kafka's ``kafka-dump-log.sh`` (DumpLogSegments), over the files of a log directory.

It reads the files themselves, so it works on a stopped broker's directory
(or a copy of Kafka's): ``.log`` segments and ``.checkpoint`` KRaft snapshots
(the same record-batch format), ``.index``, ``.timeindex``, ``.txnindex`` and
producer-state ``.snapshot`` files, and prints them in the shapes Kafka's tool
prints, so scripts written for ``kafka-dump-log.sh`` read josef's output::

    Dumping /data/t-0/00000000000000000000.log
    Log starting offset: 0
    baseOffset: 0 lastOffset: 1 count: 2 baseSequence: 0 lastSequence: 1 producerId: 7 producerEpoch: 0 \
partitionLeaderEpoch: 1 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 0 \
CreateTime: 1700000000000 size: 90 magic: 2 compresscodec: none crc: 1872123461 isvalid: true
    | offset: 0 CreateTime: 1700000000000 keySize: 1 valueSize: 2 sequence: 0 headerKeys: [] key: k payload: v1

Decoders: ``--cluster-metadata-decoder`` prints ``__cluster_metadata`` values
as Kafka's ``MetadataRecordSerde`` JSON (type in upper snake case, Kafka's
camelCase field names, tagged fields only when they differ from their
default, UUIDs as Kafka's base64 text). ``--offsets-decoder`` and
``--transaction-log-decoder`` print the records of ``__consumer_offsets`` and
``__transaction_state`` as Kafka's coordinator record parsers do; their
schemas belong to the coordinator plugins, which offer the decoders through
the ``register_record_decoders`` hook (``offsets``, ``transaction-log``), as
tiered storage offers ``--remote-log-metadata-decoder`` (``__remote_log_metadata``), the share
coordinator ``--share-group-state-decoder`` (``__share_group_state``).
Control records are decoded whatever the flags (transaction markers,
LeaderChange, SnapshotHeader/Footer, KRaftVersion, KRaftVoters).

A corrupt or truncated file is reported as Kafka reports it (``isvalid:
false``, ``Found N invalid bytes at the end of ...``, index mismatches and
failed sanity checks on stderr), never with a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import enum
import json
import mmap
import os
import re
import struct
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from josef_storage_local import snapshots, txn_index
from josef_storage_local.index import OffsetIndex, TimeIndex

INT_MAX = 2**31 - 1
_HEADER = struct.Struct(">qiibIhiqqqhii")
_HEADER_SIZE = _HEADER.size  # 61
_LOG_OVERHEAD = 12  # baseOffset and batchLength
#: Kafka's smallest legal record size (a v0 message): shorter batch lengths are corrupt.
_MIN_RECORD_OVERHEAD = 14
_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_DELETE_HORIZON_BIT = 0x40
_ZERO_UUID_TEXT = "AAAAAAAAAAAAAAAAAAAAAA"
_SNAPSHOT_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
_BOOTSTRAP_SNAPSHOT = "bootstrap.checkpoint"
_NO_TIMESTAMP = -1

#: Kafka's ControlRecordType ids.
ABORT, COMMIT, LEADER_CHANGE, SNAPSHOT_HEADER, SNAPSHOT_FOOTER, KRAFT_VERSION, KRAFT_VOTERS = range(7)

#: A decoder of an internal topic's records (see the ``register_record_decoders`` hook).
RecordDecoder = Callable[[bytes | None, bytes | None], tuple[dict[str, Any] | None, dict[str, Any] | str | None]]


class DumpError(Exception):
    """Something wrong with one file; reported on stderr, and the tool goes on with the next file."""


# JSON as Kafka's generated JsonConverters write it -----------------------------------------------------


def camel_case(name: str) -> str:
    """``snake_case`` field names (kio's, josef's) as Kafka's camelCase JSON names: ``topic_id`` -> ``topicId``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def snake_upper(name: str) -> str:
    """Kafka's ``MessageGenerator.toSnakeCase(name).toUpperCase()``: ``RegisterBrokerRecord`` -> ``REGISTER_BROKER_RECORD``."""
    out = []
    previous_capital = True
    for char in name:
        if char.isupper():
            if not previous_capital:
                out.append("_")
            out.append(char.lower())
            previous_capital = True
        else:
            out.append(char)
            previous_capital = False
    return "".join(out).upper()


def java_double(value: float) -> str:
    """A float as Java's ``Double.toString`` (what Jackson writes): ``1.0``, ``1.0E7``, ``1.0E-4``."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        text = repr(value)
        return text if "." in text else text + ".0"
    sign, digits, exponent = decimal.Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    mantissa = "".join(map(str, digits))
    power = exponent + len(mantissa) - 1
    return f"{'-' if sign else ''}{mantissa[0]}.{mantissa[1:] or '0'}E{power}"


def _kafka_uuid(value: uuid.UUID | None) -> str:
    if value is None:
        return _ZERO_UUID_TEXT
    from josef.metadata.records import uuid_to_text

    return uuid_to_text(value)


def to_json(value: Any, kafka_type: str = "") -> str:
    """Compact JSON of a kio-style dataclass (or a value of one of its fields), as Jackson's ``toString`` prints it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = []
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if "tag" in f.metadata and item == _default(f):
                continue  # a tagged field is written only when it differs from its default
            items.append(f"{json.dumps(camel_case(f.name))}:{to_json(item, f.metadata.get('kafka_type', ''))}")
        return "{" + ",".join(items) + "}"
    if isinstance(value, dict):  # a decoder's JSON object, in its own field order
        return "{" + ",".join(f"{json.dumps(k)}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (tuple, list, frozenset, set)):
        return "[" + ",".join(to_json(v, kafka_type) for v in value) + "]"
    if isinstance(value, uuid.UUID) or (value is None and kafka_type == "uuid"):
        return json.dumps(_kafka_uuid(value))
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return to_json(value.value, kafka_type)
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return java_double(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        import base64

        return json.dumps(base64.b64encode(bytes(value)).decode())
    if isinstance(value, datetime.timedelta):
        return str(int(value.total_seconds() * 1000))
    if isinstance(value, datetime.datetime):
        return str(int(value.timestamp() * 1000))
    return json.dumps(str(value), ensure_ascii=False)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


# Decoding values -------------------------------------------------------------------------------------


def metadata_payload(value: bytes | None, offset: int) -> str:
    """Kafka's ``ClusterMetadataLogMessageParser`` output for one record value."""
    from josef.metadata.records import decode, read_frame

    if value is None:
        return f"Error at {offset}, skipping. the record has no value"
    try:
        _key, version, _ = read_frame(value)
        record = decode(value)
    except Exception as exc:  # whatever the bytes are, the dump goes on
        return f"Error at {offset}, skipping. {exc}"
    return (f'{{"type":{json.dumps(snake_upper(type(record).__name__))},"version":{version},'
            f'"data":{to_json(record)}}}')


def _control_schema(kind: int) -> tuple[str, type] | None:
    if kind == LEADER_CHANGE:
        from kio.schema.leader_change_message.v0.data import LeaderChangeMessage

        return " LeaderChange: ", LeaderChangeMessage
    if kind == SNAPSHOT_HEADER:
        from kio.schema.snapshot_header_record.v0.data import SnapshotHeaderRecord

        return " SnapshotHeader ", SnapshotHeaderRecord
    if kind == SNAPSHOT_FOOTER:
        from kio.schema.snapshot_footer_record.v0.data import SnapshotFooterRecord

        return " SnapshotFooter ", SnapshotFooterRecord
    if kind == KRAFT_VERSION:
        from kio.schema.k_raft_version_record.v0.data import KRaftVersionRecord

        return " KRaftVersion ", KRaftVersionRecord
    if kind == KRAFT_VOTERS:
        from kio.schema.voters_record.v0.data import VotersRecord

        return " KRaftVoters ", VotersRecord
    return None


def control_record(key: bytes | None, value: bytes | None) -> str:
    """What Kafka's tool prints after a control record's metadata: the marker, or the KRaft control message as JSON."""
    if key is None or len(key) < 4:
        return " controlType: UNKNOWN(-1) (the control record has no readable key)"
    kind = struct.unpack_from(">h", key, 2)[0]
    if kind in (ABORT, COMMIT):
        if value is None or len(value) < 6:
            return f" endTxnMarker: {'ABORT' if kind == ABORT else 'COMMIT'} (the marker value is unreadable)"
        return f" endTxnMarker: {'ABORT' if kind == ABORT else 'COMMIT'} coordinatorEpoch: {struct.unpack_from('>i', value, 2)[0]}"
    schema = _control_schema(kind)
    if schema is None:
        return f" controlType: UNKNOWN({kind})"
    label, cls = schema
    from kio.serial import entity_reader

    try:
        message, _ = entity_reader(cls)(value or b"", 0)  # type: ignore[arg-type]
    except Exception as exc:
        return f"{label.rstrip(': ')}: cannot decode the control record: {exc}"
    return f"{label}{to_json(message)}"


# Log segments and snapshots ------------------------------------------------------------------------------


def _last_sequence(base_sequence: int, delta: int) -> int:
    """Kafka's ``DefaultRecordBatch.incrementSequence``: sequences wrap from Int.MAX to 0."""
    if base_sequence < 0:
        return -1
    if base_sequence > INT_MAX - delta:
        return delta - (INT_MAX - base_sequence) - 1
    return base_sequence + delta


def _bool(value: bool) -> str:
    return "true" if value else "false"


@contextlib.contextmanager
def _open(path: Path) -> Iterator[memoryview]:
    """The file's bytes, memory-mapped (an empty file needs no map)."""
    try:
        file = path.open("rb")
    except OSError as exc:
        raise DumpError(f"cannot read {path}: {exc.strerror or exc}") from None
    with file:
        try:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if path.stat().st_size else None
        except OSError as exc:
            raise DumpError(f"cannot read {path}: {exc.strerror or exc}") from None
        if mapped is None:
            yield memoryview(b"")
            return
        view = memoryview(mapped)
        try:
            yield view
        finally:
            view.release()
            mapped.close()


def _base_offset(path: Path) -> int:
    start = path.name.split(".")[0]
    if not start.isdigit():
        raise DumpError(f"{path}: a segment's files are named by its base offset (20 digits), not {start!r}")
    return int(start)


def _batch_end_at(log: bytes | memoryview, position: int) -> tuple[int, int] | None:
    """(last offset, size) of the batch at ``position`` of a segment; None when no whole batch header is there."""
    if position < 0 or position + _HEADER_SIZE > len(log):
        return None
    base_offset, length, _, _, _, _, last_delta = struct.unpack_from(">qiibIhi", log, position)
    return base_offset + last_delta, length + _LOG_OVERHEAD


class Dumper:
    """One run of the tool: dumps files one by one, and keeps the problems Kafka lists after the last file."""

    def __init__(self, out: Callable[[str], Any], err: Callable[[str], Any], *, print_data: bool, deep: bool,
                 metadata: bool, decoder: RecordDecoder | None, skip_record_metadata: bool, max_bytes: int,
                 verify_only: bool = False, index_sanity_only: bool = False) -> None:
        self.out, self.err = out, err
        self.metadata = metadata
        self.decoder = decoder
        self.print_data = print_data or metadata or decoder is not None
        self.deep = deep or self.print_data
        self.skip_record_metadata = skip_record_metadata
        self.max_bytes = max_bytes
        self.verify_only = verify_only
        self.index_sanity_only = index_sanity_only
        #: Kafka's reports after the last file: index mismatches, time-index problems, offset gaps, by file.
        self.index_mismatches: dict[str, dict[int, int]] = {}
        self.time_mismatches: dict[str, list[tuple[int, int]]] = {}
        self.time_out_of_order: dict[str, list[tuple[int, int]]] = {}
        self.time_not_found: dict[str, list[tuple[int, int]]] = {}
        self.gaps: dict[str, dict[int, int]] = {}

    def dump(self, path: Path) -> None:
        name = path.name
        suffix = name[name.rfind("."):] if "." in name else ""
        if suffix in (".log", ".checkpoint"):
            self.dump_log(path)
        elif suffix == ".index":
            self.dump_index(path)
        elif suffix == ".timeindex":
            self.dump_time_index(path)
        elif suffix == snapshots.SUFFIX:
            self.dump_producer_snapshot(path)
        elif suffix == txn_index.SUFFIX:
            self.dump_txn_index(path)
        else:
            self.err(f"Ignoring unknown file {path}\n")

    def report(self) -> None:
        """What Kafka's tool prints on stderr once every file is dumped."""
        for name, mismatches in self.index_mismatches.items():
            self.err(f"Mismatches in :{name}\n")
            for offset in sorted(mismatches, reverse=True):
                self.err(f"  Index offset: {offset}, log offset: {mismatches[offset]}\n")
        for name, entries in self.time_mismatches.items():
            self.err(f"Found timestamp mismatch in :{name}\n")
            for indexed, logged in entries:
                self.err(f"  Index timestamp: {indexed}, log timestamp: {logged}\n")
        for name, entries in self.time_out_of_order.items():
            self.err(f"Found out of order timestamp in :{name}\n")
            for indexed, previous in entries:
                self.err(f"  Index timestamp: {indexed}, Previously indexed timestamp: {previous}\n")
        for entries in self.time_not_found.values():
            self.err("The following indexed offsets are not found in the log.\n")
            for indexed, found in entries:
                self.err(f"Indexed offset: {indexed}, found log offset: {found}\n")
        for name, gaps in self.gaps.items():
            self.err(f"Non-consecutive offsets in {name}\n")
            for before in sorted(gaps):
                self.err(f"  {before} is followed by {gaps[before]}\n")

    def dump_log(self, path: Path) -> None:
        name = path.name
        if name.endswith(".log"):
            header = f"Log starting offset: {_base_offset(path)}\n"
        elif name == _BOOTSTRAP_SNAPSHOT:
            header = "KRaft bootstrap snapshot\n"
        else:
            match = _SNAPSHOT_NAME.match(name)
            if match is None:
                raise DumpError(f"{path}: a snapshot is named <20-digit end offset>-<10-digit epoch>.checkpoint")
            header = f"Snapshot end offset: {int(match.group(1))}, epoch: {int(match.group(2))}\n"
        with _open(path) as data:
            self.out(header)
            with data[: self.max_bytes] as window:
                self.dump_batches(window, path)

    def dump_batches(self, data: memoryview, path: Path) -> None:
        import crc32c

        end = len(data)
        pos = 0
        last_offset = [-1]
        while end - pos >= _LOG_OVERHEAD:
            base_offset, length = struct.unpack_from(">qi", data, pos)
            if length < _MIN_RECORD_OVERHEAD:  # where Kafka's FileLogInputStream throws, the dump says so and stops
                self.out(f"Found record size {length} smaller than minimum record overhead ({_MIN_RECORD_OVERHEAD}) "
                         f"in file {path}.\n")
                break
            size = length + _LOG_OVERHEAD
            if length < _HEADER_SIZE - _LOG_OVERHEAD or pos + size > end:
                break  # a torn or corrupt batch: what is left is reported as invalid bytes below, as Kafka does
            (_, _, leader_epoch, magic, crc, attributes, last_delta, base_ts, max_ts, producer_id, producer_epoch,
             base_sequence, count) = _HEADER.unpack_from(data, pos)
            if magic != 2:
                self.out(f"Found a batch at position {pos} with magic {magic}: only magic 2 (Kafka 0.11 and later) "
                         f"is read; the rest of the file is not read\n")
                break
            with data[pos + 21 : pos + size] as covered:
                valid = crc32c.crc32c(covered) == crc
            horizon = f"OptionalLong[{base_ts}]" if attributes & _DELETE_HORIZON_BIT else "OptionalLong.empty"
            ts_type = "LogAppendTime" if attributes & 0x08 else "CreateTime"
            codec = _CODECS.get(attributes & 0x07, f"unknown({attributes & 0x07})")
            control = bool(attributes & 0x20)
            self.out(f"baseOffset: {base_offset} lastOffset: {base_offset + last_delta} count: {count} "
                     f"baseSequence: {base_sequence} lastSequence: {_last_sequence(base_sequence, last_delta)} "
                     f"producerId: {producer_id} producerEpoch: {producer_epoch} partitionLeaderEpoch: {leader_epoch} "
                     f"isTransactional: {_bool(bool(attributes & 0x10))} isControl: {_bool(control)} "
                     f"deleteHorizonMs: {horizon} position: {pos} {ts_type}: {max_ts} size: {size} magic: {magic} "
                     f"compresscodec: {codec} crc: {crc} isvalid: {_bool(valid)}\n")
            if self.deep:
                self.dump_records(bytes(data[pos : pos + size]), base_offset, base_sequence, ts_type, control, pos,
                                  last_offset, path)
            pos += size
        trailing = end - pos
        if trailing > 0 and self.max_bytes == INT_MAX:
            self.out(f"Found {trailing} invalid bytes at the end of {path.name}\n")

    def dump_records(self, batch: bytes, base_offset: int, base_sequence: int, ts_type: str, control: bool,
                     position: int, last_offset: list[int], path: Path) -> None:
        from josef.protocol.records import decode_batch

        try:
            records = decode_batch(batch, 0, "", -1, check_crc=False)
        except Exception as exc:  # a corrupt batch says so on one line and the dump goes on with the next
            self.out(f"| cannot read the records of the batch at position {position}: {exc}\n")
            return
        for record in records:
            if record.offset != last_offset[0] + 1:
                self.gaps.setdefault(str(path.absolute()), {})[last_offset[0]] = record.offset
            last_offset[0] = record.offset
            line = []
            if not self.skip_record_metadata:
                key_size = -1 if record.key is None else len(record.key)
                value_size = -1 if record.value is None else len(record.value)
                headers = ",".join(k for k, _ in record.headers)
                line.append(f"| offset: {record.offset} {ts_type}: {record.timestamp} keySize: {key_size} "
                            f"valueSize: {value_size} sequence: {_last_sequence(base_sequence, record.offset - base_offset)} "
                            f"headerKeys: [{headers}]")
                if control:
                    line.append(control_record(record.key, record.value))
            if self.print_data and not control:
                prefix = "| " if self.skip_record_metadata else " "
                key, payload = self.parse(record.offset, record.key, record.value)
                if key is not None:
                    line.append(f"{prefix}key: {key}")
                    prefix = " "
                if payload is not None:
                    line.append(f"{prefix}payload: {payload}")
            self.out("".join(line) + "\n")

    def parse(self, offset: int, key: bytes | None, value: bytes | None) -> tuple[str | None, str | None]:
        """A record's key and payload as text, as the message parser Kafka's flags choose prints them."""
        if self.metadata:
            return None, metadata_payload(value, offset)
        if self.decoder is None:
            return (None if key is None else bytes(key).decode("utf-8", "replace"),
                    None if value is None else bytes(value).decode("utf-8", "replace"))
        if key is None and not getattr(self.decoder, "keyless", False):
            return (f"Failed to decode message at offset {offset} using the specified decoder "
                    "(message had a missing key)"), None
        try:
            decoded_key, decoded_value = self.decoder(None if key is None else bytes(key),
                                                      None if value is None else bytes(value))
        except LookupError as exc:
            return f"Unknown record type {exc.args[0] if exc.args else '?'} at offset {offset}, skipping.", None
        except Exception as exc:  # noqa: BLE001 - whatever the bytes are, the dump goes on
            return f"Error at offset {offset}, skipping. {exc}", None
        if isinstance(decoded_value, str):  # a keyless decoder's text (Kafka's RemoteMetadataLogMessageParser)
            return None, decoded_value
        return to_json(decoded_key), "<DELETE>" if decoded_value is None else to_json(decoded_value)

    # Indexes and snapshots ---------------------------------------------------------------------------

    def dump_index(self, path: Path) -> None:
        base = _base_offset(path)
        entry = OffsetIndex.ENTRY
        with _open(path) as data:
            entries = len(data) // entry.size
            if entries == 0:
                self.out(f"{path} is empty.\n")
                return
            if self.index_sanity_only:
                last = base + entry.unpack_from(data, (entries - 1) * entry.size)[0]
                if last < base:
                    raise DumpError(f"Corrupt index found, index file ({path.absolute()}) has non-zero size but the "
                                    f"last offset is {last} which is less than the base offset {base}.")
                if len(data) % entry.size:
                    raise DumpError(f"Index file {path.absolute()} is corrupt, found {len(data)} bytes which is "
                                    f"neither positive nor a multiple of {entry.size}.")
                self.out(f"{path} passed sanity check.\n")
                return
            with self._segment_file(path, ".log") as log:
                self._check_index(path, data, entries, base, log)

    def _check_index(self, path: Path, data: memoryview, entries: int, base: int, log: memoryview) -> None:
        entry = OffsetIndex.ENTRY
        for i in range(entries):
            relative, position = entry.unpack_from(data, i * entry.size)
            if relative == 0 and i > 0:
                break  # the preallocated, unwritten tail of an active segment's index
            offset = base + relative
            found = _batch_end_at(log, position)
            found_offset = -1 if found is None else found[0]
            if found_offset != offset:
                self.index_mismatches.setdefault(str(path.absolute()), {})[offset] = found_offset
            if not self.verify_only:
                self.out(f"offset: {offset} position: {position}\n")

    @staticmethod
    @contextlib.contextmanager
    def _segment_file(path: Path, suffix: str) -> Iterator[memoryview]:
        """The bytes of the segment's file with ``suffix`` beside an index (none when it is missing)."""
        sibling = path.with_name(path.name.split(".")[0] + suffix)
        if not sibling.exists():
            yield memoryview(b"")
            return
        with _open(sibling) as data:
            yield data

    def dump_time_index(self, path: Path) -> None:
        base = _base_offset(path)
        entry = TimeIndex.ENTRY
        with _open(path) as data:
            entries = len(data) // entry.size
            if self.index_sanity_only:
                self._time_index_sanity(path, data, entries, base)
                self.out(f"{path} passed sanity check.\n")
                return
            with self._segment_file(path, ".log") as log, self._segment_file(path, ".index") as offsets:
                self._check_time_index(path, data, entries, base, log, offsets)

    def _check_time_index(self, path: Path, data: memoryview, entries: int, base: int, log: memoryview,
                          offsets: memoryview) -> None:
        entry = TimeIndex.ENTRY
        key = str(path.absolute())
        previous = _NO_TIMESTAMP
        for i in range(entries):
            timestamp, relative = entry.unpack_from(data, i * entry.size)
            if relative == 0 and i > 0:
                break
            offset = base + relative
            found = self._batch_holding(log, self._index_position(offsets, base, offset), offset)
            if found is None:
                self.time_not_found.setdefault(key, []).append((offset, -1))
            elif found[0] != offset:
                self.time_not_found.setdefault(key, []).append((offset, found[0]))
            else:
                max_timestamp = self._max_record_timestamp(log, found[1])
                if max_timestamp != timestamp:
                    self.time_mismatches.setdefault(key, []).append((timestamp, max_timestamp))
                if previous >= timestamp:
                    self.time_out_of_order.setdefault(key, []).append((timestamp, previous))
            if not self.verify_only:
                self.out(f"timestamp: {timestamp} offset: {offset}\n")
            previous = timestamp

    @staticmethod
    def _time_index_sanity(path: Path, data: memoryview, entries: int, base: int) -> None:
        entry = TimeIndex.ENTRY
        if entries:
            first_timestamp = entry.unpack_from(data, 0)[0]
            last_timestamp, last_relative = entry.unpack_from(data, (entries - 1) * entry.size)
            if last_timestamp < first_timestamp:
                raise DumpError(f"Corrupt time index found, time index file ({path.absolute()}) has non-zero size but "
                                f"the last timestamp is {last_timestamp} which is less than the first timestamp "
                                f"{first_timestamp}")
            if base + last_relative < base:
                raise DumpError(f"Corrupt time index found, time index file ({path.absolute()}) has non-zero size but "
                                f"the last offset is {base + last_relative} which is less than the first offset {base}")
        if len(data) % entry.size:
            raise DumpError(f"Time index file {path.absolute()} is corrupt, found {len(data)} bytes which is neither "
                            f"positive nor a multiple of {entry.size}.")

    @staticmethod
    def _index_position(offsets: memoryview, base: int, offset: int) -> int:
        """Kafka's ``OffsetIndex.lookup``: the position of the last entry at or below ``offset`` (0 when none)."""
        entry = OffsetIndex.ENTRY
        position = 0
        for i in range(len(offsets) // entry.size):
            relative, at = entry.unpack_from(offsets, i * entry.size)
            if (relative == 0 and i > 0) or base + relative > offset:
                break
            position = at
        return position

    @staticmethod
    def _batch_holding(log: memoryview, position: int, offset: int) -> tuple[int, int] | None:
        """(last offset, position) of the first batch from ``position`` whose last offset reaches ``offset``."""
        while (found := _batch_end_at(log, position)) is not None:
            last, size = found
            if last >= offset:
                return last, position
            position += size
        return None

    @staticmethod
    def _max_record_timestamp(log: memoryview, position: int) -> int:
        from josef.protocol.records import decode_batch

        size = _batch_end_at(log, position)
        assert size is not None
        try:
            records = decode_batch(bytes(log[position : position + size[1]]), 0, "", -1, check_crc=False)
        except Exception:  # noqa: BLE001 - an unreadable batch has no timestamp to compare
            return _NO_TIMESTAMP
        return max((r.timestamp for r in records), default=_NO_TIMESTAMP)

    def dump_txn_index(self, path: Path) -> None:
        with _open(path) as data:
            for i in range(len(data) // txn_index.ENTRY.size):
                version, producer_id, first, last, lso = txn_index.ENTRY.unpack_from(data, i * txn_index.ENTRY.size)
                self.out(f"version: {version} producerId: {producer_id} firstOffset: {first} lastOffset: {last} "
                         f"lastStableOffset: {lso}\n")

    def dump_producer_snapshot(self, path: Path) -> None:
        """Kafka's line per producer; its ``batchMetadata`` is the last batch, the one Kafka's snapshots keep."""
        with _open(path) as data:
            try:
                producers = snapshots.decode(bytes(data))
            except ValueError as exc:  # Kafka prints a CorruptSnapshotException's message and goes on
                self.err(f"Snapshot {path.absolute()} is corrupt: {exc}\n")
                return
        for producer in producers:
            last = producer.batches[-1] if producer.batches else None
            line = (f"producerId: {producer.producer_id} producerEpoch: {producer.epoch} "
                    f"coordinatorEpoch: {producer.coordinator_epoch} "
                    f"currentTxnFirstOffset: {'OptionalLong.empty' if producer.current_txn_first_offset < 0 else f'OptionalLong[{producer.current_txn_first_offset}]'} "
                    f"lastTimestamp: {_NO_TIMESTAMP if last is None else last.max_timestamp}")
            if last is not None:
                line += (f" firstSequence: {last.first_seq} lastSequence: {last.last_seq} lastOffset: {last.last_offset} "
                         f"offsetDelta: {last.last_offset - last.first_offset} timestamp: {last.max_timestamp}")
            self.out(line + "\n")


def find_decoder(name: str) -> RecordDecoder:
    """The record decoder a plugin registered as ``name`` (``offsets``, ``transaction-log``)."""
    from josef.plugins import PluginError, collect, get_plugin_manager

    try:
        return collect(get_plugin_manager(), "register_record_decoders", "record decoder").get(name)
    except PluginError as exc:
        raise click.ClickException(str(exc)) from None


def _quiet_broken_pipe() -> None:
    """A reader that went away (``| head``) ends the dump quietly, as it ends ``cat``."""
    with contextlib.suppress(OSError, ValueError):  # no flush of the dead pipe at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(0)


@click.command("dump-log")
@click.option("--files", required=True, metavar="FILE[,FILE...]",
              help="REQUIRED: The comma separated list of data and index log files to be dumped "
                   "(.log, .checkpoint, .index, .timeindex, .txnindex, .snapshot).")
@click.option("--print-data-log", is_flag=True,
              help="If set, printing the messages content when dumping data logs. Automatically set if any decoder "
                   "option is specified.")
@click.option("--deep-iteration", is_flag=True,
              help="If set, uses deep instead of shallow iteration. Automatically set if print-data-log is enabled.")
@click.option("--verify-index-only", is_flag=True, help="If set, just verify the index log without printing its content.")
@click.option("--index-sanity-check", is_flag=True,
              help="If set, just checks the index sanity without printing its content. This is the same check that is "
                   "executed on broker startup to determine if an index needs rebuilding or not.")
@click.option("--offsets-decoder", is_flag=True,
              help="If set, log data will be parsed as offset data from the __consumer_offsets topic.")
@click.option("--transaction-log-decoder", is_flag=True,
              help="If set, log data will be parsed as transaction metadata from the __transaction_state topic.")
@click.option("--cluster-metadata-decoder", is_flag=True, help="If set, log data will be parsed as cluster metadata records.")
@click.option("--remote-log-metadata-decoder", is_flag=True,
              help="If set, log data will be parsed as TopicBasedRemoteLogMetadataManager (RLMM) metadata records.")
@click.option("--share-group-state-decoder", is_flag=True,
              help="If set, log data will be parsed as share group state data from the __share_group_state topic.")
@click.option("--skip-record-metadata", is_flag=True, help="Whether to skip printing metadata for each record.")
@click.option("--max-bytes", type=click.IntRange(min=0, max=INT_MAX), default=INT_MAX, show_default=True,
              help="Limit the amount of total batches read in bytes avoiding reading the whole .log file(s).")
@click.option("--max-message-size", type=click.IntRange(min=1), default=5 * 1024 * 1024, hidden=True,
              help="Accepted for kafka-dump-log.sh compatibility: batches are read by their own length.")
def dump_log(files: str, print_data_log: bool, deep_iteration: bool, verify_index_only: bool,
             index_sanity_check: bool, offsets_decoder: bool, transaction_log_decoder: bool,
             cluster_metadata_decoder: bool, remote_log_metadata_decoder: bool, share_group_state_decoder: bool,
             skip_record_metadata: bool,
             max_bytes: int, max_message_size: int) -> None:
    """This tool helps to parse a log file and dump its contents to the console, useful for debugging a seemingly
    corrupt log segment (kafka-dump-log.sh)."""
    paths = [Path(f.strip()) for f in files.split(",") if f.strip()]
    if not paths:
        raise click.ClickException("--files names no file")
    decoder = None
    if offsets_decoder:  # Kafka's order of precedence when several decoders are given
        decoder = find_decoder("offsets")
    elif transaction_log_decoder:
        decoder = find_decoder("transaction-log")
    elif remote_log_metadata_decoder and not cluster_metadata_decoder:
        decoder = find_decoder("remote-log-metadata")
    elif share_group_state_decoder and not cluster_metadata_decoder:
        decoder = find_decoder("share-group-state")

    # click's streams, which its test runner captures apart on every click release.
    def out(text: str) -> None:
        click.echo(text, nl=False)

    def err(text: str) -> None:
        click.echo(text, nl=False, err=True)

    dumper = Dumper(out, err, print_data=print_data_log, deep=deep_iteration,
                    metadata=cluster_metadata_decoder and decoder is None, decoder=decoder,
                    skip_record_metadata=skip_record_metadata, max_bytes=max_bytes, verify_only=verify_index_only,
                    index_sanity_only=index_sanity_check)
    failed = False
    try:
        for path in paths:
            out(f"Dumping {path}\n")
            try:
                dumper.dump(path)
            except DumpError as exc:
                sys.stdout.flush()
                err(f"Error: {exc}\n")
                failed = True
        sys.stdout.flush()
        dumper.report()
    except BrokenPipeError:
        _quiet_broken_pipe()
    if failed:
        raise SystemExit(1)
