"""``josef dump-log`` over files written with josef's own record builders, in kafka-dump-log.sh's output shapes."""

from __future__ import annotations

import io
import struct
import uuid

import pytest
from click.testing import CliRunner
from kio.schema.k_raft_version_record.v0.data import KRaftVersionRecord
from kio.schema.leader_change_message.v0.data import LeaderChangeMessage, Voter
from kio.schema.snapshot_footer_record.v0.data import SnapshotFooterRecord
from kio.schema.snapshot_header_record.v0.data import SnapshotHeaderRecord
from kio.schema.voters_record.v0 import data as voters
from kio.serial import entity_writer

from josef.cli import build_cli
from josef.metadata.records import (
    BrokerEndpoint,
    ConfigRecord,
    FeatureLevelRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    encode,
    uuid_to_text,
)
from josef.protocol.records import CONTROL_BIT, TRANSACTIONAL_BIT, build_batch
from josef_storage_local.dump_log import dump_log, java_double, snake_upper

TOPIC_ID = uuid.UUID("ab4182dd-e902-43c6-915e-6e59648b84a4")
TOPIC_ID_TEXT = uuid_to_text(TOPIC_ID)
DIRECTORY = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
TS = 1_700_000_000_000


def serialize(message) -> bytes:
    out = io.BytesIO()
    entity_writer(type(message))(out, message)
    return out.getvalue()


def control_batch(kind: int, message, base_offset: int, epoch: int = 1) -> bytes:
    return build_batch([(struct.pack(">hh", 0, kind), serialize(message), TS)], base_offset=base_offset,
                       attributes=CONTROL_BIT, leader_epoch=epoch)


def metadata_batch(records, base_offset: int, epoch: int = 1) -> bytes:
    return build_batch([(None, encode(r), TS + i) for i, r in enumerate(records)], base_offset=base_offset,
                       leader_epoch=epoch)


FIRST = [FeatureLevelRecord(name="metadata.version", feature_level=25), TopicRecord(name="foo", topic_id=TOPIC_ID)]
SECOND = [
    PartitionRecord(partition_id=0, topic_id=TOPIC_ID, replicas=(1,), isr=(1,), leader=1, leader_epoch=0,
                    partition_epoch=0, directories=(DIRECTORY,)),
    RegisterBrokerRecord(broker_id=1, incarnation_id=DIRECTORY, broker_epoch=7,
                         end_points=(BrokerEndpoint(name="PLAINTEXT", host="localhost", port=9092, security_protocol=0),),
                         fenced=False),
    ConfigRecord(resource_type=2, resource_name="foo", name="retention.ms", value="1000"),
    PartitionChangeRecord(partition_id=0, topic_id=TOPIC_ID, isr=(1, 2)),
]
LEADER_CHANGE = LeaderChangeMessage(version=0, leader_id=1, voters=(Voter(voter_id=1), Voter(voter_id=2)),
                                    granting_voters=(Voter(voter_id=1),))


@pytest.fixture
def metadata_segment(tmp_path):
    """A ``__cluster_metadata`` segment: two batches of metadata records, then a LeaderChange control batch."""
    directory = tmp_path / "__cluster_metadata-0"
    directory.mkdir()
    path = directory / "00000000000000000000.log"
    batches = [control_batch(2, LEADER_CHANGE, 0), metadata_batch(FIRST, 1), metadata_batch(SECOND, 3)]
    path.write_bytes(b"".join(batches))
    return path, batches


def run(*args: str):
    result = CliRunner().invoke(dump_log, list(args))
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_the_command_is_registered_on_josef():
    assert "dump-log" in build_cli().commands


def test_batches_only_without_flags(metadata_segment):
    path, batches = metadata_segment
    lines = run("--files", str(path)).stdout.splitlines()
    assert lines[:2] == [f"Dumping {path}", "Log starting offset: 0"]
    assert len(lines) == 5 and not any(line.startswith("|") for line in lines)
    crc = struct.unpack_from(">I", batches[0], 17)[0]
    assert lines[2] == (
        "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
        "partitionLeaderEpoch: 1 isTransactional: false isControl: true deleteHorizonMs: OptionalLong.empty "
        f"position: 0 CreateTime: {TS} size: {len(batches[0])} magic: 2 compresscodec: none crc: {crc} isvalid: true")
    assert lines[3].startswith("baseOffset: 1 lastOffset: 2 count: 2 ")
    assert f" isControl: false deleteHorizonMs: OptionalLong.empty position: {len(batches[0])} CreateTime: {TS + 1} " in lines[3]
    assert lines[4].startswith("baseOffset: 3 lastOffset: 6 count: 4 ")
    assert f"position: {len(batches[0]) + len(batches[1])} " in lines[4]


def test_cluster_metadata_decoder_prints_kafkas_json(metadata_segment):
    path, _ = metadata_segment
    lines = run("--cluster-metadata-decoder", "--files", str(path)).stdout.splitlines()
    records = [line for line in lines if line.startswith("|")]
    assert records[0] == (
        f"| offset: 0 CreateTime: {TS} keySize: 4 valueSize: {len(serialize(LEADER_CHANGE))} sequence: -1 headerKeys: [] "
        'LeaderChange: {"version":0,"leaderId":1,"voters":[{"voterId":1},{"voterId":2}],"grantingVoters":[{"voterId":1}]}')
    payloads = [line.split(" payload: ", 1)[1] for line in records[1:]]
    directory = uuid_to_text(DIRECTORY)
    assert payloads == [
        '{"type":"FEATURE_LEVEL_RECORD","version":0,"data":{"name":"metadata.version","featureLevel":25}}',
        f'{{"type":"TOPIC_RECORD","version":0,"data":{{"name":"foo","topicId":"{TOPIC_ID_TEXT}"}}}}',
        '{"type":"PARTITION_RECORD","version":2,"data":{"partitionId":0,"topicId":"%s","replicas":[1],"isr":[1],'
        '"removingReplicas":[],"addingReplicas":[],"leader":1,"leaderEpoch":0,"partitionEpoch":0,'
        '"directories":["%s"]}}' % (TOPIC_ID_TEXT, directory),
        '{"type":"REGISTER_BROKER_RECORD","version":3,"data":{"brokerId":1,"isMigratingZkBroker":false,'
        '"incarnationId":"%s","brokerEpoch":7,"endPoints":[{"name":"PLAINTEXT","host":"localhost","port":9092,'
        '"securityProtocol":0}],"features":[],"rack":null,"fenced":false,"inControlledShutdown":false}}' % directory,
        '{"type":"CONFIG_RECORD","version":0,"data":{"resourceType":2,"resourceName":"foo","name":"retention.ms",'
        '"value":"1000"}}',
        # Tagged fields appear only when they differ from their defaults (leader -2, no ELR...).
        f'{{"type":"PARTITION_CHANGE_RECORD","version":2,"data":{{"partitionId":0,"topicId":"{TOPIC_ID_TEXT}","isr":[1,2]}}}}',
    ]
    assert records[1].startswith(f"| offset: 1 CreateTime: {TS} keySize: -1 valueSize: ")
    assert records[2].startswith(f"| offset: 2 CreateTime: {TS + 1} keySize: -1 ")


def test_deep_iteration_prints_records_without_payloads(metadata_segment):
    path, _ = metadata_segment
    records = [line for line in run("--deep-iteration", "--files", str(path)).stdout.splitlines()
               if line.startswith("|")]
    assert [line.split()[2] for line in records] == ["0", "1", "2", "3", "4", "5", "6"]
    assert "LeaderChange: " in records[0]  # control records are decoded whatever the flags
    assert not any("payload:" in line for line in records)


def test_plain_segment_with_keys_headers_and_idempotent_batches(tmp_path):
    path = tmp_path / "00000000000000000042.log"
    idempotent = build_batch([(b"k", b"hello", TS, [("h1", b"x"), ("h2", None)]), (None, b"world", TS + 5)],
                             base_offset=42, producer_id=7, producer_epoch=0, base_sequence=2147483647,
                             attributes=TRANSACTIONAL_BIT)
    plain = build_batch([(b"only-key", None, TS + 9)], base_offset=44)
    path.write_bytes(idempotent + plain)
    lines = run("--print-data-log", "--files", str(path)).stdout.splitlines()
    assert lines[1] == "Log starting offset: 42"
    assert lines[2].startswith("baseOffset: 42 lastOffset: 43 count: 2 baseSequence: 2147483647 lastSequence: 0 "
                               "producerId: 7 producerEpoch: 0 partitionLeaderEpoch: -1 isTransactional: true ")
    assert f"CreateTime: {TS + 5} size: {len(idempotent)} " in lines[2]
    assert lines[3] == (f"| offset: 42 CreateTime: {TS} keySize: 1 valueSize: 5 sequence: 2147483647 "
                        "headerKeys: [h1,h2] key: k payload: hello")
    assert lines[4] == f"| offset: 43 CreateTime: {TS + 5} keySize: -1 valueSize: 5 sequence: 0 headerKeys: [] payload: world"
    assert lines[6] == f"| offset: 44 CreateTime: {TS + 9} keySize: 8 valueSize: -1 sequence: -1 headerKeys: [] key: only-key"
    skipped = run("--print-data-log", "--skip-record-metadata", "--files", str(path)).stdout.splitlines()
    assert skipped[3:5] == ["| key: k payload: hello", "| payload: world"]


def test_snapshot_checkpoint_with_header_footer_and_voters(tmp_path):
    path = tmp_path / "00000000000000000005-0000000003.checkpoint"
    voter = voters.Voter(voter_id=1, voter_directory_id=DIRECTORY,
                         endpoints=(voters.Endpoint(name="CONTROLLER", host="localhost", port=9093),),
                         k_raft_version_feature=voters.KRaftVersionFeature(min_supported_version=0,
                                                                           max_supported_version=1))
    path.write_bytes(b"".join([
        build_batch([(struct.pack(">hh", 0, 3), serialize(SnapshotHeaderRecord(version=0, last_contained_log_timestamp=TS)), TS),
                     (struct.pack(">hh", 0, 5), serialize(KRaftVersionRecord(version=0, k_raft_version=1)), TS),
                     (struct.pack(">hh", 0, 6), serialize(voters.VotersRecord(version=0, voters=(voter,))), TS)],
                    attributes=CONTROL_BIT, leader_epoch=3),
        metadata_batch([TopicRecord(name="foo", topic_id=TOPIC_ID)], 3, epoch=3),
        build_batch([(struct.pack(">hh", 0, 4), serialize(SnapshotFooterRecord(version=0)), TS)], base_offset=4,
                    attributes=CONTROL_BIT, leader_epoch=3),
    ]))
    lines = run("--cluster-metadata-decoder", "--files", str(path)).stdout.splitlines()
    assert lines[1] == "Snapshot end offset: 5, epoch: 3"
    records = [line for line in lines if line.startswith("|")]
    assert records[0].endswith(f' SnapshotHeader {{"version":0,"lastContainedLogTimestamp":{TS}}}')
    assert records[1].endswith(' KRaftVersion {"version":0,"kRaftVersion":1}')
    assert records[2].endswith(
        ' KRaftVoters {"version":0,"voters":[{"voterId":1,"voterDirectoryId":"%s","endpoints":[{"name":"CONTROLLER",'
        '"host":"localhost","port":9093}],"kRaftVersionFeature":{"minSupportedVersion":0,"maxSupportedVersion":1}}]}'
        % uuid_to_text(DIRECTORY))
    assert records[3].endswith(f'payload: {{"type":"TOPIC_RECORD","version":0,"data":{{"name":"foo","topicId":"{TOPIC_ID_TEXT}"}}}}')
    assert records[4].endswith(' SnapshotFooter {"version":0}')


def test_corrupt_batches_are_reported_never_a_traceback(metadata_segment):
    path, batches = metadata_segment
    data = bytearray(path.read_bytes())
    second = len(batches[0])
    data[second + 70] ^= 0xFF  # inside the records of the second batch: its CRC no longer matches
    path.write_bytes(bytes(data) + b"\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x01\x00partial")
    result = run("--cluster-metadata-decoder", "--files", str(path))
    batch_lines = [line for line in result.stdout.splitlines() if line.startswith("baseOffset:")]
    assert [line.endswith("isvalid: true") for line in batch_lines] == [True, False, True]
    assert result.stdout.splitlines()[-1] == f"Found 19 invalid bytes at the end of {path.name}"
    assert result.exit_code == 0


def test_a_batch_whose_records_cannot_be_read_gets_one_line(tmp_path):
    path = tmp_path / "00000000000000000000.log"
    batch = bytearray(build_batch([(None, b"value", TS)]))
    batch[57:61] = struct.pack(">i", 3)  # claims three records, holds one (the CRC is not rechecked when reading)
    path.write_bytes(bytes(batch))
    lines = run("--print-data-log", "--files", str(path)).stdout.splitlines()
    assert lines[2].endswith("isvalid: false")
    assert lines[3].startswith("| cannot read the records of the batch at position 0: ")


def test_a_broken_length_stops_the_dump_with_a_clear_line(metadata_segment):
    path, batches = metadata_segment
    data = bytearray(path.read_bytes())
    struct.pack_into(">i", data, len(batches[0]) + 8, -5)
    path.write_bytes(bytes(data))
    lines = run("--files", str(path)).stdout.splitlines()
    assert len([line for line in lines if line.startswith("baseOffset:")]) == 1
    assert lines[3] == f"Found record size -5 smaller than minimum record overhead (14) in file {path}."
    assert lines[4] == f"Found {len(data) - len(batches[0])} invalid bytes at the end of {path.name}"


def test_max_bytes_reads_only_whole_batches_within_the_limit(metadata_segment):
    path, batches = metadata_segment
    lines = run("--max-bytes", str(len(batches[0]) + 10), "--files", str(path)).stdout.splitlines()
    assert len([line for line in lines if line.startswith("baseOffset:")]) == 1
    assert not any(line.startswith("Found") for line in lines)


def test_indexes_unknown_and_missing_files(tmp_path, metadata_segment):
    path, batches = metadata_segment
    index = path.with_suffix(".index")
    # Three entries that agree with the log (each names the last offset of the batch at its position),
    # then the zeroed, preallocated tail.
    index.write_bytes(struct.pack(">ii", 0, 0) + struct.pack(">ii", 2, len(batches[0])) +
                      struct.pack(">ii", 6, len(batches[0]) + len(batches[1])) + bytes(16))
    timeindex = path.with_suffix(".timeindex")
    timeindex.write_bytes(struct.pack(">qi", TS + 1, 2) + struct.pack(">qi", TS + 3, 6) + bytes(24))
    txnindex = path.with_suffix(".txnindex")
    txnindex.write_bytes(struct.pack(">hqqqq", 0, 7, 10, 12, 10))
    empty = tmp_path / "00000000000000000100.index"
    empty.write_bytes(b"")
    missing = tmp_path / "00000000000000000200.log"
    unknown = tmp_path / "leader-epoch-checkpoint"
    unknown.write_text("0\n0\n")
    result = run("--files", ",".join(str(p) for p in (index, timeindex, txnindex, empty, missing, unknown, path)))
    out = result.stdout.splitlines()
    assert out[:4] == [f"Dumping {index}", "offset: 0 position: 0", f"offset: 2 position: {len(batches[0])}",
                       f"offset: 6 position: {len(batches[0]) + len(batches[1])}"]
    assert out[4:7] == [f"Dumping {timeindex}", f"timestamp: {TS + 1} offset: 2", f"timestamp: {TS + 3} offset: 6"]
    assert out[7:9] == [f"Dumping {txnindex}", "version: 0 producerId: 7 firstOffset: 10 lastOffset: 12 lastStableOffset: 10"]
    assert out[9:11] == [f"Dumping {empty}", f"{empty} is empty."]
    assert out[11:14] == [f"Dumping {missing}", f"Dumping {unknown}", f"Dumping {path}"]
    assert f"Error: cannot read {missing}: No such file or directory" in result.stderr
    assert f"Ignoring unknown file {unknown}" in result.stderr
    assert "Mismatches" not in result.stderr
    assert result.exit_code == 1  # a file could not be read


def test_index_entries_that_disagree_with_the_log_are_reported(metadata_segment):
    path, batches = metadata_segment
    index = path.with_suffix(".index")
    index.write_bytes(struct.pack(">ii", 0, 0) + struct.pack(">ii", 5, len(batches[0])))
    result = run("--files", str(index))
    assert f"Mismatches in :{index.absolute()}\n  Index offset: 5, log offset: 2\n" in result.stderr


def test_a_value_that_is_not_a_metadata_record(tmp_path):
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(build_batch([(None, b"not a record", TS)]))
    lines = run("--cluster-metadata-decoder", "--files", str(path)).stdout.splitlines()
    assert " payload: Error at 0, skipping. " in lines[3]


def test_numbers_and_names_as_kafka_writes_them():
    assert [java_double(v) for v in (1.0, 1024.5, 1e7, 12345678.9, 0.0001, 0.001, -2.5e-5, 0.0)] == [
        "1.0", "1024.5", "1.0E7", "1.23456789E7", "1.0E-4", "0.001", "-2.5E-5", "0.0"]
    assert [snake_upper(n) for n in ("RegisterBrokerRecord", "TopicRecord", "ZkMigrationRecord", "NoOpRecord")] == [
        "REGISTER_BROKER_RECORD", "TOPIC_RECORD", "ZK_MIGRATION_RECORD", "NO_OP_RECORD"]
