"""The interceptor in josef-client's producer, found through this plugin's entry point like any installed plugin."""

from __future__ import annotations

from josef_client import Consumer, Producer, TopicPartition

from josef_topic_policy import ORIGIN_HEADER


def produce_and_read(bootstrap: str, topic: str, **producer_config) -> list:
    with Producer(bootstrap_servers=bootstrap, **producer_config) as producer:
        for n in range(3):
            producer.send(topic, f"payment-{n}".encode(), key=b"customer-7").result(30)
    consumer = Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(topic, 0)])
        records: list = []
        for _ in range(100):
            for batch in consumer.poll(timeout_ms=200).values():
                records += batch
            if len(records) >= 3:
                return records
        raise AssertionError(f"read {len(records)} of 3 records from {topic}")
    finally:
        consumer.close()


def test_every_record_carries_the_producer_s_client_id(josef_broker):
    records = produce_and_read(josef_broker.bootstrap_servers, "stamped", client_id="billing",
                               interceptor_classes=["origin-header"])
    assert [r.value for r in records] == [b"payment-0", b"payment-1", b"payment-2"]
    assert all(r.key == b"customer-7" for r in records)
    assert [tuple(r.headers) for r in records] == [((ORIGIN_HEADER, b"billing"),)] * 3


def test_producers_that_do_not_list_it_are_left_alone(josef_broker):
    records = produce_and_read(josef_broker.bootstrap_servers, "plain", client_id="billing")
    assert [tuple(r.headers) for r in records] == [()] * 3
