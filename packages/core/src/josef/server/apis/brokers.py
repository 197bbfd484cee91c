"""BrokerRegistration, BrokerHeartbeat, AssignReplicasToDirs and AllocateProducerIds: what brokers ask the active controller.

Answered on controller listeners (and in-process in single-node mode).
Requests reaching a node that is not the active controller get
NOT_CONTROLLER, and the broker asks again once it knows the new one.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError
from josef.metadata.image import dir_to_text
from josef.metadata.records import SECURITY_PROTOCOL_NAMES, Endpoint
from josef.server.apis.common import id_text
from josef.server.dispatch import RequestContext


async def broker_registration(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if request.cluster_id != ctx.broker.cluster_id:
        return {"throttle_time": 0, "error_code": ErrorCode.inconsistent_cluster_id, "broker_epoch": -1}
    endpoints = [Endpoint(l.name, l.host, l.port, SECURITY_PROTOCOL_NAMES.get(l.security_protocol, "PLAINTEXT"))
                 for l in request.listeners]
    features = {f.name: (f.min_supported_version, f.max_supported_version) for f in request.features}
    try:
        epoch = await ctx.broker.controller.register_broker(
            request.broker_id, id_text(request.incarnation_id), endpoints, request.rack, features,
            getattr(request, "previous_broker_epoch", -1), [dir_to_text(d) for d in getattr(request, "log_dirs", ())])
    except ControllerError as exc:
        return {"throttle_time": 0, "error_code": exc.code, "broker_epoch": -1}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "broker_epoch": epoch}


async def broker_heartbeat(ctx: RequestContext, request: Any) -> dict[str, Any]:
    try:
        caught_up, fenced, shut_down = await ctx.broker.controller.broker_heartbeat(
            request.broker_id, request.broker_epoch, request.current_metadata_offset, request.want_fence,
            request.want_shut_down, [dir_to_text(d) for d in getattr(request, "offline_log_dirs", ())])
    except ControllerError as exc:
        return {"throttle_time": 0, "error_code": exc.code, "is_caught_up": False, "is_fenced": True,
                "should_shut_down": False}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "is_caught_up": caught_up, "is_fenced": fenced,
            "should_shut_down": shut_down}


async def assign_replicas_to_dirs(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """Which log directory each of a broker's replicas is in (KIP-858); an error per partition, in request order."""
    assignments = [(dir_to_text(d.id_), id_text(t.topic_id), p.partition_index)
                   for d in request.directories for t in d.topics for p in t.partitions]
    try:
        codes = iter(await ctx.broker.controller.assign_replicas_to_dirs(
            request.broker_id, request.broker_epoch, assignments))
    except ControllerError as exc:
        return {"throttle_time": 0, "error_code": exc.code, "directories": []}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "directories": [
        {"id_": d.id_, "topics": [{"topic_id": t.topic_id, "partitions": [
            {"partition_index": p.partition_index, "error_code": next(codes)} for p in t.partitions]}
            for t in d.topics]} for d in request.directories]}


async def allocate_producer_ids(ctx: RequestContext, request: Any) -> dict[str, Any]:
    try:
        block = await ctx.broker.controller.allocate_producer_ids(request.broker_id, request.broker_epoch)
    except ControllerError as exc:
        return {"throttle_time": 0, "error_code": exc.code, "producer_id_start": -1, "producer_id_len": 0}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id_start": block.first_id,
            "producer_id_len": block.size}
