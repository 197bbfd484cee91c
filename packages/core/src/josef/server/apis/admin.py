"""CreateTopics, DeleteTopics and CreatePartitions: requests the controller decides.

CreateTopics is checked by the node's create-topic policy (:mod:`josef.policy`);
CreatePartitions is not, as in Kafka's KRaft controller. Either is refused
(POLICY_VIOLATION) when it would write more metadata records than Kafka's
controller writes for one operation. No topic may be named after the
metadata log (``__cluster_metadata``).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError
from josef.metadata.records import uuid_to_text
from josef.server.apis.configs import topic_config_entries
from josef.server.dispatch import RequestContext

#: Kafka's QuorumController.MAX_RECORDS_PER_USER_OP: an operation that would write more metadata records than
#: this is refused before anything is built (a CreatePartitions to 2**31-1 partitions once took all memory).
MAX_RECORDS_PER_OPERATION = 10_000
#: What Kafka answers such an operation (POLICY_VIOLATION).
EXCESSIVE = "Unable to perform excessively large batch operation."
#: The metadata log's partition directory: a topic of this name would share it, and deleting the topic would
#: close the metadata log's files under the quorum (Kafka's ControllerApis refuses it by name).
METADATA_TOPIC = "__cluster_metadata"


async def create_topics(ctx: RequestContext, request: Any) -> dict[str, Any]:
    controller = ctx.broker.controller
    topics = []
    for topic in request.topics:
        result: dict[str, Any] = {"name": topic.name, "topic_id": None, "error_code": ErrorCode.none,
                                  "error_message": None, "num_partitions": -1, "replication_factor": -1, "configs": None}
        if topic.name == METADATA_TOPIC:
            result.update(error_code=ErrorCode.invalid_request,
                          error_message=f"Creation of internal topic {METADATA_TOPIC} is prohibited.")
            topics.append(result)
            continue
        partitions = len(topic.assignments) if topic.assignments else topic.num_partitions
        if partitions >= MAX_RECORDS_PER_OPERATION:  # a topic record and one per partition
            result.update(error_code=ErrorCode.policy_violation, error_message=EXCESSIVE)
            topics.append(result)
            continue
        try:
            created = await controller.create_topic(
                topic.name, topic.num_partitions, topic.replication_factor,
                {a.partition_index: list(a.broker_ids) for a in topic.assignments},
                {c.name: c.value for c in topic.configs}, request.validate_only,
                policy=ctx.broker.policies.create_topic)
        except ControllerError as exc:
            result.update(error_code=exc.code, error_message=exc.message)
        else:
            result.update(topic_id=created.topic.topic_id, num_partitions=len(created.topic.partitions),
                          replication_factor=created.replication_factor,
                          configs=[{k: e[k] for k in ("name", "value", "read_only", "config_source", "is_sensitive")}
                                   for e in topic_config_entries(ctx.broker, created.configs)])
        topics.append(result)
    return {"throttle_time": 0, "topics": topics}


async def delete_topics(ctx: RequestContext, request: Any) -> dict[str, Any]:
    controller = ctx.broker.controller
    if hasattr(request, "topics"):
        wanted = [(t.name, uuid_to_text(t.topic_id) if t.name is None and t.topic_id is not None else None)
                  for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    responses = []
    for name, topic_id in wanted:
        result: dict[str, Any] = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.none,
                                  "error_message": None}
        try:
            deleted = await controller.delete_topic(name, topic_id)
            result.update(name=deleted.name, topic_id=deleted.topic_id)
        except ControllerError as exc:
            result.update(error_code=exc.code, error_message=exc.message)
        responses.append(result)
    return {"throttle_time": 0, "responses": responses}


async def create_partitions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    results = []
    for topic in request.topics:
        result: dict[str, Any] = {"name": topic.name, "error_code": ErrorCode.none, "error_message": None}
        assignments = [list(a.broker_ids) for a in topic.assignments] if topic.assignments else None
        existing = ctx.broker.image.topics.get(topic.name)
        if existing is not None and topic.count - len(existing.partitions) > MAX_RECORDS_PER_OPERATION:
            result.update(error_code=ErrorCode.policy_violation, error_message=EXCESSIVE)
            results.append(result)
            continue
        try:
            await ctx.broker.controller.create_partitions(topic.name, topic.count, assignments, request.validate_only)
        except ControllerError as exc:
            result.update(error_code=exc.code, error_message=exc.message)
        results.append(result)
    return {"throttle_time": 0, "results": results}
