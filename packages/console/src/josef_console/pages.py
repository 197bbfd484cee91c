"""The pages' main sections, drawn from :mod:`josef_console.model` data: pure functions, data in, HTML out.

Each function returns what goes inside ``<main>``: the whole page wraps it
(:func:`josef_console.html.document`), a refresh replaces it. Tables carry
their column's key on every cell (``td.isr``, ``td.lag``) and their row's
key (``data-key="orders-0"``), so the pages can be styled and checked by
meaning.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from josef.metadata.quorum_status import Quorum, QuorumNode
from josef_console.charts import format_rate, sparkline
from josef_console.html import (
    Html,
    badge,
    duration_ms,
    facts,
    h,
    ids,
    join,
    link,
    path_part,
    section,
    size,
    table,
)
from josef_console.model import (
    Broker,
    ConfigEntry,
    Feature,
    Group,
    Health,
    Partition,
    Topic,
    Transaction,
    Unreadable,
)
from josef_console.sampler import Throughput


@attrs.frozen
class View:
    """What every page needs besides its data: where the console is mounted, and the time the page is for."""

    root: str = "/console/"
    node_id: int = 0
    now_ms: int = 0

    def topic_href(self, name: str) -> str:
        return f"{self.root}topics/{path_part(name)}"

    def group_href(self, group_id: str) -> str:
        return f"{self.root}groups/{path_part(group_id)}"


def unreadable(parts: Sequence[Unreadable]) -> Html:
    """What could not be read, said at the top of the page: a missing answer is not an empty one."""
    if not parts:
        return Html("")
    return Html('<ul class="unreadable">' + "".join(
        f"<li>Could not read the {h(p.what)}: {h(p.why)}</li>" for p in parts) + "</ul>")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# Overview ------------------------------------------------------------------------------------------


#: A voter not caught up with the leader for longer than this needs attention (``josef cluster status``'s default).
VOTER_LAG_MS = 10_000


def lagging(node: QuorumNode) -> bool:
    """A follower voter the leader has not seen caught up lately: each one uses up some of the quorum's tolerance
    for failures. Observers (brokers without the controller role) are judged as brokers, by being fenced."""
    return node.role == "Follower" and (node.lag_time_ms is None or node.lag_time_ms > VOTER_LAG_MS)


def overview(view: View, health: Health, brokers: Sequence[Broker], quorum: Quorum | Unreadable | None,
             features: Sequence[Feature], metadata_offset: int, groups: int | None,
             missing: Sequence[Unreadable] = ()) -> Html:
    problems = health.problems
    if isinstance(quorum, Quorum) and quorum.leader_id >= 0:
        problems += [f"controller {n.node_id} has not caught up with the quorum leader "
                     + ("since its election" if n.lag_time_ms is None else f"for {duration_ms(n.lag_time_ms)}")
                     for n in quorum.nodes if lagging(n)]
    status = badge("healthy", "ok") if not problems else badge("needs attention: " + "; ".join(problems), "bad")
    controller = "none" if health.controller is None or health.controller < 0 else health.controller
    if isinstance(quorum, Quorum) and quorum.leader_id >= 0:
        controller = f"{quorum.leader_id} (epoch {quorum.epoch}, high watermark {quorum.high_watermark})"
    summary = facts([
        ("Status", status),
        ("Controller", controller),
        ("Brokers", f"{health.brokers}" + (f" ({health.fenced} fenced)" if health.fenced else "")
         + (f" ({health.shutting_down} shutting down)" if health.shutting_down else "")),
        ("Topics", f"{health.topics} ({_count(health.partitions, 'partition')})"),
        ("Offline partitions", health.offline),
        ("Under-replicated", health.under_replicated),
        ("Under min ISR", health.under_min_isr),
        ("Reassignments", link(view.root + "reassignments", f"{health.reassigning} in progress")),
        ("Groups", "-" if groups is None else link(view.root + "groups", groups)),
        ("Metadata offset", metadata_offset),
    ])
    leader = quorum.leader_id if isinstance(quorum, Quorum) else health.controller
    state_kind = {"running": "ok", "shutting down": "warn", "fenced": "bad"}
    broker_rows = [(b.node_id, badge(b.state, state_kind[b.state]), join(b.endpoints, " "), b.rack,
                    b.epoch, "active controller" if b.node_id == leader else "") for b in brokers]
    broker_table = table((("node", "Node"), ("state", "State"), ("endpoints", "Endpoints"), ("rack", "Rack"),
                          ("epoch", "Epoch"), ("role", "Role")), broker_rows,
                         table_id="brokers", row_ids=[str(b.node_id) for b in brokers], empty="no broker registered")
    if isinstance(quorum, Quorum):
        quorum_part = table((("node", "Node"), ("role", "Role"), ("offset", "Log end offset"), ("lag", "Lag"),
                             ("lag-time", "Caught up")),
                            [(n.node_id, n.role, n.log_end_offset, n.lag,
                              "-" if n.lag_time_ms is None else ("now" if n.lag_time_ms == 0
                                                                 else f"{duration_ms(n.lag_time_ms)} ago"))
                             for n in quorum.nodes], table_id="quorum", row_ids=[str(n.node_id) for n in quorum.nodes])
        quorum_part = Html(f'<p class="muted">Leader {quorum.leader_id}, epoch {quorum.epoch}, '
                           f"high watermark {quorum.high_watermark}</p>{quorum_part}")
    elif isinstance(quorum, Unreadable):
        quorum_part = Html(f'<p class="unreadable">Could not read the quorum: {h(quorum.why)}</p>')
    else:
        quorum_part = Html('<p class="muted">This cluster keeps its metadata outside a KRaft quorum.</p>')
    feature_table = table((("name", "Feature"), ("level", "Finalized level"), ("supported", "Supported by all brokers")),
                          [(f.name, f.level, "-" if f.supported is None else f"{f.supported[0]}-{f.supported[1]}")
                           for f in features], table_id="features", row_ids=[f.name for f in features])
    return Html(f"<h1>Cluster</h1>{unreadable(missing)}{summary}"
                + section("Brokers", broker_table, section_id="brokers-section")
                + section("Controller quorum", quorum_part, section_id="quorum-section")
                + section("Features", feature_table, section_id="features-section"))


# Topics --------------------------------------------------------------------------------------------


def topics_list(view: View, topics: Sequence[Topic], throughput: Throughput, missing: Sequence[Unreadable] = ()
                ) -> Html:
    shown = sorted(topics, key=lambda t: (t.internal, t.name))
    rows, classes = [], []
    for t in shown:
        rate = throughput.rate(t.name)
        rows.append((link(view.topic_href(t.name), t.name), len(t.partitions), t.replication_factor,
                     t.under_replicated, t.offline, size(t.size), size(t.size_on_disk),
                     "-" if rate is None else format_rate(rate),
                     sparkline(throughput.rates(t.name), f"{t.name} records/s", width=96, height=20,
                               slots=throughput.capacity - 1)))
        classes.append("problem" if t.offline or t.under_min_isr else ("internal" if t.internal else ""))
    listing = table((("topic", "Topic"), ("partitions", "Partitions"), ("rf", "RF"), ("urp", "Under-replicated"),
                     ("offline", "Offline"), ("size", "Size"), ("disk", "On disk"), ("rate", "Records/s"),
                     ("chart", "Last minutes")),
                    rows, table_id="topics", row_ids=[t.name for t in shown], row_classes=classes, empty="no topics")
    total = sum(len(t.partitions) for t in topics)
    return Html(f"<h1>Topics</h1>{unreadable(missing)}"
                f'<p class="muted">{_count(len(topics), "topic")}, {_count(total, "partition")}; '
                "size is one copy of each partition (its leader's log), on disk every replica's.</p>"
                f"{listing}")


def _replica_sizes(p: Partition) -> str:
    return " ".join(f"{broker}: {size(bytes_)}" for broker, bytes_ in sorted(p.sizes.items())) or "-"


def topic_detail(view: View, topic: Topic, configs: Sequence[ConfigEntry] | Unreadable, tiered: bool,
                 missing: Sequence[Unreadable] = ()) -> Html:
    summary = facts([
        ("Topic id", topic.topic_id),
        ("Partitions", len(topic.partitions)),
        ("Replication factor", topic.replication_factor),
        ("Size (leaders)", size(topic.size)),
        ("On disk (all replicas)", size(topic.size_on_disk)),
        ("Remote", size(topic.remote_size) if tiered else "not tiered"),
        ("Under-replicated", topic.under_replicated),
        ("Offline", topic.offline),
    ])
    columns = [("partition", "Partition"), ("leader", "Leader"), ("epoch", "Epoch"), ("replicas", "Replicas"),
               ("isr", "ISR"), ("elr", "ELR"), ("last-elr", "Last known ELR"), ("adding", "Adding"),
               ("removing", "Removing"), ("start", "Start offset"), ("end", "End offset"), ("size", "Size"),
               ("replica-sizes", "Replica sizes")]
    if tiered:
        columns.append(("remote", "Remote"))
    rows, classes = [], []
    for p in topic.partitions:
        row = [p.partition, "none" if p.offline else p.leader, p.leader_epoch, ids(p.replicas), ids(p.isr), ids(p.elr),
               ids(p.last_known_elr), ids(p.adding), ids(p.removing), p.start_offset, p.end_offset, size(p.size),
               _replica_sizes(p)]
        if tiered:
            row.append(size(p.remote_size))
        rows.append(row)
        classes.append("problem" if p.offline or p.under_min_isr else ("warn" if p.under_replicated else ""))
    partitions = table(columns, rows, table_id="partitions", row_ids=[str(p.partition) for p in topic.partitions],
                       row_classes=classes)
    if isinstance(configs, Unreadable):
        config_part = Html(f'<p class="unreadable">Could not read the configuration: {h(configs.why)}</p>')
    else:
        ordered = sorted(configs, key=lambda c: (c.is_default, c.name))
        config_part = table((("name", "Name"), ("value", "Value"), ("source", "Source")),
                            [(c.name, "(sensitive)" if c.sensitive else c.value, c.source.lower().replace("_", " "))
                             for c in ordered], table_id="configs", row_ids=[c.name for c in ordered],
                            row_classes=["default muted" if c.is_default else "" for c in ordered])
    return Html(f"<h1>Topic {h(topic.name)}</h1>{unreadable(missing)}{summary}"
                + section("Partitions", partitions, section_id="partitions-section")
                + section("Configuration", config_part, section_id="configs-section"))


# Groups --------------------------------------------------------------------------------------------


def _state_kind(state: str) -> str:
    return {"Stable": "ok", "Empty": "ok", "Dead": "bad"}.get(state, "warn")


def groups_list(view: View, groups: Sequence[Group], missing: Sequence[Unreadable] = ()) -> Html:
    rows = [(link(view.group_href(g.group_id), g.group_id), g.type, badge(g.state, _state_kind(g.state)),
             g.coordinator, "-" if g.members is None else len(g.members), len(g.partitions),
             "-" if g.lag is None else g.lag, g.error or "") for g in groups]
    listing = table((("group", "Group"), ("type", "Type"), ("state", "State"), ("coordinator", "Coordinator"),
                     ("members", "Members"), ("partitions", "Partitions"), ("lag", "Lag"), ("error", "")),
                    rows, table_id="groups", row_ids=[g.group_id for g in groups], empty="no groups")
    counts = ", ".join(f"{sum(g.type == t for g in groups)} {t}" for t in ("consumer", "classic", "share"))
    return Html(f"<h1>Groups</h1>{unreadable(missing)}"
                f'<p class="muted">{_count(len(groups), "group")} ({counts}); lag is the end offset (high watermark) '
                "minus the committed offset, summed over the group's partitions.</p>"
                f"{listing}")


def group_detail(view: View, group: Group, missing: Sequence[Unreadable] = ()) -> Html:
    summary = facts([
        ("Type", group.type),
        ("State", badge(group.state, _state_kind(group.state))),
        ("Coordinator", group.coordinator),
        ("Protocol type", group.protocol_type or "-"),
        ("Members", "-" if group.members is None else len(group.members)),
        ("Total lag", "-" if group.lag is None else group.lag),
    ])
    error = Html(f'<p class="unreadable">{h(group.error)}</p>') if group.error else ""
    members = group.members or ()
    member_table = table((("member", "Member"), ("client", "Client id"), ("host", "Host"), ("instance", "Instance id"),
                          ("assignment", "Assigned partitions")),
                         [(m.member_id, m.client_id, m.host, m.instance_id,
                           ", ".join(f"{t}-{p}" for t, p in m.assignment) or "-") for m in members],
                         table_id="members", row_ids=[m.member_id for m in members], empty="no members")
    clients = {m.member_id: m.client_id for m in members}
    ambiguous = len(set(clients.values())) < len(clients)  # members sharing a client id are told apart by member id

    def consumer(member_id: str) -> str:
        client = clients.get(member_id, member_id)
        return f"{client} ({member_id[:8]})" if ambiguous else client

    offset_label = "Start offset" if group.type == "share" else "Committed"
    partition_table = table((("topic", "Topic"), ("partition", "Partition"), ("owner", "Consumer"),
                             ("committed", offset_label), ("end", "End offset"), ("lag", "Lag")),
                            [(link(view.topic_href(p.topic), p.topic), p.partition,
                              ", ".join(consumer(m) for m in p.owners) or "-", p.committed, p.end,
                              "-" if p.lag is None else p.lag) for p in group.partitions],
                            table_id="offsets", row_ids=[f"{p.topic}-{p.partition}" for p in group.partitions],
                            empty="no committed offsets")
    return Html(f"<h1>Group {h(group.group_id)}</h1>{unreadable(missing)}{error}{summary}"
                + section("Members", member_table, section_id="members-section")
                + section("Lag per partition", partition_table, section_id="offsets-section"))


# Transactions, reassignments, throughput -------------------------------------------------------------


def transactions(view: View, found: Sequence[Transaction], missing: Sequence[Unreadable] = ()) -> Html:
    ongoing = [t for t in found if t.state not in ("Empty", "CompleteCommit", "CompleteAbort", "Dead")]
    rows = [(t.transactional_id, badge(t.state, "warn" if t in ongoing else "ok"), t.coordinator, t.producer_id,
             t.producer_epoch, duration_ms(t.timeout_ms),
             duration_ms(view.now_ms - t.start_ms) if t.start_ms is not None and t.start_ms > 0 and t in ongoing
             else "-",
             ", ".join(f"{topic}-{p}" for topic, p in t.partitions) or "-") for t in found]
    listing = table((("id", "Transactional id"), ("state", "State"), ("coordinator", "Coordinator"),
                     ("producer", "Producer id"), ("epoch", "Epoch"), ("timeout", "Timeout"), ("open", "Open for"),
                     ("partitions", "Partitions")), rows, table_id="transactions",
                    row_ids=[t.transactional_id for t in found], empty="no transactional ids")
    return Html(f"<h1>Transactions</h1>{unreadable(missing)}"
                f'<p class="muted">{_count(len(found), "transactional id")}, {len(ongoing)} with a transaction open.</p>'
                f"{listing}")


def reassignments(view: View, moving: Sequence[Partition]) -> Html:
    rows = [(link(view.topic_href(p.topic), p.topic), p.partition, ids(p.replicas), ids(p.adding), ids(p.removing),
             ids(p.isr), "none" if p.offline else p.leader) for p in moving]
    listing = table((("topic", "Topic"), ("partition", "Partition"), ("replicas", "Replicas"), ("adding", "Adding"),
                     ("removing", "Removing"), ("isr", "ISR"), ("leader", "Leader")), rows, table_id="reassignments",
                    row_ids=[f"{p.topic}-{p.partition}" for p in moving], empty="no reassignment in progress")
    return Html("<h1>Reassignments in progress</h1>"
                '<p class="muted">Partitions whose replicas a reassignment (kafka-reassign-partitions.sh, '
                "AlterPartitionReassignments) is moving: the adding replicas join the ISR, then the removing ones "
                f"leave.</p>{listing}")


def throughput(view: View, topic_names: Sequence[str], sampled: Throughput, window_s: float,
               sampling: bool = True) -> Html:
    names = sorted(topic_names, key=lambda n: (n.startswith("__"), n))
    rows = []
    for name in names:
        rates = sampled.rates(name)
        rows.append((link(view.topic_href(name), name), "-" if not rates else format_rate(rates[-1]),
                     "-" if not rates else format_rate(max(rates)), sampled.total(name),
                     sparkline(rates, f"{name} records/s", width=240, height=40, slots=sampled.capacity - 1)))
    listing = table((("topic", "Topic"), ("rate", "Records/s now"), ("peak", "Peak"), ("offset", "End offsets"),
                     ("chart", f"Last {window_s / 60:.0f} minutes")), rows, table_id="throughput",
                    row_ids=list(names), empty="no topics")
    note = "" if sampling else ('<p class="unreadable">This node is a controller only and samples nothing: open the '
                                "console of a broker for throughput.</p>")
    return Html("<h1>Throughput</h1>"
                '<p class="muted">Records produced per second: the change of the sum of each topic\'s end offsets, '
                f"sampled by this node.</p>{note}{listing}")
