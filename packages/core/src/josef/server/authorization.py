"""What each request must be allowed, and what a refusal looks like: Kafka's ``KafkaApis`` authorization, as one stage.

:class:`Authorization` is the first stage of every dispatcher's request
pipeline (:meth:`josef.server.dispatch.Dispatcher.add_stage`). For each API
it asks the authorizer, in one batch, for the actions Kafka's broker would
ask for, then:

- refuses the whole request where Kafka does (an operation on the cluster,
  on the request's one group or transactional id): the handler is not
  called, and every error code of the response carries
  CLUSTER_/GROUP_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED
  (:func:`josef.protocol.error_responses.error_response`);
- refuses entries where Kafka does (topics of a Produce, groups of a
  DescribeGroups, resources of a DescribeConfigs...): the handler gets the
  request without them and the response gets an error entry for each;
- hides what a principal may not see where Kafka does (the topics of a
  Metadata request for all topics, groups of ListGroups, transactions of
  ListTransactions);
- fills in ``authorized_operations`` where the request asks for them
  (Metadata, DescribeGroups, DescribeCluster, DescribeTopicPartitions,
  ConsumerGroupDescribe).

Handlers therefore never ask the authorizer. Produce and Fetch, read by
josef's own codecs, carry their refused topics in the decoded request
(``refused_topics``) rather than being cut, so that fetch sessions and the
pre-encoded answers stay as they are.

With the permissive default (``allow-all``) only the ``authorized_operations``
are filled in: the other rules would allow everything, so they are skipped
and the hot path costs nothing.

APIs not listed need no permission (ApiVersions, the SASL APIs, the
telemetry APIs), or are CLUSTER_ACTION, which brokers and controllers send
each other (:data:`CLUSTER_ACTIONS`). RenewDelegationToken and
ExpireDelegationToken ask no ACL either: the controller allows only a
token's owner and renewers, as Kafka's does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import attrs
from kio.schema.errors import ErrorCode

from josef.acls import SUPPORTED_OPERATIONS, ResourceType
from josef.authorizer import CLUSTER_NAME, Action, AllowAll, Authorizer
from josef.delegation_tokens import allow_token_requests
from josef.metadata.records import uuid_to_text
from josef.protocol import fetch_codec
from josef.protocol.api_keys import ApiKey
from josef.protocol.error_responses import error_response
from josef.protocol.messages import build, response_type
from josef.security import KafkaPrincipal
from josef.server.apis.delegation_tokens import create_answer, requested_owner
from josef.server.dispatch import Handler, Later, RequestContext, UnanswerableRequestError

E = ErrorCode
TOPIC, GROUP, CLUSTER, TXN = "TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"

#: What brokers and controllers ask each other, which only CLUSTER_ACTION principals may.
CLUSTER_ACTIONS = frozenset({
    ApiKey.WRITE_TXN_MARKERS, ApiKey.VOTE, ApiKey.BEGIN_QUORUM_EPOCH, ApiKey.END_QUORUM_EPOCH,
    ApiKey.FETCH_SNAPSHOT, ApiKey.ALTER_PARTITION, ApiKey.ENVELOPE, ApiKey.BROKER_REGISTRATION,
    ApiKey.BROKER_HEARTBEAT, ApiKey.UNREGISTER_BROKER, ApiKey.ALLOCATE_PRODUCER_IDS,
    ApiKey.CONTROLLER_REGISTRATION, ApiKey.ASSIGN_REPLICAS_TO_DIRS, ApiKey.UPDATE_RAFT_VOTER,
    ApiKey.INITIALIZE_SHARE_GROUP_STATE, ApiKey.READ_SHARE_GROUP_STATE, ApiKey.WRITE_SHARE_GROUP_STATE,
    ApiKey.DELETE_SHARE_GROUP_STATE, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY,
})
#: Requests that need one operation on the cluster, and nothing else.
CLUSTER_OPERATIONS: dict[int, str] = {
    **{key: "CLUSTER_ACTION" for key in CLUSTER_ACTIONS},
    ApiKey.ELECT_LEADERS: "ALTER",
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: "ALTER",
    ApiKey.LIST_PARTITION_REASSIGNMENTS: "DESCRIBE",
    ApiKey.ALTER_REPLICA_LOG_DIRS: "ALTER",
    ApiKey.DESCRIBE_LOG_DIRS: "DESCRIBE",
    ApiKey.CREATE_ACLS: "ALTER",
    ApiKey.DELETE_ACLS: "ALTER",
    ApiKey.DESCRIBE_ACLS: "DESCRIBE",
    ApiKey.DESCRIBE_CLIENT_QUOTAS: "DESCRIBE_CONFIGS",
    ApiKey.ALTER_CLIENT_QUOTAS: "ALTER_CONFIGS",
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: "DESCRIBE",
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: "ALTER",
    ApiKey.UPDATE_FEATURES: "ALTER",
    ApiKey.DESCRIBE_QUORUM: "DESCRIBE",
    ApiKey.ADD_RAFT_VOTER: "ALTER",
    ApiKey.REMOVE_RAFT_VOTER: "ALTER",
    ApiKey.LIST_CONFIG_RESOURCES: "DESCRIBE_CONFIGS",
}
#: Config resource types (DescribeConfigs, AlterConfigs) -> the ACL resource deciding on them.
_CONFIG_RESOURCES = {2: TOPIC, 4: CLUSTER, 8: CLUSTER, 16: CLUSTER, 32: GROUP}
#: FindCoordinator key types -> the resource they name.
_COORDINATOR_KEYS = {0: GROUP, 1: TXN, 2: GROUP}

Answer = Any
Rule = Callable[["Check", RequestContext, Any, Handler], Awaitable[Answer]]


@attrs.define
class Check:
    """One request's questions to the authorizer, asked in batches."""

    authorizer: Authorizer
    ctx: RequestContext

    def allowed(self, operation: str, resource_type: str, names: Iterable[str]) -> set[str]:
        """Which of ``names`` the principal may ``operation`` (one authorizer call for them all)."""
        unique = list(dict.fromkeys(names))
        if not unique:
            return set()
        answers = self.authorizer.authorize(self.ctx, [Action(operation, resource_type, n) for n in unique])
        return {name for name, ok in zip(unique, answers) if ok}

    def may(self, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> bool:
        return self.authorizer.authorize(self.ctx, [Action(operation, resource_type, name)])[0]

    def operations(self, resource_type: str, names: Sequence[str]) -> dict[str, int]:
        """Kafka's ``authorized_operations`` bit field of each resource (every supported operation, one call)."""
        supported = SUPPORTED_OPERATIONS[ResourceType[resource_type]]
        actions = [Action(op.name, resource_type, name) for name in names for op in supported]
        answers = iter(self.authorizer.authorize(self.ctx, actions)) if actions else iter(())
        return {name: sum(1 << op for op in supported if next(answers)) for name in names}


class Authorization:
    """The request pipeline's authorization stage (see the module)."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer
        self.permissive = isinstance(authorizer, AllowAll)

    async def __call__(self, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
        key = ctx.api_key
        rule = (OPERATIONS_RULES if self.permissive else RULES).get(key)
        if rule is not None:
            return await rule(Check(self.authorizer, ctx), ctx, request, handler)
        if key in CLUSTER_OPERATIONS and not self.permissive:
            if not Check(self.authorizer, ctx).may(CLUSTER_OPERATIONS[key], CLUSTER):
                return refuse(ctx, request, E.cluster_authorization_failed)
        return await handler(ctx, request)


# Building answers --------------------------------------------------------------------------------------------


def refuse(ctx: RequestContext, request: Any, code: ErrorCode) -> Any:
    """The whole request refused: ``code`` in every error code of its response."""
    response = error_response(ctx.api_key, ctx.api_version, request, code, None)  # type: ignore[arg-type]
    if response is None:
        # An acks=0 produce: Kafka closes the connection rather than drop records silently.
        raise UnanswerableRequestError(f"{code.name} for a request that gets no response")
    return response


def _as_response(ctx: RequestContext, answer: Any) -> Any:
    return build(response_type(ctx.api_key, ctx.api_version), answer) if isinstance(answer, dict) else answer


def then(answer: Any, change: Callable[[Any], Any]) -> Any:
    """``change`` applied to the handler's answer, now or when a :class:`Later` one is ready."""
    if isinstance(answer, Later):
        async def later() -> Any:
            return change(await answer.body)
        return Later(later())
    return change(answer)


async def split(ctx: RequestContext, request: Any, handler: Handler, field: str, response_field: str,
                refused: Callable[[Any], ErrorCode | None]) -> Answer:
    """The handler answers the entries of ``field`` that ``refused`` returns None for; the others get its code.

    The error entries are what :func:`error_response` makes of a request
    holding only them, appended to the handler's ``response_field``.
    """
    entries = getattr(request, field) or ()
    by_code: dict[ErrorCode, list[Any]] = {}
    kept = []
    for entry in entries:
        code = refused(entry)
        if code is None:
            kept.append(entry)
        else:
            by_code.setdefault(code, []).append(entry)
    if not by_code:
        return await handler(ctx, request)
    extra: list[Any] = []
    for code, items in by_code.items():
        part = error_response(ctx.api_key, ctx.api_version, dataclasses.replace(request, **{field: tuple(items)}),
                              code, None)  # type: ignore[arg-type]
        extra += getattr(part, response_field)
    answer = await handler(ctx, dataclasses.replace(request, **{field: tuple(kept)}))

    def merged(body: Any) -> Any:
        body = _as_response(ctx, body)
        return dataclasses.replace(body, **{response_field: (*getattr(body, response_field), *extra)})

    return then(answer, merged)


def _edit(ctx: RequestContext, change: Callable[[dict[str, Any]], None]) -> Callable[[Any], Any]:
    """A change to a handler's dict answer (answers that are already kio objects are edited as dicts too)."""
    def edit(body: Any) -> Any:
        if not isinstance(body, dict):
            body = {f.name: getattr(body, f.name) for f in dataclasses.fields(body)}
        change(body)
        return body
    return edit


def _name(entry: Any) -> str:
    if isinstance(entry, str):
        return entry
    return (getattr(entry, "name", None) or getattr(entry, "topic", None) or getattr(entry, "topic_name", None)
            or getattr(entry, "group_id", None) or "")


def _topic_names(ctx: RequestContext, entries: Iterable[Any]) -> list[str]:
    """Topic names of request entries, resolving topic ids through the image (unknown ids are skipped)."""
    image = ctx.broker.image
    names = []
    for entry in entries:
        name = _name(entry)
        topic_id = getattr(entry, "topic_id", None)
        if not name and topic_id is not None:
            name = image.topic_names.get(uuid_to_text(topic_id), "")
        if name:
            names.append(name)
    return names


def _topic_rule(operation: str, field: str = "topics", response_field: str = "topics") -> Rule:
    """Entries of ``field`` are topics that need ``operation``; the others answer TOPIC_AUTHORIZATION_FAILED."""
    async def rule(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
        entries = getattr(request, field) or ()
        allowed = check.allowed(operation, TOPIC, _topic_names(ctx, entries))
        image = ctx.broker.image

        def refused(entry: Any) -> ErrorCode | None:
            name = _name(entry)
            topic_id = getattr(entry, "topic_id", None)
            if not name and topic_id is not None:
                name = image.topic_names.get(uuid_to_text(topic_id), "")
                if not name:
                    return None  # the handler answers UNKNOWN_TOPIC_ID
            return None if name in allowed else E.topic_authorization_failed
        return await split(ctx, request, handler, field, response_field, refused)
    return rule


def _resource_rule(operation: str, resource_type: str, field: str, response_field: str, code: ErrorCode) -> Rule:
    """Entries of ``field`` (names) each need ``operation`` on their own resource; refused ones answer ``code``."""
    async def rule(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
        entries = getattr(request, field) or ()
        allowed = check.allowed(operation, resource_type, (_name(e) for e in entries))
        return await split(ctx, request, handler, field, response_field,
                           lambda entry: None if _name(entry) in allowed else code)
    return rule


def _one(operation: str, resource_type: str, name_of: Callable[[Any], str | None], code: ErrorCode,
         then_rule: Rule | None = None) -> Rule:
    """The request's one resource (a group, a transactional id) needs ``operation``, else it is refused whole."""
    async def rule(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
        name = name_of(request)
        if name is not None and not check.may(operation, resource_type, name):
            return refuse(ctx, request, code)
        if then_rule is not None:
            return await then_rule(check, ctx, request, handler)
        return await handler(ctx, request)
    return rule


def _group_id(request: Any) -> str:
    return request.group_id


def _transactional_id(request: Any) -> str | None:
    return request.transactional_id


# The rules, one per API -----------------------------------------------------------------------------------


async def _produce(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    if request.transactional_id and not check.may("WRITE", TXN, request.transactional_id):
        return refuse(ctx, request, E.transactional_id_authorization_failed)
    names = _topic_names(ctx, request.topic_data)
    allowed = check.allowed("WRITE", TOPIC, names)
    if len(allowed) < len(set(names)):
        if request.acks == 0:
            raise UnanswerableRequestError("acks=0 produce to topics the principal may not write to")
        request.refused_topics = frozenset(names) - allowed
    return await handler(ctx, request)


async def _fetch(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    if not isinstance(request, fetch_codec.FetchRequest):
        # The metadata quorum's Fetch on a controller listener (kio's request, not the broker's codec): as Kafka's
        # ControllerApis, only CLUSTER_ACTION principals (brokers, controllers) may read the metadata log.
        if not check.may("CLUSTER_ACTION", CLUSTER):
            return refuse(ctx, request, E.cluster_authorization_failed)
        return await handler(ctx, request)
    if request.replica_id >= 0 and check.may("CLUSTER_ACTION", CLUSTER):
        return await handler(ctx, request)
    image = ctx.broker.image
    names = set(_topic_names(ctx, request.topics))
    if request.session_id > 0:
        # The session's partitions are read too, not only the ones this request names (Kafka authorizes them all).
        session = ctx.broker.fetch_sessions.get(request.session_id)
        if session is not None:
            names.update(c.topic or (image.topic_names.get(uuid_to_text(c.topic_id), "") if c.topic_id else "")
                         for c in session.partitions.values())
    names.discard("")
    # A follower without CLUSTER_ACTION: Kafka refuses every partition of its fetch.
    allowed = set() if request.replica_id >= 0 else check.allowed("READ", TOPIC, names)
    if len(allowed) < len(names):
        request.refused_topics = frozenset(names - allowed)
    return await handler(ctx, request)


async def _metadata(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    requested = request.topics
    everything = requested is None or (ctx.api_version == 0 and not requested)
    if everything:
        answer = await handler(ctx, request)
        visible = check.allowed("DESCRIBE", TOPIC, ctx.broker.image.topics)

        def hide(body: dict[str, Any]) -> None:
            body["topics"] = [t for t in body["topics"] if _get(t, "name") in visible]
        return then(then(answer, _edit(ctx, hide)), _metadata_operations(check, ctx, request))
    image = ctx.broker.image
    names = _topic_names(ctx, requested)
    described = check.allowed("DESCRIBE", TOPIC, names)
    creatable: set[str] = set()
    missing = [n for n in described if n not in image.topics]
    if missing and getattr(request, "allow_auto_topic_creation", True):
        creatable = set(missing) if check.may("CREATE", CLUSTER) else check.allowed("CREATE", TOPIC, missing)

    def refused(entry: Any) -> ErrorCode | None:
        name = _name(entry)
        if not name:
            return None
        if name not in described:
            return E.topic_authorization_failed
        if name not in image.topics and getattr(request, "allow_auto_topic_creation", True) and name not in creatable:
            return E.topic_authorization_failed
        return None
    answer = await split(ctx, request, handler, "topics", "topics", refused)
    return then(answer, _metadata_operations(check, ctx, request))


def _get(entry: Any, field: str) -> Any:
    return entry[field] if isinstance(entry, dict) else getattr(entry, field)


def _metadata_operations(check: Check, ctx: RequestContext, request: Any) -> Callable[[Any], Any]:
    def fill(body: dict[str, Any]) -> None:
        if getattr(request, "include_cluster_authorized_operations", False) and "cluster_authorized_operations" in body:
            body["cluster_authorized_operations"] = check.operations(CLUSTER, [CLUSTER_NAME])[CLUSTER_NAME]
        if getattr(request, "include_topic_authorized_operations", False):
            _fill_operations(check, body, "topics", TOPIC, "name", "topic_authorized_operations")
    return _edit(ctx, fill)


def _fill_operations(check: Check, body: dict[str, Any], field: str, resource_type: str, name_field: str,
                     operations_field: str) -> None:
    entries = list(body[field])
    named = [_get(e, name_field) for e in entries if _get(e, "error_code") == E.none]
    bits = check.operations(resource_type, named)
    out = []
    for entry in entries:
        if _get(entry, "error_code") == E.none:
            value = bits[_get(entry, name_field)]
            entry = {**entry, operations_field: value} if isinstance(entry, dict) \
                else dataclasses.replace(entry, **{operations_field: value})
        out.append(entry)
    body[field] = out


def _operations_rule(field: str, resource_type: str, name_field: str, operations_field: str,
                     flag: str | None = "include_authorized_operations", inner: Rule | None = None) -> Rule:
    """After ``inner`` (or the handler), fill each entry's ``authorized_operations`` if the request asked
    (``flag``; None: always, as DescribeTopicPartitions has no flag)."""
    async def rule(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
        answer = await (inner(check, ctx, request, handler) if inner else handler(ctx, request))
        if flag is not None and not getattr(request, flag, False):
            return answer
        return then(answer, _edit(ctx, lambda body: _fill_operations(check, body, field, resource_type, name_field,
                                                                       operations_field)))
    return rule


async def _describe_cluster(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    answer = await handler(ctx, request)
    if not request.include_cluster_authorized_operations:
        return answer

    def fill(body: dict[str, Any]) -> None:
        body["cluster_authorized_operations"] = check.operations(CLUSTER, [CLUSTER_NAME])[CLUSTER_NAME]
    return then(answer, _edit(ctx, fill))


async def _create_topics(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    if check.may("CREATE", CLUSTER):
        return await handler(ctx, request)
    allowed = check.allowed("CREATE", TOPIC, (t.name for t in request.topics))
    return await split(ctx, request, handler, "topics", "topics",
                       lambda t: None if t.name in allowed else E.topic_authorization_failed)


async def _delete_topics(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    field = "topics" if ctx.api_version >= 6 else "topic_names"
    return await _topic_rule("DELETE", field, "responses")(check, ctx, request, handler)


def _config_resource_rule(operation: str, response_field: str) -> Rule:
    async def rule(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
        resources = request.resources or ()
        by_type: dict[str, list[str]] = {}
        for r in resources:
            kind = _CONFIG_RESOURCES.get(r.resource_type)
            if kind is not None:
                by_type.setdefault(kind, []).append(CLUSTER_NAME if kind == CLUSTER else r.resource_name)
        allowed = {kind: check.allowed(operation, kind, names) for kind, names in by_type.items()}
        codes = {TOPIC: E.topic_authorization_failed, CLUSTER: E.cluster_authorization_failed,
                 GROUP: E.group_authorization_failed}

        def refused(r: Any) -> ErrorCode | None:
            kind = _CONFIG_RESOURCES.get(r.resource_type)
            if kind is None:
                return None
            name = CLUSTER_NAME if kind == CLUSTER else r.resource_name
            return None if name in allowed[kind] else codes[kind]
        return await split(ctx, request, handler, "resources", response_field, refused)
    return rule


async def _find_coordinator(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    kind = _COORDINATOR_KEYS.get(request.key_type, GROUP)
    code = E.transactional_id_authorization_failed if kind == TXN else E.group_authorization_failed
    if ctx.api_version < 4:
        return await _one("DESCRIBE", kind, lambda r: r.key, code)(check, ctx, request, handler)
    allowed = check.allowed("DESCRIBE", kind, request.coordinator_keys)
    return await split(ctx, request, handler, "coordinator_keys", "coordinators",
                       lambda key: None if key in allowed else code)


async def _init_producer_id(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    if request.transactional_id:
        if not check.may("WRITE", TXN, request.transactional_id):
            return refuse(ctx, request, E.transactional_id_authorization_failed)
    elif not (check.may("IDEMPOTENT_WRITE", CLUSTER)
              or check.authorizer.authorize_by_resource_type(ctx, "WRITE", TOPIC)):
        return refuse(ctx, request, E.cluster_authorization_failed)
    return await handler(ctx, request)


async def _add_partitions_to_txn(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    if ctx.api_version >= 4:
        # The batched form is sent by brokers verifying transactions (Kafka: CLUSTER_ACTION).
        if not check.may("CLUSTER_ACTION", CLUSTER):
            return refuse(ctx, request, E.cluster_authorization_failed)
        return await handler(ctx, request)
    if not check.may("WRITE", TXN, request.v3_and_below_transactional_id):
        return refuse(ctx, request, E.transactional_id_authorization_failed)
    topics = request.v3_and_below_topics
    allowed = check.allowed("WRITE", TOPIC, (t.name for t in topics))
    if all(t.name in allowed for t in topics):
        return await handler(ctx, request)
    # Kafka fails the whole request: refused topics answer TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED.
    results = []
    for topic in topics:
        code = E.none if topic.name in allowed else E.topic_authorization_failed
        results.append({"name": topic.name, "results_by_partition": [
            {"partition_index": p, "partition_error_code": code if code != E.none else E.operation_not_attempted}
            for p in topic.partitions]})
    return {"throttle_time": 0, "error_code": E.none, "results_by_topic_v3_and_below": results,
            "results_by_transaction": ()}


async def _offset_fetch(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    if ctx.api_version < 8:
        if not check.may("DESCRIBE", GROUP, request.group_id):
            return refuse(ctx, request, E.group_authorization_failed)
        if request.topics is None:
            return then(await handler(ctx, request), _edit(ctx, _hide_topics(check, "topics")))
        return await _topic_rule("DESCRIBE")(check, ctx, request, handler)
    allowed_groups = check.allowed("DESCRIBE", GROUP, (g.group_id for g in request.groups))
    refused_groups = [g for g in request.groups if g.group_id not in allowed_groups]
    groups = []
    refused_topics: dict[str, set[str]] = {}
    for group in request.groups:
        if group.group_id not in allowed_groups:
            continue
        if group.topics is not None:
            names = [t.name for t in group.topics]
            allowed = check.allowed("DESCRIBE", TOPIC, names)
            refused_topics[group.group_id] = set(names) - allowed
            group = dataclasses.replace(group, topics=tuple(t for t in group.topics if t.name in allowed))
        groups.append(group)
    errors = error_response(ctx.api_key, ctx.api_version, dataclasses.replace(request, groups=tuple(refused_groups)),
                            E.group_authorization_failed, None) if refused_groups else None  # type: ignore[arg-type]
    answer = await handler(ctx, dataclasses.replace(request, groups=tuple(groups)))
    originals = {g.group_id: g for g in request.groups}

    def merge(body: dict[str, Any]) -> None:
        out = []
        for group in body["groups"]:
            group_id = _get(group, "group_id")
            refused = refused_topics.get(group_id)
            group = group if isinstance(group, dict) else {f.name: getattr(group, f.name)
                                                            for f in dataclasses.fields(group)}
            if refused:
                part = error_response(ctx.api_key, ctx.api_version, dataclasses.replace(request, groups=(
                    dataclasses.replace(originals[group_id], topics=tuple(
                        t for t in originals[group_id].topics if t.name in refused)),)),
                    E.topic_authorization_failed, None)  # type: ignore[arg-type]
                entry = part.groups[0]
                group["topics"] = [*group["topics"], *entry.topics]
            elif originals[group_id].topics is None:
                visible = check.allowed("DESCRIBE", TOPIC, (_get(t, "name") for t in group["topics"]))
                group["topics"] = [t for t in group["topics"] if _get(t, "name") in visible]
            out.append(group)
        body["groups"] = out + (list(errors.groups) if errors is not None else [])
    return then(answer, _edit(ctx, merge))


def _hide_topics(check: Check, field: str) -> Callable[[dict[str, Any]], None]:
    def hide(body: dict[str, Any]) -> None:
        visible = check.allowed("DESCRIBE", TOPIC, (_get(t, "name") for t in body[field]))
        body[field] = [t for t in body[field] if _get(t, "name") in visible]
    return hide


async def _list_groups(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    answer = await handler(ctx, request)
    if check.may("DESCRIBE", CLUSTER):
        return answer

    def hide(body: dict[str, Any]) -> None:
        visible = check.allowed("DESCRIBE", GROUP, (_get(g, "group_id") for g in body["groups"]))
        body["groups"] = [g for g in body["groups"] if _get(g, "group_id") in visible]
    return then(answer, _edit(ctx, hide))


async def _list_transactions(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    answer = await handler(ctx, request)

    def hide(body: dict[str, Any]) -> None:
        visible = check.allowed("DESCRIBE", TXN, (_get(t, "transactional_id") for t in body["transaction_states"]))
        body["transaction_states"] = [t for t in body["transaction_states"] if _get(t, "transactional_id") in visible]
    return then(answer, _edit(ctx, hide))


def _replica_rule(topics: Rule) -> Rule:
    """A broker's request (``replica_id`` >= 0) needs CLUSTER_ACTION; a client's, ``topics``."""
    async def rule(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
        if getattr(request, "replica_id", -1) >= 0:
            if not check.may("CLUSTER_ACTION", CLUSTER):
                return refuse(ctx, request, E.cluster_authorization_failed)
            return await handler(ctx, request)
        return await topics(check, ctx, request, handler)
    return rule


async def _create_delegation_token(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    """KIP-373: a token for another owner needs CREATE_TOKENS on that user (the requester's own needs nothing).
    A connection that may not ask for tokens at all is answered that first, by the handler, as in Kafka."""
    owner = requested_owner(ctx, request)
    if allow_token_requests(ctx.session) and owner != ctx.principal \
            and not check.may("CREATE_TOKENS", "USER", str(owner)):
        return create_answer(ctx, E.delegation_token_authorization_failed, owner)
    return await handler(ctx, request)


async def _describe_delegation_token(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    """Kafka's DelegationTokenManager.filterToken: a principal sees the tokens it owns or renews, those it may
    DESCRIBE (DELEGATION_TOKEN, by token id) and those of owners it may DESCRIBE_TOKENS (USER); the others are hidden."""
    answer = await handler(ctx, request)
    me = ctx.principal

    def owner(token: Any) -> str:
        return f"{_get(token, 'principal_type')}:{_get(token, 'principal_name')}"

    def own(token: Any) -> bool:
        renewers = {KafkaPrincipal(_get(r, "principal_type"), _get(r, "principal_name"))
                    for r in _get(token, "renewers")}
        return owner(token) == str(me) or me in renewers

    def hide(body: dict[str, Any]) -> None:
        others = [t for t in body["tokens"] if not own(t)]
        by_id = check.allowed("DESCRIBE", "DELEGATION_TOKEN", (_get(t, "token_id") for t in others))
        by_owner = check.allowed("DESCRIBE_TOKENS", "USER", (owner(t) for t in others if _get(t, "token_id")
                                                             not in by_id))
        body["tokens"] = [t for t in body["tokens"]
                          if own(t) or _get(t, "token_id") in by_id or owner(t) in by_owner]
    return then(answer, _edit(ctx, hide))


_GROUP_READ = _one("READ", GROUP, _group_id, E.group_authorization_failed)

RULES: dict[int, Rule] = {
    ApiKey.PRODUCE: _produce,
    ApiKey.FETCH: _fetch,
    ApiKey.LIST_OFFSETS: _replica_rule(_topic_rule("DESCRIBE")),
    ApiKey.METADATA: _metadata,
    ApiKey.OFFSET_COMMIT: _one("READ", GROUP, _group_id, E.group_authorization_failed, _topic_rule("READ")),
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.JOIN_GROUP: _GROUP_READ,
    ApiKey.HEARTBEAT: _GROUP_READ,
    ApiKey.LEAVE_GROUP: _GROUP_READ,
    ApiKey.SYNC_GROUP: _GROUP_READ,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _GROUP_READ,
    ApiKey.SHARE_GROUP_HEARTBEAT: _GROUP_READ,
    ApiKey.SHARE_GROUP_DESCRIBE: _operations_rule(
        "groups", GROUP, "group_id", "authorized_operations",
        inner=_resource_rule("DESCRIBE", GROUP, "group_ids", "groups", E.group_authorization_failed)),
    # Share consumers read their group's topics: READ on both (Kafka's KafkaApis.handleShareFetchRequest).
    ApiKey.SHARE_FETCH: _one("READ", GROUP, _group_id, E.group_authorization_failed,
                             _topic_rule("READ", "topics", "responses")),
    ApiKey.SHARE_ACKNOWLEDGE: _one("READ", GROUP, _group_id, E.group_authorization_failed,
                                   _topic_rule("READ", "topics", "responses")),
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: _resource_rule("DESCRIBE", GROUP, "groups", "groups",
                                                        E.group_authorization_failed),
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: _one("READ", GROUP, _group_id, E.group_authorization_failed,
                                           _topic_rule("READ", "topics", "responses")),
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: _one("DELETE", GROUP, _group_id, E.group_authorization_failed,
                                            _topic_rule("READ", "topics", "responses")),
    ApiKey.DESCRIBE_GROUPS: _operations_rule(
        "groups", GROUP, "group_id", "authorized_operations",
        inner=_resource_rule("DESCRIBE", GROUP, "groups", "groups", E.group_authorization_failed)),
    ApiKey.CONSUMER_GROUP_DESCRIBE: _operations_rule(
        "groups", GROUP, "group_id", "authorized_operations",
        inner=_resource_rule("DESCRIBE", GROUP, "group_ids", "groups", E.group_authorization_failed)),
    ApiKey.LIST_GROUPS: _list_groups,
    ApiKey.DELETE_GROUPS: _resource_rule("DELETE", GROUP, "groups_names", "results", E.group_authorization_failed),
    ApiKey.OFFSET_DELETE: _one("DELETE", GROUP, _group_id, E.group_authorization_failed, _topic_rule("READ")),
    ApiKey.CREATE_TOPICS: _create_topics,
    ApiKey.DELETE_TOPICS: _delete_topics,
    ApiKey.CREATE_PARTITIONS: _topic_rule("ALTER", "topics", "results"),
    ApiKey.DELETE_RECORDS: _topic_rule("DELETE"),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: _replica_rule(_topic_rule("DESCRIBE")),
    ApiKey.DESCRIBE_PRODUCERS: _topic_rule("READ"),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: _operations_rule(
        "topics", TOPIC, "name", "topic_authorized_operations", flag=None,
        inner=_topic_rule("DESCRIBE")),
    ApiKey.INIT_PRODUCER_ID: _init_producer_id,
    ApiKey.ADD_PARTITIONS_TO_TXN: _add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: _one("WRITE", TXN, _transactional_id, E.transactional_id_authorization_failed,
                                    _one("READ", GROUP, _group_id, E.group_authorization_failed)),
    ApiKey.END_TXN: _one("WRITE", TXN, _transactional_id, E.transactional_id_authorization_failed),
    ApiKey.TXN_OFFSET_COMMIT: _one("WRITE", TXN, _transactional_id, E.transactional_id_authorization_failed,
                                   _one("READ", GROUP, _group_id, E.group_authorization_failed, _topic_rule("READ"))),
    ApiKey.DESCRIBE_TRANSACTIONS: _resource_rule("DESCRIBE", TXN, "transactional_ids", "transaction_states",
                                                 E.transactional_id_authorization_failed),
    ApiKey.LIST_TRANSACTIONS: _list_transactions,
    ApiKey.DESCRIBE_CONFIGS: _config_resource_rule("DESCRIBE_CONFIGS", "results"),
    ApiKey.ALTER_CONFIGS: _config_resource_rule("ALTER_CONFIGS", "responses"),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _config_resource_rule("ALTER_CONFIGS", "responses"),
    ApiKey.DESCRIBE_CLUSTER: _describe_cluster,
    ApiKey.CREATE_DELEGATION_TOKEN: _create_delegation_token,
    ApiKey.DESCRIBE_DELEGATION_TOKEN: _describe_delegation_token,
}



async def _metadata_operations_only(check: Check, ctx: RequestContext, request: Any, handler: Handler) -> Answer:
    answer = await handler(ctx, request)
    if getattr(request, "include_cluster_authorized_operations", False) \
            or getattr(request, "include_topic_authorized_operations", False):
        return then(answer, _metadata_operations(check, ctx, request))
    return answer


#: What the permissive authorizer still needs: ``authorized_operations`` (all of them) where asked for.
OPERATIONS_RULES: dict[int, Rule] = {
    ApiKey.METADATA: _metadata_operations_only,
    ApiKey.DESCRIBE_GROUPS: _operations_rule("groups", GROUP, "group_id", "authorized_operations"),
    ApiKey.CONSUMER_GROUP_DESCRIBE: _operations_rule("groups", GROUP, "group_id", "authorized_operations"),
    ApiKey.SHARE_GROUP_DESCRIBE: _operations_rule("groups", GROUP, "group_id", "authorized_operations"),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: _operations_rule("topics", TOPIC, "name", "topic_authorized_operations",
                                                       flag=None),
    ApiKey.DESCRIBE_CLUSTER: _describe_cluster,
}
