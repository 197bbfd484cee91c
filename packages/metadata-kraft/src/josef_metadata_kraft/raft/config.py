"""The ``controller.quorum.*`` settings the Raft core runs with."""

from __future__ import annotations

from typing import Any, Mapping

import attrs


@attrs.frozen
class RaftConfig:
    """The ``controller.quorum.*`` settings, with Kafka's defaults."""

    election_timeout_ms: int = 1000
    election_backoff_max_ms: int = 1000
    fetch_timeout_ms: int = 2000
    request_timeout_ms: int = 2000
    retry_backoff_ms: int = 20
    #: Kafka's KafkaRaftClient.MAX_FETCH_WAIT_MS: how long the leader parks an empty Fetch.
    fetch_max_wait_ms: int = 500
    #: Max bytes asked for in Fetch and FetchSnapshot (Kafka: MAX_FETCH_SIZE_BYTES, 8 MiB).
    fetch_max_bytes: int = 8 * 1024 * 1024
    #: The listener name announced with the leader's endpoint.
    listener_name: str = "CONTROLLER"

    #: server.properties keys (Kafka's names) and the fields they set.
    KEYS = {
        "controller.quorum.election.timeout.ms": "election_timeout_ms",
        "controller.quorum.election.backoff.max.ms": "election_backoff_max_ms",
        "controller.quorum.fetch.timeout.ms": "fetch_timeout_ms",
        "controller.quorum.request.timeout.ms": "request_timeout_ms",
        "controller.quorum.retry.backoff.ms": "retry_backoff_ms",
    }

    @classmethod
    def from_properties(cls, props: Mapping[str, Any], listener_name: str = "CONTROLLER") -> RaftConfig:
        """From server.properties-style keys (Kafka's names); missing keys keep Kafka's defaults."""
        values = {field: int(props[key]) for key, field in cls.KEYS.items() if props.get(key) is not None}
        return cls(listener_name=listener_name, **values)
