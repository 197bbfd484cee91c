"""confluent-kafka consumer groups against a josef broker: partitions shared, and taken over when a member goes.

Each consumer runs in its own process (this file, run as a script, is the
worker), so a member can be killed with SIGKILL by its PID and the broker
has to notice through the session timeout, as with a crashed client. The
workers report on stdout, as JSON lines, their assignment whenever it changes
and every record they consume; they commit each record's offset as they go.
The test waits on those reports with deadlines, never on sleeps.
"""

from __future__ import annotations

import time

import pytest
from group_workers import DEADLINE_S, SESSION_TIMEOUT_MS, TOPIC_PARTITIONS, Worker, committed, produce, wait_until


@pytest.mark.parametrize("departure", ["close", "kill"])
@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_three_consumers_share_six_partitions_and_take_over_from_a_leaver(broker_factory, strategy, departure):
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = broker_factory(**{"group.initial.rebalance.delay.ms": "0"})
    bootstrap = broker.bootstrap_servers
    topic, group = f"shared-{strategy}-{departure}", f"g-{strategy}-{departure}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 1)])[topic].result(30)

    settings = {"partition.assignment.strategy": strategy, "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": 500}
    workers = [Worker(f"w{i}", bootstrap, group, topic, settings) for i in range(3)]
    try:
        def balanced(members: list[Worker], each: int) -> bool:
            sets = [w.assignment for w in members]
            return all(len(s) == each for s in sets) and set().union(*sets) == set(range(TOPIC_PARTITIONS))

        wait_until(workers, lambda: balanced(workers, 2), "two partitions each")

        produce(bootstrap, topic, 0, 300)

        def seen(members: list[Worker]) -> set[str]:
            return {value for w in members for _, _, value in w.records}

        wait_until(workers, lambda: len(seen(workers)) == 300, "the first 300 records")

        leaver, survivors = workers[0], workers[1:]
        before = {w.name: set(w.assignment) for w in survivors}
        (leaver.close if departure == "close" else leaver.kill)()
        took = wait_until(survivors, lambda: balanced(survivors, 3), "the leaver's partitions to be taken over")
        # A clean leave rebalances at once; a killed member is noticed when its session expires.
        assert took < SESSION_TIMEOUT_MS / 1000 + 15, took
        if strategy == "cooperative-sticky":
            assert all(before[w.name] <= w.assignment for w in survivors)  # nobody lost a partition it had

        produce(bootstrap, topic, 300, 300)
        wait_until(workers, lambda: len(seen(workers)) == 600, "every record")
        assert seen(workers) == {f"v{i}" for i in range(600)}
        late = {v for w in survivors for p, _, v in w.records if int(v[1:]) >= 300}
        assert late == {f"v{i}" for i in range(300, 600)}  # the second half went to the survivors

        ends = {p: 100 for p in range(TOPIC_PARTITIONS)}
        deadline = time.monotonic() + DEADLINE_S
        while committed(bootstrap, group, topic) != ends:
            assert time.monotonic() < deadline, committed(bootstrap, group, topic)
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.stop()
