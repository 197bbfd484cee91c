"""The controller's checks of a topic's tiered-storage keys, as Kafka's (LogConfig.validateRemoteStorage*)."""

import pytest
from kio.schema.errors import ErrorCode as E

from josef import hookimpl
from josef.config import ConfigKey, ConfigType
from josef.node.runner import BrokerThread
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, broker_overrides


class SystemKey:
    """The broker switch josef-storage-tiered declares, declared here so the core is tested alone."""

    @staticmethod
    @hookimpl
    def register_configs(register):
        register(ConfigKey("remote.log.storage.system.enable", ConfigType.BOOLEAN, False, "tiered storage on"))


def start(tmp_path, enabled: bool) -> BrokerThread:
    pm = get_plugin_manager(plugins=[SystemKey()], block=["storage-tiered", "coordinator-group", "coordinator-txn", "coordinator-share"])
    thread = BrokerThread({**broker_overrides(tmp_path), "remote.log.storage.system.enable": str(enabled).lower()},
                          pm=pm)
    return thread.start()


@pytest.fixture
def client(tmp_path):
    thread = start(tmp_path, enabled=True)
    client = RawClient(thread.port)
    yield client
    client.close()
    thread.stop()


def create(client, name, configs):
    answer = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": [{"name": k, "value": v} for k, v in configs.items()]}], "timeout": 30000, "validate_only": False})
    return answer.topics[0]


def alter(client, name, configs):
    answer = client.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
        {"resource_type": 2, "resource_name": name,
         "configs": [{"name": k, "config_operation": 0, "value": v} for k, v in configs.items()]}]})
    return answer.responses[0]


def test_remote_storage_needs_the_brokers_system_switch(tmp_path):
    thread = start(tmp_path, enabled=False)
    client = RawClient(thread.port)
    try:
        refused = create(client, "t", {"remote.storage.enable": "true"})
        assert refused.error_code == E.invalid_config
        assert "Tiered Storage functionality is disabled in the broker" in refused.error_message
        assert create(client, "plain", {"remote.storage.enable": "false"}).error_code == E.none
    finally:
        client.close()
        thread.stop()


def test_tiered_topics_are_deleted_not_compacted_and_keep_less_locally_than_in_total(client):
    assert create(client, "c", {"remote.storage.enable": "true", "cleanup.policy": "compact"}).error_code == E.invalid_config
    too_long = create(client, "r", {"remote.storage.enable": "true", "retention.ms": "1000", "local.retention.ms": "2000"})
    assert (too_long.error_code, "retention.ms" in too_long.error_message) == (E.invalid_config, True)
    assert create(client, "b", {"remote.storage.enable": "true", "retention.bytes": "100",
                                "local.retention.bytes": "-1"}).error_code == E.invalid_config
    assert create(client, "ok", {"remote.storage.enable": "true", "retention.ms": "1000",
                                 "local.retention.ms": "500"}).error_code == E.none


def test_remote_storage_is_turned_off_only_with_its_data_deleted(client):
    assert create(client, "t", {"remote.storage.enable": "true"}).error_code == E.none
    refused = alter(client, "t", {"remote.storage.enable": "false"})
    assert (refused.error_code, "remote.log.delete.on.disable=true" in refused.error_message) == (E.invalid_config, True)
    assert alter(client, "t", {"remote.log.copy.disable": "true"}).error_code == E.none  # read-only, data kept
    assert alter(client, "t", {"remote.storage.enable": "false",
                               "remote.log.delete.on.disable": "true"}).error_code == E.none


def test_the_brokers_default_tiers_the_topics_that_may_be_tiered(tmp_path):
    """log.remote.storage.enable (josef's broker default of remote.storage.enable): a topic that does not set it is
    tiered, so turning it off needs remote.log.delete.on.disable; compacted topics stay local instead of being refused."""
    pm = get_plugin_manager(plugins=[SystemKey()], block=["storage-tiered", "coordinator-group", "coordinator-txn", "coordinator-share"])
    thread = BrokerThread({**broker_overrides(tmp_path), "remote.log.storage.system.enable": "true",
                           "log.remote.storage.enable": "true"}, pm=pm).start()
    client = RawClient(thread.port)
    try:
        assert create(client, "compacted", {"cleanup.policy": "compact"}).error_code == E.none
        assert create(client, "t", {}).error_code == E.none
        refused = alter(client, "t", {"remote.storage.enable": "false"})
        assert refused.error_code == E.invalid_config and "without deleting remote data" in refused.error_message
        refused = alter(client, "t", {"cleanup.policy": "compact"})
        assert refused.error_code == E.invalid_config and "only supports topics with cleanup.policy=delete" in \
            refused.error_message
        assert create(client, "local", {"remote.storage.enable": "false"}).error_code == E.none
    finally:
        client.close()
        thread.stop()


def test_the_brokers_default_needs_remote_storage_on(tmp_path):
    pm = get_plugin_manager(plugins=[SystemKey()], block=["storage-tiered", "coordinator-group", "coordinator-txn", "coordinator-share"])
    with pytest.raises(Exception, match="log.remote.storage.enable=true needs remote.log.storage.system.enable=true"):
        BrokerThread({**broker_overrides(tmp_path), "log.remote.storage.enable": "true"}, pm=pm).start()
