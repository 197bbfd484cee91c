"""A single-voter KRaft quorum: the ``__cluster_metadata`` log on this node.

With one voter, a record is committed as soon as it is durable on this node,
so the quorum is the metadata log plus its epoch bookkeeping. The log lives in
the broker's log storage as partition ``__cluster_metadata-0``, in the same
record-batch format as any topic; each start is a new leader epoch of the
only voter, recorded in ``quorum-state`` as Kafka does. A multi-voter Raft
quorum replaces this class without changing the broker, which only sees
:class:`josef.metadata.quorum.MetadataQuorum`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Mapping, Sequence

import anyio
import anyio.abc
import anyio.to_thread

from josef.config import Config, ConfigError
from josef.log import Log, LogConfig, LogStorage
from josef.meta_properties import log_dirs, read
from josef.metadata.quorum import CommitListener, NotControllerError
from josef.metadata.records import MetadataRecord, UnknownRecordError, decode, encode
from josef.protocol.records import ConsumerRecord, build_batch, iter_batches, iter_records, validate_and_assign
from josef.protocol.topic_partition import TopicPartition
from josef.server.dispatch import Handler

METADATA_PARTITION = TopicPartition("__cluster_metadata", 0)
#: The metadata log is never deleted by retention: snapshots do not exist yet.
METADATA_LOG_CONFIG = LogConfig(segment_bytes=64 * 1024 * 1024, retention_ms=-1, retention_bytes=-1)
_READ_CHUNK = 8 * 1024 * 1024


def parse_voters(items: list[str]) -> dict[int, str]:
    """``controller.quorum.voters``: ``id@host:port`` items into ``{id: "host:port"}``."""
    voters = {}
    for item in items:
        node, sep, address = item.partition("@")
        if not sep or not node.isdigit() or ":" not in address:
            raise ConfigError(f"invalid value {item!r} for configuration controller.quorum.voters: not ID@HOST:PORT")
        voters[int(node)] = address
    return voters


def _decode(log: Log, record: ConsumerRecord) -> MetadataRecord:
    try:
        return decode(record.value or b"")
    except UnknownRecordError as exc:
        hint = ""
        if (record.value or b"").startswith(b"{"):
            hint = ("; it is a JSON record of a josef release older than Kafka's record format, which this release "
                    "cannot read: format the log directories again")
        raise ConfigError(f"metadata log {log.dir}, offset {record.offset}: {exc}{hint}") from None


class SingleVoterQuorum:
    def __init__(self, config: Config, log_storage: LogStorage) -> None:
        self._config = config
        self._storage = log_storage
        self._node_id: int = config["node.id"]
        voters = parse_voters(config["controller.quorum.voters"] or [])
        if voters and set(voters) != {self._node_id}:
            raise ConfigError(
                f"controller.quorum.voters names {sorted(voters)}: this josef release runs a single voter, "
                f"which must be this node ({self._node_id})"
            )
        if "controller" not in config["process.roles"]:
            raise ConfigError("process.roles must include controller: this josef release runs KRaft in combined mode only")
        self._log: Log | None = None
        self._listener: CommitListener | None = None
        self._epoch = 0
        self._lock = anyio.Lock()
        directory = log_dirs(config)[0]
        props = read(directory)
        if props is None:
            raise ConfigError(f"log directory {directory} is not formatted")
        self._cluster_id = props.cluster_id

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def controller_id(self) -> int:
        return self._node_id if self._log is not None else -1

    def controllers(self) -> Mapping[int, tuple[str, int]]:
        return {}

    def controller_endpoint(self, node_id: int) -> tuple[str, int] | None:
        return None  # the only controller is in this process

    def apis(self) -> Sequence[tuple[int, Handler, int, int]]:
        return ()

    async def start(self, listener: CommitListener, tg: anyio.abc.TaskGroup) -> None:
        log = self._storage.open(METADATA_PARTITION, METADATA_LOG_CONFIG)
        self._replay(log, listener)
        self._epoch = self._elect(log)
        log.assign_epoch(self._epoch, log.log_end_offset)
        self._log, self._listener = log, listener

    def _replay(self, log: Log, listener: CommitListener) -> None:
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            chunk = log.read(offset, _READ_CHUNK, log.log_end_offset)
            for pos, header in iter_batches(chunk):
                if header.last_offset < offset:
                    continue
                records = [_decode(log, r) for r in iter_records(memoryview(chunk)[pos : pos + header.size])]
                listener(header.last_offset, records)
                offset = header.last_offset + 1

    def _elect(self, log: Log) -> int:
        """Become leader of a new epoch and persist it in ``quorum-state``, as a sole voter does."""
        path = log.dir / "quorum-state"
        previous = 0
        if path.exists():
            previous = json.loads(path.read_text())["leaderEpoch"]
        epoch = max(previous, log.epoch_entries()[-1].epoch if log.epoch_entries() else 0) + 1
        state = {"leaderId": self._node_id, "leaderEpoch": epoch, "votedId": self._node_id,
                 "appliedOffset": 0, "currentVoters": [{"voterId": self._node_id}], "data_version": 0}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)
        return epoch

    async def append(self, records: Sequence[MetadataRecord]) -> int:
        if self._log is None or self._listener is None:
            raise NotControllerError("the metadata quorum is not started")
        async with self._lock:
            log = self._log
            now = int(time.time() * 1000)
            batch = bytearray(build_batch([(None, encode(r), now) for r in records]))
            info = validate_and_assign(batch, log.log_end_offset, self._epoch, len(batch))
            log.append(batch, info)
            # Metadata is committed only once durable: a single voter has no other copy.
            await anyio.to_thread.run_sync(log.flush)
            self._listener(info.last_offset, records)
            return info.last_offset

    async def close(self) -> None:
        self._log = None
