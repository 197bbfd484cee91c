"""The coordinator runtime with a toy coordinator: shards load by replay, writes commit then apply, timers fire."""

import anyio
import pytest
from kio.schema.errors import ErrorCode

from josef import hookimpl
from josef.coordinator.hashing import java_string_hashcode, partition_for
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
    pm = get_plugin_manager(plugins=[ToyPlugin()], block=["coordinator-group", "coordinator-txn"])
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
    answer = client.call(10, 4, {"key_type": TOY_KEY_TYPE, "coordinator_keys": ["k1", "k2"]})
    assert [(c.key, c.node_id, c.port, c.error_code) for c in answer.coordinators] == [
        ("k1", 1, broker.port, ErrorCode.none), ("k2", 1, broker.port, ErrorCode.none)]
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
