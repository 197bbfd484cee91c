"""The metadata quorum contract suite: what every :class:`josef.metadata.quorum.MetadataQuorum` plugin must do, as pytest tests.

A plugin runs it against itself with a test module that subclasses
:class:`MetadataQuorumContract` and gives it a :class:`QuorumHarness`, the few
things only the plugin knows (how to prepare its storage, how to build a
single-node quorum on it, what to release after closing it)::

    from josef.testing.metadata_quorum import MetadataQuorumContract

    class TestMyQuorumContract(MetadataQuorumContract):
        @pytest.fixture
        def quorum_harness(self):
            return MyHarness()

The suite drives the quorum as :class:`josef.node.broker.Broker` does: it
builds it, declares its :meth:`~josef.metadata.quorum.MetadataQuorum.apis`,
starts it in a task group with a listener, appends records as the active
controller does (one append at a time), cancels the task group, then closes
it; a restart builds a new quorum on the same storage. It checks what the
broker and the controller rely on:

- the listener is called on the event loop, each commit once and in order,
  with offsets that increase by at least the number of records committed,
  and a snapshot only to replace the whole state;
- ``append`` returns the offset of its last record once that commit has
  been delivered, and is refused with
  :class:`~josef.metadata.quorum.NotControllerError` by a quorum that is not
  the active controller (not started, or closed);
- a single-node quorum is its own active controller once ``start`` returns,
  reached in-process (no controller listener);
- a restart delivers, before ``start`` returns, the state of everything
  committed, whatever mix of snapshot and log it keeps, under the same
  cluster id, and appends go on above it.

The tests use only the contract in :mod:`josef.metadata.quorum`; replication
between nodes, elections and snapshot formats belong in the plugin's own
tests. The class is not named ``Test*``: pytest collects it only through a
plugin's subclass. Every test runs under a watchdog
(:attr:`MetadataQuorumContract.TIMEOUT_S`) rather than sleeping: a quorum that
hangs fails the test that waited for it.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Protocol

import anyio
import anyio.lowlevel
import attrs
import pytest
from kio.schema.index import api_key_map, schema_name_map

from josef.metadata.image import MetadataImage
from josef.metadata.quorum import MetadataQuorum, NotControllerError
from josef.metadata.records import (
    ConfigRecord,
    Endpoint,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
)

__all__ = ["Delivery", "MetadataQuorumContract", "QuorumHarness", "RecordingListener", "controller_batches", "running",
           "topic_records"]

#: ``ConfigRecord.resource_type`` of a topic (Kafka's ConfigResource.Type.TOPIC).
TOPIC_RESOURCE = 2


# The harness a plugin provides ----------------------------------------------------------------


class QuorumHarness(Protocol):
    """What the suite needs from a metadata quorum plugin that it cannot do through the contract."""

    #: The node id of the single node the harness builds (``node.id``): its ``controller_id`` once started.
    node_id: int

    def format(self, directory: Path) -> str:
        """Prepare empty storage in ``directory`` for a new single-node cluster; returns its cluster id."""

    def build(self, directory: Path) -> MetadataQuorum:
        """A new single-node quorum (voter and only controller, reached in-process) on the storage in ``directory``.

        Not started; called again on the same directory after :meth:`MetadataQuorum.close`,
        as a restarted node does.
        """

    def release(self, quorum: MetadataQuorum) -> None:
        """After ``quorum.close()``: release what :meth:`build` opened beside the quorum (its log storage...)."""

    async def settle(self, quorum: MetadataQuorum) -> None:
        """Wait until background work ``quorum`` has started is done (a snapshot being written...); may do nothing.

        Called before a test restarts the quorum after many commits, so the
        restart finds what a long-running node would have left (snapshots).
        """


# The listener ---------------------------------------------------------------------------------


@attrs.frozen
class Delivery:
    """One call of the listener: ``kind`` is ``"commit"`` or ``"snapshot"``."""

    kind: str
    offset: int
    records: tuple[MetadataRecord, ...]


class RecordingListener:
    """A :class:`josef.metadata.quorum.MetadataListener` that keeps every delivery and builds the image as the broker does.

    It checks the delivery rules as they happen and notes each violation in
    :attr:`problems` (the quorum would swallow an exception raised here):
    called on the event loop's thread, offsets strictly increasing, a commit
    at least as many offsets above the previous delivery as it has records.
    """

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.image = MetadataImage()
        self.problems: list[str] = []
        #: ``(broker id, epoch)`` of each :meth:`on_broker_session_end`, in order.
        self.sessions_ended: list[tuple[int, int]] = []
        #: The event loop's thread: set when the quorum is started.
        self.loop_thread: int | None = None

    @property
    def offset(self) -> int:
        """The offset of the last delivery, -1 before any."""
        return self.deliveries[-1].offset if self.deliveries else -1

    def commits(self) -> list[Delivery]:
        return [d for d in self.deliveries if d.kind == "commit"]

    def on_commit(self, offset: int, records: Sequence[MetadataRecord]) -> None:
        self._check("on_commit", offset, records)
        if offset - self.offset < len(records):
            self.problems.append(f"on_commit at {offset} of {len(records)} records overlaps the previous delivery "
                                 f"at {self.offset}: each record has an offset of its own")
        self.deliveries.append(Delivery("commit", offset, tuple(records)))
        self.image, _ = self.image.apply(offset, records)

    def on_snapshot(self, offset: int, records: Sequence[MetadataRecord]) -> None:
        self._check("on_snapshot", offset, records)
        self.deliveries.append(Delivery("snapshot", offset, tuple(records)))
        self.image, _ = MetadataImage().apply(offset, records)

    def current_image(self) -> MetadataImage:
        return self.image

    def endpoints(self) -> Sequence[Endpoint]:
        return ()  # a single node, reached in-process: no listener to publish

    def on_broker_session_end(self, broker_id: int, epoch: int) -> None:
        self.sessions_ended.append((broker_id, epoch))

    def _check(self, name: str, offset: int, records: Sequence[MetadataRecord]) -> None:
        if threading.get_ident() != self.loop_thread:
            self.problems.append(f"{name} at {offset} was called off the event loop's thread")
        if not isinstance(offset, int):
            self.problems.append(f"{name} got offset {offset!r}, not an int")
        elif offset <= self.offset:
            self.problems.append(f"{name} at {offset} after a delivery at {self.offset}: offsets must increase")
        if not all(isinstance(r, MetadataRecord) for r in records):  # type: ignore[arg-type]
            self.problems.append(f"{name} at {offset} got something other than metadata records")


def _state(image: MetadataImage) -> tuple[int, list[MetadataRecord]]:
    """What an image holds, comparable across restarts: its offset and the records that rebuild it."""
    return image.offset, list(image.records())


# Running a quorum as the broker does ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def running(harness: QuorumHarness, directory: Path,
                  listener: RecordingListener | None = None) -> AsyncIterator[tuple[MetadataQuorum, RecordingListener]]:
    """Build a quorum on ``directory``, declare its APIs, start it in a task group; then cancel, close, release.

    The order is the broker's (:meth:`josef.node.broker.Broker.run`):
    ``apis()`` before ``start``, the task group cancelled before ``close``.
    """
    quorum = harness.build(directory)
    listener = listener if listener is not None else RecordingListener()
    try:
        quorum.apis()
        async with anyio.create_task_group() as tg:
            listener.loop_thread = threading.get_ident()
            await quorum.start(listener, tg)
            yield quorum, listener
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await quorum.close()
        harness.release(quorum)


def topic_records(name: str, partitions: int = 1, node_id: int = 1) -> list[MetadataRecord]:
    """What the controller commits for a new topic: its TopicRecord and one PartitionRecord per partition."""
    topic_id = uuid.uuid4()
    return [TopicRecord(name=name, topic_id=topic_id),
            *(PartitionRecord(partition_id=p, topic_id=topic_id, replicas=(node_id,), isr=(node_id,), leader=node_id)
              for p in range(partitions))]


def controller_batches(count: int, node_id: int, prefix: str = "t") -> list[list[MetadataRecord]]:
    """``count`` appends of one to a few records each, as controller operations are: topics, configs, features."""
    batches: list[list[MetadataRecord]] = []
    for i in range(count):
        if i % 3 == 0:
            batches.append(topic_records(f"{prefix}{i}", partitions=1 + i % 4, node_id=node_id))
        elif i % 3 == 1:
            batches.append([ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name=f"{prefix}{i - 1}",
                                         name="retention.ms", value=str(1000 * i))])
        else:
            batches.append([FeatureLevelRecord(name=f"{prefix}.feature", feature_level=i)])
    return batches


# The suite -----------------------------------------------------------------------------------------------


class MetadataQuorumContract:
    """The contract of :class:`josef.metadata.quorum.MetadataQuorum`; subclass it and provide ``quorum_harness``."""

    #: How long one test may take before the watchdog fails it: a quorum that hangs instead of answering.
    TIMEOUT_S = 60.0

    @pytest.fixture
    def quorum_harness(self) -> QuorumHarness:
        raise NotImplementedError("a subclass of MetadataQuorumContract provides the quorum_harness fixture")

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    def quorum_storage(self, quorum_harness: QuorumHarness, tmp_path: Path) -> tuple[Path, str]:
        """A directory formatted for a new cluster, and its cluster id."""
        directory = tmp_path / "metadata"
        directory.mkdir()
        cluster_id = quorum_harness.format(directory)
        assert isinstance(cluster_id, str) and cluster_id, f"format() returned {cluster_id!r}, not a cluster id"
        return directory, cluster_id

    # Declarations ---------------------------------------------------------------------------------------

    def test_apis_are_declared_before_start_with_kafka_keys_and_versions(self, quorum_harness, quorum_storage):
        quorum = quorum_harness.build(quorum_storage[0])
        try:
            apis = list(quorum.apis())
            for entry in apis:
                assert len(entry) == 4, f"{entry!r} is not (api key, handler, lowest, highest version)"
                key, handler, low, high = entry
                assert key in api_key_map, f"API key {key} is not a Kafka API"
                known = schema_name_map[api_key_map[key]]
                assert min(known) <= low <= high <= max(known), (
                    f"{api_key_map[key]} v{low}-v{high} is outside the versions Kafka defines, "
                    f"v{min(known)}-v{max(known)}")
                assert callable(handler), f"the handler of {api_key_map[key]} is not callable"
            keys = [entry[0] for entry in apis]
            assert len(keys) == len(set(keys)), f"API keys declared twice: {sorted(keys)}"
        finally:
            anyio.run(quorum.close)
            quorum_harness.release(quorum)

    @pytest.mark.anyio
    async def test_a_quorum_never_started_has_no_controller_refuses_appends_and_closes(self, quorum_harness,
                                                                                         quorum_storage):
        with anyio.fail_after(self.TIMEOUT_S):
            quorum = quorum_harness.build(quorum_storage[0])
            try:
                assert quorum.controller_id == -1, "a quorum that has not started knows no active controller"
                with pytest.raises(NotControllerError):
                    await quorum.append(topic_records("early"))
            finally:
                await quorum.close()
                quorum_harness.release(quorum)

    # Starting ---------------------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_a_single_node_quorum_is_its_own_controller_in_process_once_started(self, quorum_harness,
                                                                                       quorum_storage):
        directory, cluster_id = quorum_storage
        with anyio.fail_after(self.TIMEOUT_S):
            async with running(quorum_harness, directory) as (quorum, listener):
                assert quorum.controller_id == quorum_harness.node_id
                assert quorum.cluster_id == cluster_id
                assert dict(quorum.controllers()) == {}, "a single node's controller is reached in-process"
                assert quorum.controller_endpoint(quorum_harness.node_id) is None
                assert listener.problems == []

    # Appending --------------------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_append_returns_the_offset_of_its_last_record_once_delivered(self, quorum_harness,
                                                                               quorum_storage):
        node = quorum_harness.node_id
        with anyio.fail_after(self.TIMEOUT_S):
            async with running(quorum_harness, quorum_storage[0]) as (quorum, listener):
                previous = listener.offset
                for batch in controller_batches(12, node):
                    offset = await quorum.append(batch)
                    assert isinstance(offset, int)
                    assert listener.deliveries[-1] == Delivery("commit", offset, tuple(batch)), (
                        "append returned before its commit was delivered, or delivered it otherwise")
                    assert offset - previous >= len(batch), (
                        f"{len(batch)} records appended at offset {offset}, after {previous}")
                    previous = offset
                assert listener.problems == []

    @pytest.mark.anyio
    async def test_every_commit_is_delivered_once_in_order_on_the_event_loop(self, quorum_harness,
                                                                             quorum_storage):
        batches = controller_batches(40, quorum_harness.node_id)
        with anyio.fail_after(self.TIMEOUT_S):
            async with running(quorum_harness, quorum_storage[0]) as (quorum, listener):
                before = len(listener.deliveries)
                offsets = [await quorum.append(batch) for batch in batches]
                delivered = listener.deliveries[before:]
                assert [d.kind for d in delivered] == ["commit"] * len(batches)
                assert [list(d.records) for d in delivered] == batches
                assert [d.offset for d in delivered] == offsets
                assert listener.problems == []
                expected = MetadataImage()
                for offset, batch in zip(offsets, batches):
                    expected, _ = expected.apply(offset, batch)
                assert {n: t.partitions.keys() for n, t in listener.image.topics.items()} == {
                    n: t.partitions.keys() for n, t in expected.topics.items()}

    @pytest.mark.anyio
    async def test_a_large_append_is_delivered_whole_as_one_commit(self, quorum_harness, quorum_storage):
        records = [TopicRecord(name=f"bulk-{i}", topic_id=uuid.uuid4()) for i in range(3000)]
        with anyio.fail_after(self.TIMEOUT_S):
            async with running(quorum_harness, quorum_storage[0]) as (quorum, listener):
                small = await quorum.append(topic_records("before"))
                offset = await quorum.append(records)
                after = await quorum.append(topic_records("after"))
                assert [d.offset for d in listener.deliveries[-3:]] == [small, offset, after]
                assert list(listener.deliveries[-2].records) == records
                assert offset - small >= len(records)
                assert listener.problems == []
                assert len(listener.image.topics) >= len(records) + 2

    @pytest.mark.anyio
    async def test_a_closed_quorum_refuses_appends(self, quorum_harness, quorum_storage):
        with anyio.fail_after(self.TIMEOUT_S):
            async with running(quorum_harness, quorum_storage[0]) as (quorum, _):
                await quorum.append(topic_records("kept"))
            with pytest.raises(NotControllerError):
                await quorum.append(topic_records("too-late"))

    # Restarting -------------------------------------------------------------------------------------------

    @pytest.mark.anyio
    async def test_a_restart_delivers_everything_committed_before_start_returns(self, quorum_harness,
                                                                                quorum_storage):
        directory, cluster_id = quorum_storage
        batches = controller_batches(15, quorum_harness.node_id)
        first_topic = batches[0][0]
        assert isinstance(first_topic, TopicRecord)
        batches.append([RemoveTopicRecord(topic_id=first_topic.topic_id)])
        with anyio.fail_after(self.TIMEOUT_S):
            async with running(quorum_harness, directory) as (quorum, first):
                offsets = [await quorum.append(batch) for batch in batches]
                assert first_topic.name not in first.image.topics and "t3" in first.image.topics
            async with running(quorum_harness, directory) as (quorum, replayed):
                assert quorum.cluster_id == cluster_id
                assert replayed.offset == offsets[-1], (
                    f"start returned with deliveries up to {replayed.offset}, not to the last commit {offsets[-1]}")
                assert _state(replayed.image) == _state(first.image)
                assert replayed.problems == [] and first.problems == []

    @pytest.mark.anyio
    async def test_appends_after_a_restart_go_on_above_and_are_replayed_with_the_rest(self, quorum_harness,
                                                                                      quorum_storage):
        directory = quorum_storage[0]
        node = quorum_harness.node_id
        with anyio.fail_after(self.TIMEOUT_S):
            async with running(quorum_harness, directory) as (quorum, _):
                first = [await quorum.append(batch) for batch in controller_batches(6, node, "a")]
            async with running(quorum_harness, directory) as (quorum, second):
                assert quorum.controller_id == node, "a restarted single node is its own controller again"
                more = [await quorum.append(batch) for batch in controller_batches(6, node, "b")]
                assert more[0] > first[-1], f"an append after the restart got offset {more[0]}, not above {first[-1]}"
            async with running(quorum_harness, directory) as (_, third):
                assert third.offset == more[-1]
                assert _state(third.image) == _state(second.image)
                assert {"a0", "a3", "b0", "b3"} <= third.image.topics.keys()
                assert third.problems == []

    @pytest.mark.anyio
    async def test_many_commits_and_restarts_rebuild_the_same_state(self, quorum_harness, quorum_storage):
        """Enough commits that a quorum which snapshots has snapshots to load: the state is the same either way."""
        directory = quorum_storage[0]
        node = quorum_harness.node_id
        with anyio.fail_after(self.TIMEOUT_S):
            expected = None
            for round_ in range(3):
                async with running(quorum_harness, directory) as (quorum, listener):
                    if expected is not None:
                        assert _state(listener.image) == expected, f"restart {round_} rebuilt another state"
                    for batch in controller_batches(60, node, f"r{round_}-"):
                        await quorum.append(batch)
                        await anyio.lowlevel.checkpoint()  # a controller does other work between its appends
                    await quorum_harness.settle(quorum)
                    assert listener.problems == []
                    expected = _state(listener.image)
            async with running(quorum_harness, directory) as (_, last):
                assert _state(last.image) == expected
                assert len(last.image.topics) == 3 * 20
                kinds = [d.kind for d in last.deliveries]
                assert "snapshot" not in kinds[1:], "a snapshot at start-up comes first, before the log after it"
                assert last.problems == []
