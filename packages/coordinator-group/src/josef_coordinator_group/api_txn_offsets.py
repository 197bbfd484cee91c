"""TxnOffsetCommit (v0-v5): a transactional producer commits a group's offsets (``send_offsets_to_transaction``).

The offsets are written to the group's ``__consumer_offsets`` partition as a
transactional batch of the producer (its id and epoch), so they take effect
only when the transaction coordinator's COMMIT marker reaches that partition
(WriteTxnMarkers), and never if it aborts: read-process-write pipelines then
move their input position and their output together. Until the marker the
offsets are pending (:mod:`josef_coordinator_group.offsets`): OffsetFetch
does not return them, and answers UNSTABLE_OFFSET_COMMIT to consumers that
``require_stable``.

Checks follow Kafka 4.x (``OffsetMetadataManager.commitTransactionalOffset``):
topics the metadata does not know are UNKNOWN_TOPIC_OR_PARTITION; an empty
group id INVALID_GROUP_ID; a group that does not exist is created (a simple
group) for generation -1 and ILLEGAL_GENERATION otherwise. From v3 a producer
passes its consumer's group metadata: a member id, generation and instance
id that are given must match (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID,
ILLEGAL_GENERATION), so a zombie that lost its partitions in a rebalance
cannot commit; without them anyone may commit, whatever the group's state.
A KIP-848 member's stale epoch is ILLEGAL_GENERATION too, the error
producers know. A producer fenced by a newer epoch in this partition gets
INVALID_PRODUCER_EPOCH from the append.

Before the write the offsets partition is verified with the transaction
coordinator (KIP-890, ``transaction.partition.verification.enable``): was
it added to the producer's transaction (AddOffsetsToTxn)? From v5
(Transactions V2) the producer sends no AddOffsetsToTxn and the
coordinator adds the partition itself (:mod:`josef.producer.txn_verification`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef.server.dispatch import RequestContext
from josef_coordinator_group.api_common import with_shard
from josef_coordinator_group.api_offsets import CommitTopics, PartitionErrors, write_offsets
from josef_coordinator_group.group import GroupError

if TYPE_CHECKING:
    from josef_coordinator_group.coordinator import GroupCoordinator
    from josef_coordinator_group.shard import GroupShard

#: From this version on producers use Transactions V2: they send no AddOffsetsToTxn, the coordinator adds the partition.
ADD_PARTITION_VERSION = 5
#: A KIP-848 member's epoch errors, which a transactional producer knows as ILLEGAL_GENERATION (as Kafka maps them).
_MEMBER_EPOCH_ERRORS = frozenset({ErrorCode.stale_member_epoch, ErrorCode.fenced_member_epoch})


@attrs.frozen
class TxnCommitRequest:
    group_id: str
    producer_id: int
    producer_epoch: int
    #: -1, "" and None before v3 (the request has no member fields then).
    generation_id: int
    member_id: str
    group_instance_id: str | None
    #: Topics that exist, with ``(partition, offset, leader epoch, metadata)``.
    topics: CommitTopics
    #: The producer's transactional id: the offsets partition is verified with its coordinator (KIP-890).
    transactional_id: str | None = None
    #: TxnOffsetCommit v5+ (Transactions V2): the coordinator adds the offsets partition, no AddOffsetsToTxn came.
    add_partition: bool = False


def validate_txn_commit(shard: GroupShard, request: TxnCommitRequest) -> None:
    """Kafka's ``validateTransactionalOffsetCommit``; raises :class:`GroupError`."""
    consumer_group = shard.consumer_groups.get(request.group_id)
    group = shard.groups.get(request.group_id)
    if consumer_group is not None:
        try:
            shard.consumer_membership.validate_offset_commit(
                consumer_group, request.member_id, request.generation_id, transactional=True,
                instance_id=request.group_instance_id)
        except GroupError as exc:
            if exc.code in _MEMBER_EPOCH_ERRORS:
                raise GroupError(ErrorCode.illegal_generation, str(exc)) from exc
            raise
    elif group is not None:
        group.validate_offset_commit(request.member_id, request.group_instance_id, request.generation_id,
                                     transactional=True)
    elif request.generation_id >= 0:
        raise GroupError(ErrorCode.illegal_generation, f"group {request.group_id} does not exist")
    # Otherwise the replayed records create the simple group, as for a plain commit.


async def commit_transactional_offsets(shard: GroupShard, request: TxnCommitRequest,
                                       verification: object | None = None) -> PartitionErrors:
    """Validate the committer, write the offsets in the producer's transaction; each partition's error code.

    ``verification`` is the guard of the partition's verification with the transaction coordinator, made first.
    """
    try:
        validate_txn_commit(shard, request)
    except GroupError as exc:
        shard.refused()
        return {(topic, p[0]): exc.code for topic, partitions in request.topics for p in partitions}
    errors, _ = await write_offsets(shard, request.group_id, request.topics, producer_id=request.producer_id,
                                    producer_epoch=request.producer_epoch, verification=verification)
    return errors


class TxnOffsetApis:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    async def txn_offset_commit(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        topics = ctx.services.image.topics
        errors: PartitionErrors = {(t.name, p.partition_index): ErrorCode.unknown_topic_or_partition
                                   for t in request.topics if t.name not in topics for p in t.partitions}
        commit = TxnCommitRequest(
            group_id=request.group_id,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
            transactional_id=request.transactional_id,
            add_partition=ctx.api_version >= ADD_PARTITION_VERSION,
            generation_id=getattr(request, "generation_id", -1),
            member_id=getattr(request, "member_id", ""),
            group_instance_id=getattr(request, "group_instance_id", None),
            topics=[(t.name, [(p.partition_index, p.committed_offset, getattr(p, "committed_leader_epoch", -1),
                               p.committed_metadata) for p in t.partitions])
                    for t in request.topics if t.name in topics],
        )
        known = [(topic, p[0]) for topic, partitions in commit.topics for p in partitions]
        if known:
            errors.update(await self._commit(commit, known))
        return {"throttle_time": 0, "topics": [
            {"name": t.name, "partitions": [{"partition_index": p.partition_index,
                                              "error_code": errors[(t.name, p.partition_index)]}
                                             for p in t.partitions]}
            for t in request.topics]}

    async def _commit(self, commit: TxnCommitRequest, known: list[tuple[str, int]]) -> PartitionErrors:
        if not commit.group_id:
            return dict.fromkeys(known, ErrorCode.invalid_group_id)
        if commit.producer_id < 0:
            # A transactional batch needs a producer id: answered as one no transaction knows.
            return dict.fromkeys(known, ErrorCode.invalid_producer_id_mapping)

        try:
            verification = None
            if commit.transactional_id is not None:
                # Before the shard's lock, as Kafka verifies before it schedules the write.
                context, _ = await self.coordinator.shard_for(commit.group_id)
                verification = await context.verify_transaction(commit.transactional_id, commit.producer_id,
                                                                 commit.producer_epoch,
                                                                 add_partition=commit.add_partition)

            async def operation(shard: GroupShard) -> PartitionErrors:
                return await commit_transactional_offsets(shard, commit, verification)

            return await with_shard(self.coordinator, commit.group_id, operation)
        except CoordinatorError as exc:
            return dict.fromkeys(known, exc.code)
