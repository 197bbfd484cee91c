"""Actions that change the cluster: create a topic, reset a group's committed offsets. Off unless enabled.

Each action is offered only with ``console.actions.enable=true``, only to a
request from the console's own pages (the browser's ``Origin`` must be the
node itself: a page elsewhere cannot make a logged-in browser act), and only
when the cluster's authorizer grants the HTTP user what Kafka would require
of a client doing the same (CREATE on the cluster or the topic; READ on the
group and each of its topics). It is then done with the Kafka request a
client would send: CreateTopics (which the broker forwards to the active
controller, whose policies apply), ListOffsets and OffsetCommit to the
group's coordinator, which refuses a group that has members.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import anyio
from aiohttp import web

from josef.authorizer import CLUSTER_NAME, Action
from josef.protocol.api_keys import ApiKey
from josef.services import BrokerServices
from josef_console.cluster import EARLIEST, LATEST, ClusterReader
from josef_console.html import Html, h, path_part

#: Kafka's legal topic names (``Topic.validate``).
TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
#: How long a create or a commit may take: the controller waits for the topic's leaders.
ACTION_TIMEOUT_S = 30.0
#: How long a created topic may take to reach this node's metadata image before its page is shown anyway.
SEEN_TIMEOUT_S = 5.0
RESETS = {"earliest": EARLIEST, "latest": LATEST}


class Refused(Exception):
    """The action was not done; ``message`` says why, for the page."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def same_origin(request: web.Request) -> bool:
    """Whether the request comes from a page of this node (Origin, or Referer when a browser sends no Origin)."""
    expected = f"{request.scheme}://{request.host}"
    origin = request.headers.get("Origin")
    if origin is None:
        referer = urlsplit(request.headers.get("Referer", ""))
        origin = f"{referer.scheme}://{referer.netloc}" if referer.netloc else None
    return origin == expected


def authorized(services: BrokerServices, context: Any, actions: Sequence[Action]) -> list[bool]:
    """The authorizer's answers for the HTTP user (``context`` is the listener's authorization context)."""
    if not actions:
        return []
    if context is None:
        return [False] * len(actions)
    return list(services.authorizer.authorize(context, list(actions)))


def _error(code: Any, message: str | None) -> str:
    name = getattr(code, "name", str(code)).upper()
    return f"{name}: {message}" if message else name


async def create_topic(services: BrokerServices, reader: ClusterReader, context: Any, name: str, partitions: int,
                       replication_factor: int) -> str:
    """Create ``name`` (CreateTopics v7 through this broker, which forwards it to the active controller); -1 takes the
    cluster's default for either number."""
    if not TOPIC_NAME.match(name) or name in (".", ".."):
        raise Refused(f"{name!r} is not a legal topic name (letters, digits, '.', '_' and '-', at most 249)")
    if not any(authorized(services, context, [Action("CREATE", "CLUSTER", CLUSTER_NAME),
                                              Action("CREATE", "TOPIC", name)])):
        raise Refused(f"{getattr(context, 'principal', 'this user')} may not create topic {name}")
    with anyio.fail_after(ACTION_TIMEOUT_S):
        response = await services.call_peer(reader.broker_to_ask(), ApiKey.CREATE_TOPICS, {
            "topics": [{"name": name, "num_partitions": partitions, "replication_factor": replication_factor,
                        "assignments": [], "configs": []}],
            "timeout": int(ACTION_TIMEOUT_S * 1000), "validate_only": False}, version=7)
    [result] = response.topics
    if result.error_code != 0:
        raise Refused(f"topic {name} was not created: {_error(result.error_code, result.error_message)}")
    # The controller answered once the topic was committed; this node's image may be a moment behind it, and the
    # topic's page, where the browser goes next, shows this node's image.
    with anyio.move_on_after(SEEN_TIMEOUT_S):
        while name not in services.image.topics:
            await anyio.sleep(0.05)
    return f"Created topic {name} ({result.num_partitions} partitions, replication factor {result.replication_factor})"


async def reset_offsets(services: BrokerServices, reader: ClusterReader, context: Any, group_id: str, to: str) -> str:
    """Set the group's committed offsets to its partitions' earliest or latest offsets, as ``kafka-consumer-groups.sh
    --reset-offsets --to-earliest|--to-latest --all-topics --execute`` does; only while the group has no members."""
    if to not in RESETS:
        raise Refused(f"cannot reset offsets to {to!r}: earliest or latest")
    if not all(authorized(services, context, [Action("READ", "GROUP", group_id)])):
        raise Refused(f"{getattr(context, 'principal', 'this user')} may not read group {group_id}")
    group, _ = await reader.group(group_id)
    if group is None:
        raise Refused(f"group {group_id} does not exist")
    if group.type == "share":
        raise Refused("resetting a share group's offsets is not offered here (kafka-share-groups.sh --reset-offsets)")
    if group.state != "Empty":
        raise Refused(f"group {group_id} is {group.state}: its offsets can be reset only while it has no members")
    tps = sorted({(p.topic, p.partition) for p in group.partitions if p.committed is not None})
    if not tps:
        raise Refused(f"group {group_id} has no committed offsets to reset")
    topics = sorted({t for t, _ in tps})
    refused = [t for t, ok in zip(topics, authorized(services, context, [Action("READ", "TOPIC", t) for t in topics]))
               if not ok]
    if refused:
        raise Refused(f"{getattr(context, 'principal', 'this user')} may not read {', '.join(refused)}")
    offsets, _ = await reader.offsets(tps, RESETS[to])
    missing = [f"{t}-{p}" for t, p in tps if (t, p) not in offsets]
    if missing:
        raise Refused(f"the {to} offsets of {', '.join(missing)} could not be read (no leader?)")
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset,
                                               "committed_leader_epoch": -1, "committed_metadata": ""})
    with anyio.fail_after(ACTION_TIMEOUT_S):
        response = await services.call_peer(group.coordinator, ApiKey.OFFSET_COMMIT, {
            "group_id": group_id, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}, version=9)
    failed = [f"{t.name}-{p.partition_index} ({_error(p.error_code, None)})" for t in response.topics
              for p in t.partitions if p.error_code != 0]
    if failed:
        raise Refused(f"the offsets of group {group_id} were not reset: {', '.join(failed)}")
    return f"Reset the offsets of group {group_id} to {to} on {len(offsets)} partitions"


# The forms: outside <main>, so that a refresh never clears what is being typed ------------------------------


def create_topic_form(root: str) -> Html:
    return Html(f'<aside id="actions"><h2>Create a topic</h2>'
                f'<form method="post" action="{h(root)}topics" id="create-topic">'
                '<label>Name <input name="name" required maxlength="249" autocomplete="off"></label>'
                '<label>Partitions <input name="partitions" type="number" min="-1" value="-1"></label>'
                '<label>Replication factor <input name="replication_factor" type="number" min="-1" value="-1"></label>'
                '<button type="submit">Create</button></form>'
                '<p class="muted">-1: the cluster\'s default (num.partitions, default.replication.factor).</p></aside>')


def reset_offsets_form(root: str, group_id: str) -> Html:
    return Html(f'<aside id="actions"><h2>Reset offsets</h2>'
                f'<form method="post" action="{h(root)}groups/{h(path_part(group_id))}/reset-offsets" id="reset-offsets">'
                '<label>To <select name="to"><option value="latest">latest (skip what is there)</option>'
                '<option value="earliest">earliest (read everything again)</option></select></label>'
                '<button type="submit">Reset</button></form>'
                '<p class="muted">Only while the group has no members: stop its consumers first.</p></aside>')
