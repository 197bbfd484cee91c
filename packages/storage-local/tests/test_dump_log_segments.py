"""``josef dump-log`` over a partition directory written by :class:`LocalLog`: every file kind, in Kafka's shapes."""

from __future__ import annotations

import struct

from click.testing import CliRunner

from josef.log import AbortedTxn
from josef.producer.producer_state import BatchMetadata, ProducerEntry
from josef.protocol.codecs import Compression
from josef.protocol.records import (
    TRANSACTIONAL_BIT,
    build_batch,
    build_marker,
    describe_batches,
    iter_batches,
    validate_and_assign,
)
from josef_storage_local.dump_log import dump_log

TS = 1_700_000_000_000
PID = 4000


def dump(*args: str):
    result = CliRunner().invoke(dump_log, list(args))
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def append(log, batch: bytes) -> None:
    buf = bytearray(batch)
    log.append(buf, validate_and_assign(buf, log.log_end_offset, 3, 1 << 30))


def header_line(data: bytes, position: int) -> str:
    """What Kafka prints for the batch at ``position``, from its header fields read independently of the tool."""
    (base, length, epoch, magic, crc, attrs, delta, _, max_ts, pid, pepoch, base_seq,
     count) = struct.unpack_from(">qiibIhiqqqhii", data, position)
    last_seq = -1 if base_seq < 0 else base_seq + delta
    codec = ["none", "gzip", "snappy", "lz4", "zstd"][attrs & 7]
    flag = lambda bit: "true" if attrs & bit else "false"  # noqa: E731
    return (f"baseOffset: {base} lastOffset: {base + delta} count: {count} baseSequence: {base_seq} "
            f"lastSequence: {last_seq} producerId: {pid} producerEpoch: {pepoch} partitionLeaderEpoch: {epoch} "
            f"isTransactional: {flag(0x10)} isControl: {flag(0x20)} deleteHorizonMs: OptionalLong.empty "
            f"position: {position} CreateTime: {max_ts} size: {length + 12} magic: {magic} compresscodec: {codec} "
            f"crc: {crc} isvalid: true")


def test_a_transaction_a_marker_and_a_compressed_batch(harness):
    log = harness.open()
    append(log, build_batch([(b"k1", b"v1", TS), (None, b"v2", TS + 5, [("h1", b"x"), ("h2", None)])],
                            producer_id=PID, producer_epoch=2, base_sequence=0, attributes=TRANSACTIONAL_BIT))
    marker = build_marker(PID, 2, 7, True, TS + 9, base_offset=2, leader_epoch=3)  # written by the broker, as is
    log.append(marker, describe_batches(marker, 2))
    append(log, build_batch([(b"z", b"zipped" * 20, TS + 10), (b"z", None, TS + 11)], compression=Compression.GZIP))
    harness.storage.close()
    path = harness.segment_file(0, ".log")
    data = path.read_bytes()
    positions = [position for position, _ in iter_batches(data)]

    lines = dump("--files", str(path)).stdout.splitlines()
    assert lines == [f"Dumping {path}", "Log starting offset: 0"] + [header_line(data, p) for p in positions]
    assert "compresscodec: gzip" in lines[4] and "isTransactional: true isControl: true" in lines[3]

    lines = dump("--print-data-log", "--files", str(path)).stdout.splitlines()
    assert lines[2:] == [
        header_line(data, positions[0]),
        f"| offset: 0 CreateTime: {TS} keySize: 2 valueSize: 2 sequence: 0 headerKeys: [] key: k1 payload: v1",
        f"| offset: 1 CreateTime: {TS + 5} keySize: -1 valueSize: 2 sequence: 1 headerKeys: [h1,h2] payload: v2",
        header_line(data, positions[1]),
        f"| offset: 2 CreateTime: {TS + 9} keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: COMMIT coordinatorEpoch: 7",
        header_line(data, positions[2]),
        f"| offset: 3 CreateTime: {TS + 10} keySize: 1 valueSize: 120 sequence: -1 headerKeys: [] key: z payload: "
        + "zipped" * 20,
        f"| offset: 4 CreateTime: {TS + 11} keySize: 1 valueSize: -1 sequence: -1 headerKeys: [] key: z",
    ]
    deep = dump("--deep-iteration", "--files", str(path)).stdout.splitlines()
    assert deep[3] == lines[3].split(" key: ")[0]
    skipped = dump("--print-data-log", "--skip-record-metadata", "--files", str(path)).stdout.splitlines()
    assert skipped[3] == "| key: k1 payload: v1" and skipped[4] == "| payload: v2"


def test_a_torn_tail_is_reported_as_invalid_bytes(harness):
    log = harness.open()
    for i in range(3):
        append(log, build_batch([(None, b"x" * 30, TS + i)]))
    harness.storage.close()
    path = harness.segment_file(0, ".log")
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    lines = dump("--files", str(path)).stdout.splitlines()
    assert len([line for line in lines if line.startswith("baseOffset:")]) == 2
    last_size = len(data) - [p for p, _ in iter_batches(data)][-1]
    assert lines[-1] == f"Found {last_size - 10} invalid bytes at the end of {path.name}"


def test_a_flipped_byte_is_an_invalid_batch(harness):
    log = harness.open()
    append(log, build_batch([(None, b"payload", TS)]))
    harness.storage.close()
    path = harness.segment_file(0, ".log")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert dump("--files", str(path)).stdout.splitlines()[2].endswith(" isvalid: false")


def several_segments(harness):
    """Four segments of indexed batches, closed cleanly (indexes trimmed to their entries)."""
    log = harness.open()
    for i in range(30):
        harness.append(log, 2, timestamp=TS + i, value_size=60)
    bases = list(log.segment_base_offsets)
    harness.storage.close()
    assert len(bases) >= 3
    return bases


def test_offset_and_time_indexes_point_at_their_batches(harness):
    bases = several_segments(harness)
    index, timeindex = harness.segment_file(bases[1], ".index"), harness.segment_file(bases[1], ".timeindex")
    data = harness.segment_file(bases[1], ".log").read_bytes()
    last_offset_at = {position: header.last_offset for position, header in iter_batches(data)}
    result = dump("--files", f"{index},{timeindex}")
    lines = result.stdout.splitlines()
    entries = [line for line in lines if line.startswith("offset: ")]
    assert entries and lines[0] == f"Dumping {index}"
    for line in entries:
        _, offset, _, position = line.split()
        assert last_offset_at[int(position)] == int(offset)
    times = [line for line in lines if line.startswith("timestamp: ")]
    assert times and all(int(t.split()[1]) - TS == (int(t.split()[3]) - 1) // 2 for t in times)
    assert result.stderr == ""
    assert dump("--verify-index-only", "--files", str(index)).stdout.splitlines() == [f"Dumping {index}"]


def test_a_wrong_index_entry_is_a_mismatch(harness):
    bases = several_segments(harness)
    index = harness.segment_file(bases[1], ".index")
    data = bytearray(index.read_bytes())
    relative, position = struct.unpack_from(">ii", data, 0)
    struct.pack_into(">i", data, 0, relative + 1)
    index.write_bytes(bytes(data))
    result = dump("--verify-index-only", "--files", str(index))
    assert result.stderr.splitlines() == [
        f"Mismatches in :{index.absolute()}",
        f"  Index offset: {bases[1] + relative + 1}, log offset: {bases[1] + relative}",
    ]


def test_index_sanity_check(harness):
    bases = several_segments(harness)
    index, timeindex = harness.segment_file(bases[0], ".index"), harness.segment_file(bases[0], ".timeindex")
    assert dump("--index-sanity-check", "--files", str(index)).stdout.splitlines()[1] == f"{index} passed sanity check."
    index.write_bytes(index.read_bytes() + b"\x00\x00")
    result = dump("--index-sanity-check", "--files", f"{index},{timeindex}")
    assert result.exit_code == 1
    assert f"Index file {index.absolute()} is corrupt, found " in result.stderr
    assert result.stdout.splitlines()[-1] == f"{timeindex} passed sanity check."
    data = timeindex.read_bytes()
    timeindex.write_bytes(data + struct.pack(">qi", 5, 1))  # an entry older than the first: an unclean tail
    result = dump("--index-sanity-check", "--files", str(timeindex))
    assert "Corrupt time index found, time index file" in result.stderr
    assert "but the last timestamp is 5 which is less than the first timestamp" in result.stderr


def test_producer_snapshot_and_txn_index(harness):
    log = harness.open()
    batches = (BatchMetadata(0, 1, 0, 1, TS), BatchMetadata(2, 4, 5, 7, TS + 3))
    log.attach_producer_state(lambda: [ProducerEntry(PID, 2, batches, coordinator_epoch=7, current_txn_first_offset=5),
                                       ProducerEntry(PID + 1, 0)])
    for _ in range(4):
        harness.append(log, 2)
    log.append_aborted_txn(AbortedTxn(PID, 2, 6, 7))
    harness.storage.close()
    snapshot = harness.segment_file(8, ".snapshot")
    txnindex = harness.segment_file(0, ".txnindex")
    lines = dump("--files", f"{snapshot},{txnindex}").stdout.splitlines()
    assert lines == [
        f"Dumping {snapshot}",
        f"producerId: {PID} producerEpoch: 2 coordinatorEpoch: 7 currentTxnFirstOffset: OptionalLong[5] "
        f"lastTimestamp: {TS + 3} firstSequence: 2 lastSequence: 4 lastOffset: 7 offsetDelta: 2 timestamp: {TS + 3}",
        f"producerId: {PID + 1} producerEpoch: 0 coordinatorEpoch: -1 currentTxnFirstOffset: OptionalLong.empty "
        "lastTimestamp: -1",
        f"Dumping {txnindex}",
        f"version: 0 producerId: {PID} firstOffset: 2 lastOffset: 6 lastStableOffset: 7",
    ]
    snapshot.write_bytes(snapshot.read_bytes()[:-3])
    result = dump("--files", str(snapshot))
    assert result.stdout.splitlines() == [f"Dumping {snapshot}"]
    assert result.stderr.startswith(f"Snapshot {snapshot.absolute()} is corrupt: ")


def test_offsets_decoder_reads_kafka_bytes(tmp_path):
    """A hand-built OffsetCommit record (Kafka's bytes, not josef's encoder) decoded by the installed group plugin."""
    key = struct.pack(">hh", 1, 1) + b"g" + struct.pack(">h", 1) + b"t" + struct.pack(">i", 3)
    value = struct.pack(">hqih", 3, 42, 5, 4) + b"meta" + struct.pack(">q", TS)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(build_batch([(key, value, TS), (key, None, TS + 1), (None, b"x", TS + 2)]))
    lines = dump("--offsets-decoder", "--files", str(path)).stdout.splitlines()
    assert lines[3].endswith(' key: {"type":"1","data":{"group":"g","topic":"t","partition":3}} payload: '
                             '{"version":"3","data":{"offset":42,"leaderEpoch":5,"metadata":"meta",'
                             f'"commitTimestamp":{TS}}}}}')
    assert lines[4].endswith(' payload: <DELETE>')
    assert lines[5].endswith(" key: Failed to decode message at offset 2 using the specified decoder "
                             "(message had a missing key)")


def test_a_wrong_time_index_entry_is_reported(harness):
    bases = several_segments(harness)
    timeindex = harness.segment_file(bases[1], ".timeindex")
    data = bytearray(timeindex.read_bytes())
    timestamp, relative = struct.unpack_from(">qi", data, 0)
    struct.pack_into(">q", data, 0, timestamp + 7)
    timeindex.write_bytes(bytes(data))
    result = dump("--verify-index-only", "--files", str(timeindex))
    assert result.stdout.splitlines() == [f"Dumping {timeindex}"]
    assert result.stderr.splitlines()[:2] == [f"Found timestamp mismatch in :{timeindex.absolute()}",
                                              f"  Index timestamp: {timestamp + 7}, log timestamp: {timestamp}"]


def test_offset_gaps_are_listed_after_the_dump(tmp_path):
    """A compacted segment has gaps between batches: Kafka lists each after every file is dumped."""
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(build_batch([(b"a", b"1", TS), (b"b", b"2", TS)], base_offset=0)
                     + build_batch([(b"a", b"3", TS)], base_offset=5))
    result = dump("--deep-iteration", "--files", str(path))
    assert [line.split(" CreateTime")[0] for line in result.stdout.splitlines() if line.startswith("|")] == [
        "| offset: 0", "| offset: 1", "| offset: 5"]
    assert result.stderr.splitlines() == [f"Non-consecutive offsets in {path.absolute()}", "  1 is followed by 5"]
