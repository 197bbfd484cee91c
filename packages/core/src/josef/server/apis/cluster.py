"""Metadata and DescribeCluster: what clients learn about brokers, controllers, topics and leaders."""

from __future__ import annotations

import logging
from typing import Any, Iterable

from kio.schema.errors import ErrorCode

from josef.metadata.image import BrokerImage, MetadataImage, PartitionImage, TopicImage
from josef.metadata.records import Endpoint, uuid_to_text
from josef.protocol.messages import OPERATIONS_OMITTED
from josef.server.dispatch import RequestContext

log = logging.getLogger(__name__)


#: DescribeCluster's endpoint types (KIP-919): which nodes a client asks for, and what a listener serves.
BROKER_ENDPOINTS, CONTROLLER_ENDPOINTS = 1, 2
_ENDPOINT_NAMES = {BROKER_ENDPOINTS: "BROKER", CONTROLLER_ENDPOINTS: "CONTROLLER"}


def _node(broker: BrokerImage, endpoint: Endpoint) -> dict[str, Any]:
    """One node as Metadata and DescribeCluster list it; each response keeps the id field its version has."""
    return {"node_id": broker.broker_id, "broker_id": broker.broker_id, "host": endpoint.host,
            "port": endpoint.port, "rack": broker.rack, "is_fenced": broker.fenced}


def _brokers(image: MetadataImage, listener: str, include_fenced: bool = False) -> list[dict[str, Any]]:
    result = []
    for broker in sorted(image.brokers.values(), key=lambda b: b.broker_id):
        endpoint = broker.endpoint(listener)
        if endpoint is None or (broker.fenced and not include_fenced):
            continue
        result.append(_node(broker, endpoint))
    return result


def is_internal(name: str) -> bool:
    """Whether clients should treat the topic as the broker's own (offsets, transactions, metadata)."""
    return name.startswith("__")


def missing_topic(code: ErrorCode, name: str | None, topic_id: Any = None) -> dict[str, Any]:
    """A requested topic that cannot be described, in the shape Metadata and DescribeTopicPartitions share."""
    return {"error_code": code, "name": name, "topic_id": topic_id, "is_internal": False, "partitions": (),
            "topic_authorized_operations": OPERATIONS_OMITTED}


def _partition(image: MetadataImage, index: int, p: PartitionImage) -> dict[str, Any]:
    # Metadata has no ELR fields (the builder drops them); DescribeTopicPartitions reports KIP-966's.
    # Replicas on fenced or unknown brokers are offline, as Kafka's KRaft metadata cache reports them.
    offline = tuple(b for b in p.replicas if b not in image.brokers or image.brokers[b].fenced)
    return {"error_code": ErrorCode.none if p.leader >= 0 else ErrorCode.leader_not_available,
            "partition_index": index, "leader_id": p.leader, "leader_epoch": p.leader_epoch,
            "replica_nodes": p.replicas, "isr_nodes": p.isr, "offline_replicas": offline,
            "eligible_leader_replicas": p.elr, "last_known_elr": p.last_known_elr}


def topic_metadata(image: MetadataImage, topic: TopicImage, indexes: Iterable[int] | None = None) -> dict[str, Any]:
    """A topic and its partitions at ``indexes`` (all of them by default), as Metadata and DescribeTopicPartitions answer it."""
    chosen = sorted(topic.partitions) if indexes is None else [i for i in indexes if i in topic.partitions]
    return {
        "error_code": ErrorCode.none,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": is_internal(topic.name),
        "partitions": [_partition(image, index, topic.partitions[index]) for index in chosen],
        "topic_authorized_operations": OPERATIONS_OMITTED,
    }


async def metadata(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    requested = request.topics
    if requested is None or (ctx.api_version == 0 and not requested):
        topics = [topic_metadata(broker.image, t) for t in broker.image.topics.values()]
    elif ctx.api_version < 12 and any(t.name is None or getattr(t, "topic_id", None) is not None for t in requested):
        # Kafka: "Topic name can not be null" / "Topic IDs are not supported in requests for version 10/11", an
        # INVALID_REQUEST for every topic, its null name answered as "" (the response has no null name before v12).
        topics = [missing_topic(ErrorCode.invalid_request, t.name or "", getattr(t, "topic_id", None))
                  for t in requested]
    else:
        topics = []
        allow_create = getattr(request, "allow_auto_topic_creation", True) and broker.config["auto.create.topics.enable"]
        # Each topic is answered once however often it is named, as Kafka answers (a set of the names or ids): a
        # request naming a topic of thousands of partitions ten thousand times must not build an answer that large.
        seen: set[object] = set()
        for entry in requested:
            name, topic_id = entry.name, getattr(entry, "topic_id", None)
            key = name if name is not None else topic_id
            if key in seen:
                continue
            seen.add(key)
            if name is None and topic_id is not None:
                found = broker.image.topic_by_id(uuid_to_text(topic_id))
                topics.append(topic_metadata(broker.image, found) if found else missing_topic(ErrorCode.unknown_topic_id, None, topic_id))
                continue
            topic = broker.image.topics.get(name)
            if topic is None and allow_create:
                error = await _auto_create(ctx, name)
                topic = broker.image.topics.get(name)
                if topic is None:
                    # Created (now or by another broker) but not yet in this broker's metadata: Kafka's answer
                    # for a topic being created, which clients retry, rather than a topic without partitions.
                    topics.append(missing_topic(error if error != ErrorCode.none else ErrorCode.leader_not_available, name))
                    continue
            if topic is None:
                topics.append(missing_topic(ErrorCode.unknown_topic_or_partition, name))
            else:
                topics.append(topic_metadata(broker.image, topic))
    return {
        "throttle_time": 0,
        "brokers": _brokers(broker.image, ctx.listener_name),
        "cluster_id": broker.cluster_id,
        "controller_id": _controller_for_clients(broker),
        "topics": topics,
        "cluster_authorized_operations": OPERATIONS_OMITTED,
        "error_code": ErrorCode.none,
    }


async def _auto_create(ctx: RequestContext, name: str) -> ErrorCode:
    error, message = await ctx.broker.channel.create_topic(name)
    if error not in (ErrorCode.none, ErrorCode.topic_already_exists):
        log.info("automatic creation of topic %r failed: %s", name, message)
        return error
    return ErrorCode.none


def _controller_for_clients(broker: Any) -> int:
    """The "controller" clients of a broker listener are told of: in KRaft, a live broker, as Kafka answers.

    Clients send controller-bound requests (CreateTopics, ...) to it and the
    broker forwards them; the real controllers are not reachable on client
    listeners. josef names the broker answering, which is live by definition.
    """
    return broker.node_id if broker.is_broker else broker.quorum.controller_id


def _served_endpoint_type(ctx: RequestContext) -> int:
    """What the listener a request came in on serves: Kafka answers DescribeCluster for controllers only on a
    controller listener (``controller.listener.names`` of a node with the controller role), for brokers only
    on the others, so a client bootstrapped to one kind of endpoint never mistakes it for the other."""
    config = ctx.broker.config
    if "controller" in config["process.roles"] and ctx.listener_name in config["controller.listener.names"]:
        return CONTROLLER_ENDPOINTS
    return BROKER_ENDPOINTS


def _controllers(ctx: RequestContext) -> list[dict[str, Any]]:
    """The controllers and their controller listeners; an in-process quorum has only this node, on this listener."""
    node = ctx.broker
    endpoints = dict(node.quorum.controllers())
    if not endpoints:
        bound = next((l for l in node.bound if l.name == ctx.listener_name), None)
        if bound is None:
            return []
        endpoints = {node.node_id: (bound.host, bound.port)}
    # A controller is never fenced: fencing is what the controller does to brokers.
    return [{"broker_id": node_id, "host": host, "port": port, "rack": None, "is_fenced": False}
            for node_id, (host, port) in sorted(endpoints.items())]


async def describe_cluster(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    requested = getattr(request, "endpoint_type", BROKER_ENDPOINTS)
    served = _served_endpoint_type(ctx)
    if requested != served:
        # v0 has no endpoint type, so neither of KIP-919's error codes: Kafka answers INVALID_REQUEST there.
        if requested not in _ENDPOINT_NAMES:
            code, message = ErrorCode.unsupported_endpoint_type, f"Unsupported endpoint type {requested}"
        else:
            code = ErrorCode.mismatched_endpoint_type
            message = (f"The request was sent to an endpoint of type {_ENDPOINT_NAMES[served]}, "
                       f"but we wanted an endpoint of type {_ENDPOINT_NAMES[requested]}")
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request if ctx.api_version == 0 else code,
                "error_message": message, "cluster_id": broker.cluster_id, "brokers": ()}
    if served == CONTROLLER_ENDPOINTS:
        nodes = _controllers(ctx)
    else:
        nodes = _brokers(broker.image, ctx.listener_name, getattr(request, "include_fenced_brokers", False))
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "endpoint_type": served,
        "cluster_id": broker.cluster_id,
        "controller_id": broker.quorum.controller_id if served == CONTROLLER_ENDPOINTS else _controller_for_clients(broker),
        "brokers": nodes,
        "cluster_authorized_operations": OPERATIONS_OMITTED,
    }
