"""The fuzzer itself (josef.testing.fuzz): what it draws is what it claims, and it catches planted bugs.

- Every valid request drawn, for every API and version josef answers,
  parses with kio to its last byte (through josef's bounds walk).
- Mutations of captured frames are cut back into frames as the broker cuts them.
- Against a real broker (in this process, over real sockets), a handler
  that raises, one that never answers, and one whose answer cannot be
  encoded are each reported, with the input that showed them.
"""

from __future__ import annotations

import logging
import os
import struct

import anyio
import attrs
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import encode_request, is_flexible, parse_body, parse_header
from josef.server.apis import CONTROLLER_APIS, CORE_APIS
from josef.testing.fuzz import HEALTH_TOPIC, Fuzzer, create_topics, mutated_traffic
from josef.testing.fuzz.mutations import split_frames
from josef.testing.fuzz.requests import MAX_WAIT_MS, _request, capped_waits, declared_wait_ms, frame, header

VERSIONS = {key: (low, high) for key, _, low, high in (*CORE_APIS, *CONTROLLER_APIS)}
QUICK = settings(max_examples=60, database=None, deadline=None, phases=[Phase.generate],
                 suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("api_key", sorted(VERSIONS), ids=lambda key: ApiKey(key).name.lower())
def test_valid_requests_drawn_parse_to_their_last_byte(api_key):
    @QUICK
    @given(_request({api_key: VERSIONS[api_key]}, False))
    def check(item):
        data = item.data[4:]
        head = parse_header(data, is_flexible)
        assert (head.api_key, head.api_version, head.correlation_id) == (api_key, item.api_version,
                                                                          item.correlation_id)
        parse_body(api_key, item.api_version, data, head.body_offset)

    check()


def test_mutated_traffic_is_cut_into_frames_as_the_broker_cuts_it():
    corpus = [frame(header(ApiKey.API_VERSIONS, 0, n, b"c", False)) for n in range(3)]
    seen = set()

    # Every kind of mutation must show up: enough examples, and the same ones each run.
    @settings(QUICK, max_examples=300, derandomize=True)
    @given(mutated_traffic(corpus))
    def check(raw):
        frames, rest = split_frames(raw.data)
        assert b"".join(frames) + rest == raw.data
        seen.update(op.split(" ")[0] for op in raw.how.split(": ", 1)[1].split("; "))

    check()
    assert {"flip", "byte", "cut", "delete", "insert", "splice", "size", "duplicate"} <= seen


class InProcess:
    """The test's own broker thread as a fuzzing target: this process's sockets, its log records."""

    def __init__(self, broker, records: list[logging.LogRecord]) -> None:
        self.host, self.port = "127.0.0.1", broker.port
        self.pid = os.getpid()
        self._records = records
        self._read = 0

    def new_log_lines(self) -> list[str]:
        records, self._read = self._records[self._read:], len(self._records)
        return [f"[t] {logging.getLevelName(r.levelno)} {r.getMessage()}" for r in records]


@pytest.fixture
def fuzzed(josef_broker, monkeypatch):
    """A fuzzer of DescribeCluster only, whose handler a test replaces."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logging.getLogger("josef").addHandler(handler)
    target = InProcess(josef_broker, records)
    create_topics(target, [HEALTH_TOPIC], partitions=1)
    apis = josef_broker.broker.dispatcher.apis

    def fuzzer(handler_function, **options) -> Fuzzer:
        monkeypatch.setitem(apis, ApiKey.DESCRIBE_CLUSTER, attrs.evolve(apis[ApiKey.DESCRIBE_CLUSTER],
                                                                        handler=handler_function))
        return Fuzzer(target, versions={ApiKey.DESCRIBE_CLUSTER: (0, 1)}, reset=False, check_every=10, **options)

    try:
        yield fuzzer
    finally:
        logging.getLogger("josef").removeHandler(handler)


def test_a_handler_that_raises_is_found(fuzzed):
    async def broken(ctx, request):
        raise RuntimeError("planted")

    report = fuzzed(broken).run(20, seed=1)
    categories = {f.category for f in report.findings.values()}
    assert {"unknown server error", "broker logged an error"} <= categories
    found = next(f for f in report.findings.values() if f.category == "unknown server error")
    assert "describe_cluster" in found.summary and "describe_cluster v" in found.example


def test_a_request_never_answered_is_a_hang_and_its_connection_a_leak(fuzzed):
    """The broker notices a closed connection only between requests: one stuck in a handler stays open."""
    async def stuck(ctx, request):
        await anyio.sleep_forever()

    report = fuzzed(stuck, answer_timeout=0.5, settle_timeout=1).run(3, seed=2)
    assert {f.category for f in report.findings.values()} == {"hang", "leak"}


def test_an_answer_that_cannot_be_encoded_is_found(fuzzed):
    async def unencodable(ctx, request):
        return {"error_code": 0}  # fields missing: the dispatcher answers UNKNOWN_SERVER_ERROR and logs it

    report = fuzzed(unencodable).run(10, seed=3)
    assert any(f.category == "broker logged an error" and "cannot be encoded" in f.summary
               for f in report.findings.values())


def test_a_sound_broker_yields_no_finding(fuzzed, josef_broker):
    sound = josef_broker.broker.dispatcher.apis[ApiKey.DESCRIBE_CLUSTER].handler
    report = fuzzed(sound).run(40, seed=4)
    assert report.inputs == 40 and report.checks >= 4
    assert not report.findings, report.text()
    assert report.by_api["describe_cluster"].answered > 0


def test_captured_requests_ask_for_short_waits_only():
    """librdkafka's JoinGroup asks for a 300 s rebalance, which a group whose other members left may rightly
    take in full: the fuzzer cuts such waits in captured frames, and leaves everything else as it was."""
    join = encode_request(ApiKey.JOIN_GROUP, 5, 7, b"rdkafka", {
        "group_id": "g", "session_timeout": 45_000, "rebalance_timeout": 300_000, "member_id": "",
        "group_instance_id": None, "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"m"}]})
    assert declared_wait_ms(join) == 300_000
    capped = capped_waits(join)
    assert declared_wait_ms(capped) == MAX_WAIT_MS
    assert capped.replace(struct.pack(">i", MAX_WAIT_MS), struct.pack(">i", 300_000)) == join
    versions = encode_request(ApiKey.API_VERSIONS, 3, 1, b"c", {"client_software_name": "c",
                                                               "client_software_version": "1"})
    assert capped_waits(versions) is versions
