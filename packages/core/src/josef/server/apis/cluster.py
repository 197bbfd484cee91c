"""Metadata and DescribeCluster: what clients learn about brokers, topics and leaders."""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError
from josef.metadata.image import MetadataImage, TopicImage
from josef.metadata.records import uuid_to_text
from josef.protocol.messages import OPERATIONS_OMITTED
from josef.server.dispatch import RequestContext

log = logging.getLogger(__name__)


def _brokers(image: MetadataImage, listener: str, include_fenced: bool = False) -> list[dict[str, Any]]:
    result = []
    for broker in sorted(image.brokers.values(), key=lambda b: b.broker_id):
        endpoint = broker.endpoint(listener)
        if endpoint is None or (broker.fenced and not include_fenced):
            continue
        result.append({"node_id": broker.broker_id, "broker_id": broker.broker_id, "host": endpoint.host,
                       "port": endpoint.port, "rack": broker.rack, "is_fenced": broker.fenced})
    return result


def _missing(code: ErrorCode, name: str | None, topic_id: Any = None) -> dict[str, Any]:
    return {"error_code": code, "name": name, "topic_id": topic_id, "is_internal": False, "partitions": (),
            "topic_authorized_operations": OPERATIONS_OMITTED}


def _topic(topic: TopicImage) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": topic.name.startswith("__"),
        "partitions": [
            {"error_code": ErrorCode.none if p.leader >= 0 else ErrorCode.leader_not_available,
             "partition_index": index, "leader_id": p.leader, "leader_epoch": p.leader_epoch,
             "replica_nodes": p.replicas, "isr_nodes": p.isr, "offline_replicas": ()}
            for index, p in sorted(topic.partitions.items())
        ],
        "topic_authorized_operations": OPERATIONS_OMITTED,
    }


async def metadata(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    requested = request.topics
    if requested is None or (ctx.api_version == 0 and not requested):
        topics = [_topic(t) for t in broker.image.topics.values()]
    else:
        topics = []
        allow_create = getattr(request, "allow_auto_topic_creation", True) and broker.config["auto.create.topics.enable"]
        for entry in requested:
            name = entry.name
            if name is None and getattr(entry, "topic_id", None) is not None:
                found = broker.image.topic_by_id(uuid_to_text(entry.topic_id))
                topics.append(_topic(found) if found else _missing(ErrorCode.unknown_topic_id, None, entry.topic_id))
                continue
            topic = broker.image.topics.get(name)
            if topic is None and allow_create:
                error = await _auto_create(ctx, name)
                topic = broker.image.topics.get(name)
                if topic is None:
                    topics.append(_missing(error, name))
                    continue
            if topic is None:
                topics.append(_missing(ErrorCode.unknown_topic_or_partition, name))
            else:
                topics.append(_topic(topic))
    return {
        "throttle_time": 0,
        "brokers": _brokers(broker.image, ctx.listener_name),
        "cluster_id": broker.cluster_id,
        "controller_id": broker.quorum.controller_id,
        "topics": topics,
        "cluster_authorized_operations": OPERATIONS_OMITTED,
        "error_code": ErrorCode.none,
    }


async def _auto_create(ctx: RequestContext, name: str) -> ErrorCode:
    try:
        await ctx.broker.controller.create_topic(name)
    except ControllerError as exc:
        if exc.code != ErrorCode.topic_already_exists:
            log.info("automatic creation of topic %r failed: %s", name, exc.message)
            return exc.code
    return ErrorCode.none


async def describe_cluster(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    endpoint_type = getattr(request, "endpoint_type", 1)
    if endpoint_type not in (1, 2):
        return {"error_code": ErrorCode.unsupported_endpoint_type, "error_message": f"unknown endpoint type {endpoint_type}",
                "endpoint_type": endpoint_type, "cluster_id": broker.cluster_id, "controller_id": -1, "brokers": (),
                "throttle_time": 0}
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "endpoint_type": endpoint_type,
        "cluster_id": broker.cluster_id,
        "controller_id": broker.quorum.controller_id,
        "brokers": _brokers(broker.image, ctx.listener_name, getattr(request, "include_fenced_brokers", False)),
        "cluster_authorized_operations": OPERATIONS_OMITTED,
    }
