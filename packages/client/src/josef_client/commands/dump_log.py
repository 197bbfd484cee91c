"""``josef dump-log``: Kafka's ``kafka-dump-log.sh``, over josef's (and Kafka's) log files.

Reads ``.log`` segments and ``.checkpoint`` KRaft snapshots (the same
record-batch format), ``.index``, ``.timeindex`` and ``.txnindex`` files, and
prints them in the shapes Kafka's tool prints, so scripts written for
``kafka-dump-log.sh`` read josef's output::

    Dumping /data/__cluster_metadata-0/00000000000000000000.log
    Log starting offset: 0
    baseOffset: 0 lastOffset: 1 count: 2 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 \
partitionLeaderEpoch: 1 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty position: 0 \
CreateTime: 1700000000000 size: 150 magic: 2 compresscodec: none crc: 1872123461 isvalid: true
    | offset: 0 CreateTime: 1700000000000 keySize: -1 valueSize: 28 sequence: -1 headerKeys: [] \
payload: {"type":"TOPIC_RECORD","version":0,"data":{"name":"foo","topicId":"q0GC3ekCQ8aRXm5ZZIuEpA"}}

With ``--cluster-metadata-decoder`` record values are decoded as KRaft
metadata records and printed as Kafka's ``MetadataRecordSerde`` JSON (type
in upper snake case, Kafka's camelCase field names, tagged fields only when
they differ from their default, UUIDs as Kafka's base64 text); control
records are decoded whatever the flags (LeaderChange, SnapshotHeader,
SnapshotFooter, KRaftVersion, KRaftVoters, transaction markers). A corrupt
batch is reported on its line (``isvalid: false``, or a line saying what is
wrong), never with a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import enum
import json
import mmap
import re
import struct
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from josef_client.commands.common import Command, quiet_broken_pipe

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

#: Kafka's ControlRecordType ids.
ABORT, COMMIT, LEADER_CHANGE, SNAPSHOT_HEADER, SNAPSHOT_FOOTER, KRAFT_VERSION, KRAFT_VOTERS = range(7)


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


class Dumper:
    def __init__(self, out: Callable[[str], Any], err: Callable[[str], Any], *, print_data: bool, deep: bool,
                 metadata: bool, skip_record_metadata: bool, max_bytes: int) -> None:
        self.out, self.err = out, err
        self.print_data = print_data or metadata
        self.deep = deep or self.print_data
        self.metadata = metadata
        self.skip_record_metadata = skip_record_metadata
        self.max_bytes = max_bytes

    def dump(self, path: Path) -> None:
        name = path.name
        suffix = name[name.rfind("."):] if "." in name else ""
        if suffix in (".log", ".checkpoint"):
            self.dump_log(path)
        elif suffix == ".index":
            self.dump_index(path)
        elif suffix == ".timeindex":
            self.dump_time_index(path)
        elif suffix == ".txnindex":
            self.dump_txn_index(path)
        else:
            self.err(f"Ignoring unknown file {path}\n")

    def dump_log(self, path: Path) -> None:
        name = path.name
        if name.endswith(".log"):
            start = name.split(".")[0]
            if not start.isdigit():
                raise DumpError(f"{path}: a segment is named by its base offset (20 digits), not {start!r}")
            header = f"Log starting offset: {int(start)}\n"
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
        last_offset = -1
        gaps: list[tuple[int, int]] = []
        while end - pos >= _LOG_OVERHEAD:
            base_offset, length = struct.unpack_from(">qi", data, pos)
            if length < _MIN_RECORD_OVERHEAD:
                self.out(f"Found a corrupt batch at position {pos}: its length {length} is below the minimum record "
                         f"overhead ({_MIN_RECORD_OVERHEAD}); the rest of the file is not read\n")
                break
            size = length + _LOG_OVERHEAD
            if pos + size > end:
                break  # a partial batch: the trailing bytes are reported below
            if length < _HEADER_SIZE - _LOG_OVERHEAD:
                self.out(f"Found a corrupt batch at position {pos}: its length {length} is shorter than a record batch "
                         f"header; the rest of the file is not read\n")
                break
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
                last_offset = self.dump_records(bytes(data[pos : pos + size]), base_offset, base_sequence, ts_type,
                                                control, pos, last_offset, gaps)
            pos += size
        trailing = end - pos
        if trailing > 0 and self.max_bytes == INT_MAX:
            self.out(f"Found {trailing} invalid bytes at the end of {path.name}\n")
        if gaps:
            self.err(f"Non-consecutive offsets in {path.absolute()}\n")
            for before, after in gaps:
                self.err(f"  {before} is followed by {after}\n")

    def dump_records(self, batch: bytes, base_offset: int, base_sequence: int, ts_type: str, control: bool,
                     position: int, last_offset: int, gaps: list[tuple[int, int]]) -> int:
        from josef.protocol.records import decode_batch

        try:
            records = decode_batch(batch, 0, "", -1, check_crc=False)
        except Exception as exc:  # a corrupt batch says so on one line and the dump goes on with the next
            self.out(f"| cannot read the records of the batch at position {position}: {exc}\n")
            return last_offset
        for record in records:
            if record.offset != last_offset + 1:
                gaps.append((last_offset, record.offset))
            last_offset = record.offset
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
                if self.metadata:
                    line.append(f"{prefix}payload: {metadata_payload(record.value, record.offset)}")
                else:
                    if record.key is not None:
                        line.append(f"{prefix}key: {bytes(record.key).decode('utf-8', 'replace')}")
                        prefix = " "
                    if record.value is not None:
                        line.append(f"{prefix}payload: {bytes(record.value).decode('utf-8', 'replace')}")
            self.out("".join(line) + "\n")
        return last_offset

    # Indexes ---------------------------------------------------------------------------------------

    @staticmethod
    def _base_offset(path: Path) -> int:
        start = path.name.split(".")[0]
        if not start.isdigit():
            raise DumpError(f"{path}: an index is named by its segment's base offset (20 digits), not {start!r}")
        return int(start)

    def dump_index(self, path: Path) -> None:
        base = self._base_offset(path)
        log_path = path.with_name(path.name.split(".")[0] + ".log")
        with _open(path) as data:
            entries = len(data) // 8
            if entries == 0:
                self.out(f"{path} is empty.\n")
                return
            log = log_path.read_bytes() if log_path.exists() else None
            mismatches = []
            for i in range(entries):
                relative, position = struct.unpack_from(">ii", data, i * 8)
                if relative == 0 and i > 0:
                    break  # the preallocated, unwritten tail of an active segment's index
                offset = base + relative
                if log is not None:
                    found = self._last_offset_at(log, position)
                    if found != offset:
                        mismatches.append((offset, found))
                self.out(f"offset: {offset} position: {position}\n")
            if mismatches:
                self.err(f"Mismatches in :{path.absolute()}\n")
                for offset, found in sorted(mismatches, reverse=True):
                    self.err(f"  Index offset: {offset}, log offset: {found}\n")

    @staticmethod
    def _last_offset_at(log: bytes, position: int) -> int:
        if position < 0 or position + _HEADER_SIZE > len(log):
            return -1
        base_offset, _, _, _, _, _, last_delta = struct.unpack_from(">qiibIhi", log, position)
        return base_offset + last_delta

    def dump_time_index(self, path: Path) -> None:
        base = self._base_offset(path)
        with _open(path) as data:
            for i in range(len(data) // 12):
                timestamp, relative = struct.unpack_from(">qi", data, i * 12)
                if relative == 0 and i > 0:
                    break
                self.out(f"timestamp: {timestamp} offset: {base + relative}\n")

    def dump_txn_index(self, path: Path) -> None:
        with _open(path) as data:
            for i in range(len(data) // 34):
                version, producer_id, first, last, lso = struct.unpack_from(">hqqqq", data, i * 34)
                self.out(f"version: {version} producerId: {producer_id} firstOffset: {first} lastOffset: {last} "
                         f"lastStableOffset: {lso}\n")


@click.command("dump-log", cls=Command)
@click.option("--files", required=True, metavar="FILE[,FILE...]",
              help="The comma-separated data and index log files to dump (.log, .checkpoint, .index, .timeindex, .txnindex).")
@click.option("--print-data-log", is_flag=True, help="Print the records' keys and values (implies --deep-iteration).")
@click.option("--deep-iteration", is_flag=True, help="Print every record, not only every batch.")
@click.option("--cluster-metadata-decoder", is_flag=True,
              help="Decode record values as KRaft metadata records (implies --print-data-log).")
@click.option("--skip-record-metadata", is_flag=True, help="Print only the records' contents, without their metadata.")
@click.option("--max-bytes", type=click.IntRange(min=0), default=INT_MAX, show_default=True,
              help="Read at most this many bytes of each .log file.")
@click.option("--max-message-size", type=click.IntRange(min=1), default=5 * 1024 * 1024, hidden=True,
              help="Accepted for kafka-dump-log.sh compatibility.")
@quiet_broken_pipe
def dump_log(files: str, print_data_log: bool, deep_iteration: bool, cluster_metadata_decoder: bool,
             skip_record_metadata: bool, max_bytes: int, max_message_size: int) -> None:
    """Print the batches and records of log segments, KRaft snapshots and indexes, as kafka-dump-log.sh does."""
    paths = [Path(f.strip()) for f in files.split(",") if f.strip()]
    if not paths:
        raise click.ClickException("--files names no file")
    # click's streams, which its test runner captures apart on every click release.
    def out(text: str) -> None:
        click.echo(text, nl=False)

    def err(text: str) -> None:
        click.echo(text, nl=False, err=True)

    dumper = Dumper(out, err, print_data=print_data_log, deep=deep_iteration, metadata=cluster_metadata_decoder,
                    skip_record_metadata=skip_record_metadata, max_bytes=max_bytes)
    failed = False
    for path in paths:
        out(f"Dumping {path}\n")
        try:
            dumper.dump(path)
        except DumpError as exc:
            sys.stdout.flush()
            err(f"Error: {exc}\n")
            failed = True
    sys.stdout.flush()
    if failed:
        raise SystemExit(1)
