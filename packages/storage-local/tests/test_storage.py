"""LocalLogStorage: the plugin, log directories, listing, deleting, the clean-shutdown marker."""

from __future__ import annotations

import json

from josef.node.broker_config import CORE_KEYS
from josef.config import Config, ConfigDef
from josef.log import Log, LogConfig, LogStorage
from josef.plugins import collect, get_plugin_manager
from josef.protocol.records import build_batch, validate_and_assign
from josef.protocol.topic_partition import TopicPartition
from josef_storage_local import plugin
from josef_storage_local.logdir import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_FILE
from josef_storage_local.storage import LocalLogStorage


def test_the_plugin_registers_the_storage_as_local():
    pm = get_plugin_manager(autoload=False, plugins=[plugin])
    assert collect(pm, "register_log_storage", "log storage").get("local") is LocalLogStorage


def test_the_storage_and_its_logs_follow_the_core_protocols(harness):
    assert isinstance(harness.storage, LogStorage)
    assert isinstance(harness.open(), Log)


def test_new_logs_go_to_the_first_dir_and_existing_ones_are_found_in_any(tmp_path, clock):
    first, second = tmp_path / "a", tmp_path / "b"
    older = LocalLogStorage(
        Config.build(ConfigDef(CORE_KEYS), {"log.dir": str(second)}), clock=clock
    )
    log = older.open(TopicPartition("t", 1), LogConfig())
    log.append(*_one_batch(log))
    older.close()

    storage = LocalLogStorage(
        Config.build(ConfigDef(CORE_KEYS), {"log.dirs": f"{first},{second}"}), clock=clock
    )
    assert storage.dirs == [first, second]
    fresh = storage.open(TopicPartition("t", 0), LogConfig())
    found = storage.open(TopicPartition("t", 1), LogConfig())
    assert fresh.dir == first / "t-0"
    assert (found.dir, found.log_end_offset) == (second / "t-1", 1)
    assert storage.stored() == [TopicPartition("t", 0), TopicPartition("t", 1)]
    storage.close()
    assert (first / CLEAN_SHUTDOWN_FILE).exists() and (second / CLEAN_SHUTDOWN_FILE).exists()


def _one_batch(log):
    buf = bytearray(build_batch([(None, b"v", 1)]))
    return buf, validate_and_assign(buf, log.log_end_offset, 0, 1 << 20)


def test_stored_lists_partition_dirs_only(harness):
    harness.open()
    harness.open(tp=TopicPartition("my-topic", 12))
    (harness.root / "orders-3.0123abcd-delete").mkdir()
    (harness.root / "not a partition").mkdir()
    (harness.root / "orders-4").write_text("a file")
    assert harness.storage.stored() == [TopicPartition("my-topic", 12), TopicPartition("orders", 0)]


def test_open_returns_the_open_log_with_the_new_config(harness):
    log = harness.open()
    config = LogConfig(retention_ms=5)
    assert harness.storage.open(harness.tp, config) is log
    assert log.config == config


def test_delete_removes_the_log_and_its_checkpoint_entries(harness):
    log = harness.open()
    harness.append(log)
    other = harness.open(tp=TopicPartition("other", 0))
    harness.append(other)
    harness.storage.delete(harness.tp)
    assert not harness.path().exists()
    assert not any(path.name.endswith("-delete") for path in harness.root.iterdir())
    assert harness.storage.stored() == [TopicPartition("other", 0)]
    assert harness.open().log_end_offset == 0  # a new, empty log
    harness.storage.delete(harness.tp)
    harness.storage.close()
    assert (harness.root / RECOVERY_POINT_FILE).read_text() == "0\n1\nother 0 1\n"


def test_an_interrupted_delete_is_finished_at_the_next_start(harness):
    harness.append(harness.open())
    harness.storage.close()
    doomed = harness.root / "orders-0.feedface-delete"
    harness.path().rename(doomed)
    harness.start()
    assert not doomed.exists()
    assert harness.storage.stored() == []


def test_the_clean_shutdown_marker_is_written_at_close_and_removed_at_start(harness):
    harness.open()
    assert not (harness.root / CLEAN_SHUTDOWN_FILE).exists()
    harness.storage.close()
    assert (harness.root / CLEAN_SHUTDOWN_FILE).exists()
    harness.start()
    assert not (harness.root / CLEAN_SHUTDOWN_FILE).exists()


def test_a_closed_log_is_opened_again(harness):
    log = harness.open()
    harness.append(log)
    log.close()
    again = harness.open()
    assert again is not log
    assert again.log_end_offset == 1


def test_high_watermarks_are_checkpointed_beside_their_logs_in_kafkas_format(tmp_path, clock):
    first, second = tmp_path / "a", tmp_path / "b"
    config = Config.build(ConfigDef(CORE_KEYS), {"log.dirs": f"{first},{second}"})
    storage = LocalLogStorage(config, clock=clock)
    here, there = TopicPartition("t", 0), TopicPartition("t", 1)
    storage.open(here, LogConfig())
    storage.open(there, LogConfig())
    storage.move(there, str(second))
    storage.checkpoint_high_watermarks({here: 7, there: 3, TopicPartition("gone", 0): 9})
    assert (first / "replication-offset-checkpoint").read_text() == "0\n1\nt 0 7\n"
    assert (second / "replication-offset-checkpoint").read_text() == "0\n1\nt 1 3\n"
    storage.close()
    assert LocalLogStorage(config, clock=clock).high_watermarks() == {here: 7, there: 3}


def test_the_clean_shutdown_marker_records_the_broker_epoch_in_kafkas_format(harness):
    harness.open()
    harness.storage.close(broker_epoch=42)
    assert json.loads((harness.root / CLEAN_SHUTDOWN_FILE).read_text()) == {"version": 0, "brokerEpoch": 42}
    harness.start()
    assert harness.storage.clean_shutdown_epoch() == 42
    assert not (harness.root / CLEAN_SHUTDOWN_FILE).exists()  # a crash from now on is an unclean stop
    harness.storage.close()
    (harness.root / CLEAN_SHUTDOWN_FILE).write_text("")  # as josef wrote it before
    harness.start()
    assert harness.storage.clean_shutdown_epoch() == -1
