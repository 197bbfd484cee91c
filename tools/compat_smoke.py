"""The compat session's smoke test, run with a cell's own Python against a broker it started: every plugin used once.

    python tools/compat_smoke.py 127.0.0.1:PORT

With the josef-client of the cell: creates a topic (metadata quorum), writes
records with an idempotent producer and more in a committed transaction
(transaction coordinator, local storage), reads them all back read_committed
in a consumer group and commits its position (group coordinator). Exits 0 with
one line when every record came back, non-zero with the reason otherwise.
Written against josef-client's documented API (Producer, Consumer, Admin), which
every tested client version must offer.
"""

from __future__ import annotations

import sys
import time

from josef_client import Admin, Consumer, NewTopic, Producer

TOPIC = "compat-smoke"
PLAIN = [f"plain-{i}".encode() for i in range(5)]
TRANSACTIONAL = [f"txn-{i}".encode() for i in range(3)]
DEADLINE_S = 60


def main(bootstrap: str) -> int:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])

    with Producer(bootstrap_servers=bootstrap) as producer:
        for value in PLAIN:
            producer.send(TOPIC, value, key=b"k").result(30)

    with Producer(bootstrap_servers=bootstrap, transactional_id="compat-smoke-txn") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for value in TRANSACTIONAL:
            producer.send(TOPIC, value, key=b"k")
        producer.commit_transaction()

    consumer = Consumer(bootstrap_servers=bootstrap, group_id="compat-smoke", auto_offset_reset="earliest",
                        isolation_level="read_committed", enable_auto_commit=False)
    got: list[bytes] = []
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < len(PLAIN) + len(TRANSACTIONAL) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(record.value for record in records)
        consumer.commit()
    finally:
        consumer.close()
    if got != PLAIN + TRANSACTIONAL:
        print(f"smoke: expected {len(PLAIN) + len(TRANSACTIONAL)} records in order, got {got!r}", file=sys.stderr)
        return 1
    print(f"smoke: {len(got)} records written (idempotent and transactional) and read back in a group")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
