"""A protocol fuzzer for a live josef broker, for josef's tests and for users fuzzing brokers with their plugins.

::

    from josef.testing.fuzz import BrokerProcess, Fuzzer, capture_client_sessions, create_topics, FUZZ_TOPICS

    broker = BrokerProcess(tmp_path, port)                  # `josef server start`, single-node default
    create_topics(broker, FUZZ_TOPICS)
    corpus = capture_client_sessions((broker.host, broker.port))
    report = Fuzzer(broker, corpus=corpus).run(5000, seed=1)
    print(report.text())
    assert not report.findings

A broker started with plugins (``BrokerProcess(..., extra={...})`` or a node
of a :class:`josef.node.cluster.JosefCluster` through
:class:`~josef.testing.fuzz.target.ClusterNode`) is fuzzed the same way:
the requests are drawn for every API and version its ApiVersions
advertises, plugin APIs included. Needs Hypothesis (and confluent-kafka and
kafka-python to capture client traffic).

- :mod:`~josef.testing.fuzz.requests`: requests drawn from kio's schemas, valid and broken;
- :mod:`~josef.testing.fuzz.mutations`: byte mutations of captured traffic;
- :mod:`~josef.testing.fuzz.proxy`: the recording proxy and the client sessions it captures;
- :mod:`~josef.testing.fuzz.target`: the broker process, its health, sockets, memory and log;
- :mod:`~josef.testing.fuzz.runner`: the fuzzer and its report.
"""

from josef.testing.fuzz.mutations import RawInput, mutated_traffic
from josef.testing.fuzz.proxy import Capture, RecordingProxy, capture_client_sessions
from josef.testing.fuzz.requests import FUZZ_TOPICS, Input, request_frames
from josef.testing.fuzz.runner import Finding, Fuzzer, Report
from josef.testing.fuzz.target import (
    HEALTH_TOPIC,
    BrokerProcess,
    ClusterNode,
    RunningBroker,
    api_versions,
    cap_memory,
    create_topics,
    health_problem,
    reset_state,
)

__all__ = ["FUZZ_TOPICS", "HEALTH_TOPIC", "BrokerProcess", "Capture", "ClusterNode", "Finding", "Fuzzer", "Input",
           "RawInput", "RecordingProxy", "Report", "RunningBroker", "api_versions", "cap_memory", "capture_client_sessions",
           "create_topics", "health_problem", "mutated_traffic", "request_frames", "reset_state"]
