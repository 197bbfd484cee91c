"""The pages' main sections drawn from data: what a person sees, found by what it is (``td.isr`` of row ``0``)."""

import re

from josef_console import cluster, pages
from josef_console.html import document
from josef_console.model import ConfigEntry, Group, GroupPartition, Member, Transaction, Unreadable
from josef_console.sampler import Throughput

from console_fakes import image

VIEW = pages.View("/console/", 1, 1_000_000)


def cell(html: str, table_id: str, row: str, column: str) -> str:
    """The text of one cell: table ``table_id``, the row whose key is ``row``, the column ``column``."""
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', html, re.S).group(1)
    tr = re.search(rf'<tr data-key="{re.escape(row)}"[^>]*>(.*?)</tr>', table, re.S).group(1)
    td = re.search(rf'<td class="{column}">(.*?)</td>', tr, re.S).group(1)
    return re.sub(r"<[^>]+>", "", td)


def test_a_topic_shows_each_partitions_leader_replicas_isr_and_elr():
    [orders] = cluster.topics(image(), 1, {("orders", 0): {1: 2048, 2: 2048, 3: 1024}}, ["orders"])
    html = pages.topic_detail(VIEW, orders, [ConfigEntry("min.insync.replicas", "2", "DYNAMIC_TOPIC_CONFIG"),
                                            ConfigEntry("retention.ms", "604800000", "DEFAULT_CONFIG")], False)
    assert cell(html, "partitions", "0", "isr") == "1,2,3"
    assert cell(html, "partitions", "0", "replicas") == "1,2,3"
    assert cell(html, "partitions", "0", "size") == "2.0 KiB"
    assert cell(html, "partitions", "0", "replica-sizes") == "1: 2.0 KiB 2: 2.0 KiB 3: 1.0 KiB"
    assert cell(html, "partitions", "1", "isr") == "2,1"
    assert cell(html, "partitions", "2", "leader") == "none"
    assert cell(html, "partitions", "2", "isr") == "-"
    assert cell(html, "partitions", "2", "elr") == "1,2"
    assert '<tr data-key="2" class="problem">' in html  # offline, and under min.insync.replicas=2
    assert cell(html, "configs", "min.insync.replicas", "source") == "dynamic topic config"
    assert html.index("min.insync.replicas") < html.index("retention.ms")  # overrides first
    assert "Remote</dt><dd>not tiered" in html


def test_a_tiered_topic_shows_its_remote_size_and_an_unreadable_configuration_says_why():
    [orders] = cluster.topics(image(), 1, names=["orders"])
    import attrs

    orders = attrs.evolve(orders, partitions=tuple(attrs.evolve(p, remote_size=1024 * p.partition)
                                                   for p in orders.partitions))
    html = pages.topic_detail(VIEW, orders, Unreadable("configuration", "no answer within 5 s"), True)
    assert cell(html, "partitions", "2", "remote") == "2.0 KiB"
    assert "Remote</dt><dd>3.0 KiB" in html
    assert "Could not read the configuration: no answer within 5 s" in html


def test_the_overview_says_what_needs_attention():
    img = image()
    topics = cluster.topics(img, 1)
    html = pages.overview(VIEW, cluster.health(img, topics, 1), cluster.brokers(img), None, cluster.features(img),
                          img.offset, 2)
    assert "needs attention: 1 fenced broker; 1 offline partition; 3 under-replicated partitions; " \
           "1 under-min-ISR partition" in html
    assert cell(html, "brokers", "3", "state") == "fenced"
    assert cell(html, "brokers", "1", "role") == "active controller"
    assert cell(html, "features", "metadata.version", "supported") == "1-26"
    assert cell(html, "features", "group.version", "supported") == "-"
    assert "1 in progress" in html  # the reassignment of moving-0


def test_names_chosen_by_clients_are_text_never_markup():
    hostile = '<img src=x onerror="alert(1)">/..?#'
    group = Group(hostile, "classic", "Stable", 2, "consumer",
                  (Member("m-1", "<b>client</b>", "/10.0.0.1", None, (("orders", 0),)),),
                  (GroupPartition("orders", 0, 10, 30, ("m-1",)),))
    listing = pages.groups_list(VIEW, [group])
    assert "<img" not in listing and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in listing
    assert 'href="/console/groups/%3Cimg%20src%3Dx%20onerror%3D%22alert%281%29%22%3E%2F..%3F%23"' in listing
    detail = pages.group_detail(VIEW, group)
    assert "<b>" not in detail and "&lt;b&gt;client&lt;/b&gt;" in detail


def test_a_group_shows_lag_per_partition_and_its_total():
    group = Group("readers", "consumer", "Stable", 2, "consumer",
                  (Member("m-1", "reader-1", "/10.0.0.1", None, (("orders", 0), ("orders", 1))),),
                  (GroupPartition("orders", 0, 100, 150, ("m-1",)), GroupPartition("orders", 1, None, 20, ("m-1",)),
                   GroupPartition("orders", 2, 7, None)))
    html = pages.group_detail(VIEW, group)
    assert cell(html, "offsets", "orders-0", "lag") == "50"
    assert cell(html, "offsets", "orders-0", "owner") == "reader-1"
    assert cell(html, "offsets", "orders-1", "lag") == "-"
    assert cell(html, "offsets", "orders-2", "end") == "-"
    assert cell(html, "members", "m-1", "assignment") == "orders-0, orders-1"
    assert "Total lag</dt><dd>50" in html
    assert cell(pages.groups_list(VIEW, [group]), "groups", "readers", "lag") == "50"


def test_a_share_partition_names_every_member_it_is_shared_by():
    group = Group("sharers", "share", "Stable", 2, "share",
                  (Member("aaaaaaaaaa", "rdkafka", "/h", None, (("orders", 0),)),
                   Member("bbbbbbbbbb", "rdkafka", "/h", None, (("orders", 0),))),
                  (GroupPartition("orders", 0, 5, 9, ("aaaaaaaaaa", "bbbbbbbbbb"), reported_lag=4),))
    html = pages.group_detail(VIEW, group)
    assert cell(html, "offsets", "orders-0", "owner") == "rdkafka (aaaaaaaa), rdkafka (bbbbbbbb)"
    assert cell(html, "offsets", "orders-0", "lag") == "4"
    assert "Start offset" in html


def test_transactions_show_how_long_an_open_one_has_been_open():
    found = [Transaction("tx-1", 2, "Ongoing", 7, 0, 60_000, 1_000_000 - 12_000, (("orders", 1),)),
             Transaction("tx-2", 3, "CompleteCommit", 8, 1, 60_000, 5)]
    html = pages.transactions(VIEW, found)
    assert cell(html, "transactions", "tx-1", "open") == "12 s"
    assert cell(html, "transactions", "tx-1", "partitions") == "orders-1"
    assert cell(html, "transactions", "tx-2", "open") == "-"
    assert "1 with a transaction open" in html


def test_reassignments_and_throughput():
    img = image()
    html = pages.reassignments(VIEW, cluster.reassignments(cluster.topics(img, 1)))
    assert cell(html, "reassignments", "moving-0", "adding") == "2"
    assert cell(html, "reassignments", "moving-0", "removing") == "3"
    sampled = Throughput()
    sampled.record(0.0, {"orders": 0})
    sampled.record(5.0, {"orders": 50})
    html = pages.throughput(VIEW, ["orders", "moving"], sampled, 300)
    assert cell(html, "throughput", "orders", "rate") == "10"
    assert cell(html, "throughput", "moving", "rate") == "-"
    assert html.count("<svg") == 2


def test_the_document_wraps_the_main_section_and_loads_only_from_the_node():
    page = document(title="Topics", root="/console/", active="topics", node_id=3, main="<p>x</p>", refresh_ms=5000,
                    notice="Created <topic>")
    assert '<main id="main">&lt;p&gt;x&lt;/p&gt;</main>' in page  # a str is text: only Html is markup
    assert 'data-refresh-ms="5000"' in page and 'name="viewport"' in page
    assert '<a href="/console/topics" aria-current="page">' in page
    assert "Created &lt;topic&gt;" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)


def test_a_voter_that_fell_behind_needs_attention():
    from josef.metadata.quorum_status import Quorum, QuorumNode

    img = image()
    topics = cluster.topics(img, 1)
    quorum = Quorum(1, 4, 100, (QuorumNode(1, "Leader", 100, 0, 0), QuorumNode(2, "Follower", 40, 60, 25_000),
                                QuorumNode(3, "Observer", 10, 90, None)))
    html = pages.overview(VIEW, cluster.health(img, topics, 1), cluster.brokers(img), quorum, (), img.offset, 0)
    assert "controller 2 has not caught up with the quorum leader for 25 s" in html
    assert "controller 3" not in html
