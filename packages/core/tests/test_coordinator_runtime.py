"""The coordinator runtime with toy coordinators: a shard of plugin API 1.0-1.1 (writes commit, then apply) and a
timeline shard (writes apply at once, batched, rolled back if their append fails); loads, timers, unloads."""

import anyio
import pytest
from kio.schema.errors import ErrorCode

from josef import hookimpl
from josef.coordinator.hashing import java_string_hashcode, partition_for
from josef.coordinator.runtime import CoordinatorError
from josef.coordinator.timeline import TimelineDict
from josef.plugins import get_plugin_manager
from josef.node.runner import BrokerThread
from josef.testing import RawClient, broker_overrides

TOY_KEY_TYPE = 2


class CounterShard:
    """Counts records per key; remembers the offsets it replayed."""

    def __init__(self, context):
        self.context = context
        self.counts = {}
        self.offsets = []
        self.was_loaded = False
        self.was_unloaded = False

    def replay(self, key, value, offset):
        name = key.decode()
        if value is None:
            self.counts.pop(name, None)
        else:
            self.counts[name] = int(value)
        self.offsets.append(offset)

    def loaded(self):
        self.was_loaded = True

    def unloaded(self):
        self.was_unloaded = True


class ToyCoordinator:
    key_type = TOY_KEY_TYPE
    internal_topic = "__toy_state"

    def __init__(self, broker):
        self.broker = broker

    def topic_settings(self):
        return 3, 1, {"cleanup.policy": "compact"}

    def apis(self):
        return ()

    def new_shard(self, context):
        return CounterShard(context)


class ToyPlugin:
    @staticmethod
    @hookimpl
    def register_coordinators(register):
        register("toy", ToyCoordinator)


@pytest.fixture
def broker(tmp_path):
    pm = get_plugin_manager(plugins=[ToyPlugin()], block=["coordinator-group", "coordinator-txn", "coordinator-share"])
    thread = BrokerThread(broker_overrides(tmp_path), pm=pm)
    thread.start()
    yield thread
    thread.stop()


def toy(thread):
    return thread.broker.coordinators.coordinators["toy"]


async def increment(thread, key, times=1):
    context = await thread.broker.coordinators.shard_for(toy(thread), key)
    async with context.lock:
        for _ in range(times):
            current = context.shard.counts.get(key, 0)
            await context.write([(key.encode(), str(current + 1).encode())])
    return context


def test_java_hashcode_and_partition():
    assert java_string_hashcode("hello") == 99162322
    assert java_string_hashcode("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants", 50) == 0  # abs(Integer.MIN_VALUE) is taken as 0
    assert java_string_hashcode("\U0001F600") == 1772899  # UTF-16 surrogate pair, as Java sees it
    assert partition_for("my-group", 50) == abs(java_string_hashcode("my-group")) % 50


def test_writes_apply_after_commit_and_survive_restart(broker):
    context = broker.call(increment, broker, "group-a", 3)
    assert context.shard.counts == {"group-a": 3}
    assert context.shard.was_loaded
    assert broker.broker.image.topics["__toy_state"] and len(broker.broker.image.topics["__toy_state"].partitions) == 3
    broker.call(increment, broker, "group-b", 2)
    broker.restart()

    async def state():
        a = await broker.broker.coordinators.shard_for(toy(broker), "group-a")
        b = await broker.broker.coordinators.shard_for(toy(broker), "group-b")
        return a.shard.counts.get("group-a"), b.shard.counts.get("group-b")

    assert broker.call(state) == (3, 2)


def test_tombstones_delete(broker):
    async def main():
        context = await increment(broker, "gone")
        async with context.lock:
            await context.write([(b"gone", None)])
        return context.shard.counts

    assert "gone" not in broker.call(main)


def test_timers_fire_once_and_can_be_cancelled(broker):
    async def main():
        context = await broker.broker.coordinators.shard_for(toy(broker), "timed")
        fired = anyio.Event()

        async def expire():
            async with context.lock:
                await context.write([(b"timed", b"99")])
            fired.set()

        async def never():
            raise AssertionError("a cancelled timer fired")

        context.schedule("cancelled", 0.01, never)
        context.cancel("cancelled")
        context.schedule("expiry", 0.05, never)
        context.schedule("expiry", 0.01, expire)  # rescheduling replaces the earlier timer
        with anyio.fail_after(10):
            await fired.wait()
        await anyio.sleep(0.1)  # give the replaced and cancelled timers the chance to misbehave
        return context.shard.counts["timed"]

    assert broker.call(main) == 99


def test_find_coordinator_answers_for_installed_key_types(broker):
    client = RawClient(broker.port)
    # Key type 2 is the share coordinator's, whose keys are groupId:topicId:partition, asked from v6 on.
    keys = ["k1:AAAAAAAAAAAAAAAAAAAAAA:0", "k2:AAAAAAAAAAAAAAAAAAAAAA:1"]
    answer = client.call(10, 6, {"key_type": TOY_KEY_TYPE, "coordinator_keys": keys})
    assert [(c.key, c.node_id, c.port, c.error_code) for c in answer.coordinators] == [
        (keys[0], 1, broker.port, ErrorCode.none), (keys[1], 1, broker.port, ErrorCode.none)]
    old = client.call(10, 1, {"key": "k1", "key_type": 1})  # no transaction coordinator installed
    assert old.error_code == ErrorCode.invalid_request


def test_dropped_shards_are_told_after_their_timers_stop(broker):
    async def main():
        runtime = broker.broker.coordinators
        context = await runtime.shard_for(toy(broker), "k")

        async def never():
            raise AssertionError("a timer of a dropped shard fired")

        context.schedule("t", 0.01, never)
        runtime.close()  # as when leadership moves or the broker stops
        await anyio.sleep(0.05)
        return context.active, context.shard.was_unloaded

    assert broker.call(main) == (False, True)


# The timeline model (plugin API 1.2) --------------------------------------------------------------------------------


class TimelineCounterShard:
    """Counts per key in a timeline dict: applied as written, rolled back with a failed batch."""

    timeline = True

    def __init__(self, context):
        self.context = context
        self.counts = TimelineDict(context.snapshots)

    def replay(self, key, value, offset):
        if value is None:
            self.counts.pop(key.decode(), None)
        else:
            self.counts[key.decode()] = int(value)

    def loaded(self):
        pass


class TimelineToy(ToyCoordinator):
    internal_topic = "__timeline_toy"
    linger_ms = -1

    def topic_settings(self):
        return 1, 1, {"cleanup.policy": "compact"}

    def append_linger_ms(self):
        return self.linger_ms

    def new_shard(self, context):
        return TimelineCounterShard(context)


class TimelinePlugin:
    @staticmethod
    @hookimpl
    def register_coordinators(register):
        register("timeline", TimelineToy)


@pytest.fixture
def timeline_broker(tmp_path):
    pm = get_plugin_manager(plugins=[TimelinePlugin()], block=["coordinator-group", "coordinator-txn", "coordinator-share"])
    thread = BrokerThread(broker_overrides(tmp_path), pm=pm)
    thread.start()
    yield thread
    thread.stop()


def timeline_toy(thread):
    return thread.broker.coordinators.coordinators["timeline"]


async def counts_at_committed(context):
    return context.shard.counts.view(context.committed_offset)


def test_writes_arriving_together_share_one_append(timeline_broker):
    async def main():
        context = await timeline_broker.broker.coordinators.shard_for(timeline_toy(timeline_broker), "k")
        before = context.flushes

        async def one(i):
            async with context.lock:
                pending = context.append([(f"k{i}".encode(), b"1")])
                assert context.shard.counts[f"k{i}"] == 1  # applied at once, before it is committed
                await context.wait(pending, 10)

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
        return context.flushes - before, await counts_at_committed(context), context.partition.log.log_end_offset

    flushes, counts, end = timeline_broker.call(main)
    assert flushes == 1 and end == 20
    assert counts == {f"k{i}": 1 for i in range(20)}


def test_a_failed_append_rolls_the_shard_back_and_leaves_earlier_writes(timeline_broker):
    async def write(context, key, value):
        async with context.lock:
            await context.wait(context.append([(key, value)]), 10)

    async def main():
        context = await timeline_broker.broker.coordinators.shard_for(timeline_toy(timeline_broker), "k")
        await write(context, b"kept", b"1")
        # One in-sync replica where two are required: the partition refuses the next append (acks=all's rule).
        context.partition.topic_config["min.insync.replicas"] = 2
        try:
            await write(context, b"kept", b"2")
        except CoordinatorError as exc:
            failed = (exc.code, exc.cause)
        else:
            failed = None
        context.partition.topic_config["min.insync.replicas"] = 1
        state = (context.shard.counts.view(), await counts_at_committed(context), context.partition.log.log_end_offset,
                 context.snapshots.epochs())
        await write(context, b"after", b"3")
        return failed, state, context.shard.counts.view()

    failed, (latest, committed, end, epochs), after = timeline_broker.call(main)
    assert failed == (ErrorCode.coordinator_not_available, ErrorCode.not_enough_replicas)
    assert latest == committed == {"kept": 1} and end == 1 and epochs == [1]
    assert after == {"kept": 1, "after": 3}


def test_unloading_fails_the_writes_waiting_with_not_coordinator(timeline_broker):
    async def main():
        toy = timeline_toy(timeline_broker)
        toy.linger_ms = 60_000  # the batch waits: nothing is appended before the shard is unloaded
        context = await timeline_broker.broker.coordinators.shard_for(toy, "k")
        async with context.lock:
            pending = context.append([(b"k", b"1")])
        timeline_broker.broker.coordinators.close()
        with pytest.raises(CoordinatorError) as failed:
            await context.wait(pending, 10)
        return failed.value.code, context.active, context.partition.log.log_end_offset

    assert timeline_broker.call(main) == (ErrorCode.not_coordinator, False, 0)


def test_loading_a_large_partition_lets_the_broker_work_meanwhile(timeline_broker):
    value = b"9" * 1000

    async def fill():
        context = await timeline_broker.broker.coordinators.shard_for(timeline_toy(timeline_broker), "k")
        async with context.lock:
            for start in range(0, 4000, 500):
                await context.wait(context.append([(f"k{i}".encode(), value) for i in range(start, start + 500)]), 30)
        return context.tp

    tp = timeline_broker.call(fill)

    async def reload():
        runtime = timeline_broker.broker.coordinators
        ticks = 0
        done = anyio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.sleep(0)
            before = ticks
            runtime.reload(tp)
            context = await runtime.shard_for(timeline_toy(timeline_broker), "k")
            done.set()
        return ticks - before, len(context.shard.counts)

    ticks, loaded = timeline_broker.call(reload)
    assert loaded == 4000
    assert ticks >= 4  # about 4 MB in 1 MiB chunks: the loop ran other tasks between them
