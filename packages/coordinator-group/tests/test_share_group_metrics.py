"""Share groups by state (josef_coordinator_group.share_metrics), on a broker after ShareGroupHeartbeats."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient
from josef_coordinator_group.share_metrics import share_group_metrics

E = ErrorCode


def heartbeat(client: RawClient, group: str, member: str, epoch: int) -> None:
    answer = client.call(ApiKey.SHARE_GROUP_HEARTBEAT, 1, {"group_id": group, "member_id": member,
                                                           "member_epoch": epoch, "rack_id": None,
                                                           "subscribed_topic_names": ["jobs"] if epoch == 0 else None})
    assert answer.error_code == E.none, answer


def test_share_groups_are_counted_by_state(josef_broker):
    client = RawClient(josef_broker.port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": "jobs", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 60000, "validate_only": False})
        assert created.topics[0].error_code == E.none
        heartbeat(client, "busy", "a", 0)
        heartbeat(client, "busy", "b", 0)
        heartbeat(client, "idle", "c", 0)
        heartbeat(client, "idle", "c", -1)  # c leaves: its group stays, Empty
        heartbeat(client, "other", "d", 0)
        coordinator = josef_broker.broker.coordinators.coordinators["group"]
        families = josef_broker.call(lambda: list(share_group_metrics(coordinator.shards())))
        counts = {s.labels["state"]: s.value for f in families for s in f.samples
                  if s.name == "kafka_server_group_coordinator_metrics_share_group_count"}
        assert counts == {"Empty": 1, "Stable": 2, "Dead": 0}
    finally:
        client.close()
