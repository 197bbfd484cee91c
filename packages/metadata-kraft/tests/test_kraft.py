import anyio
import pytest
from click.testing import CliRunner

from josef.cli import build_cli
from josef.config import ConfigError
from josef.metadata.meta_properties import NotFormattedError, check, read
from josef.metadata.image import MetadataImage
from josef.metadata.records import ConfigRecord, TopicRecord, random_uuid, uuid_from_text
from josef.plugins import collect, get_plugin_manager
from josef.node.server_properties import load_config
from josef_metadata_kraft.kraft_quorum import KRaftQuorum


def config_for(tmp_path, **extra):
    return load_config(None, {"log.dirs": str(tmp_path / "data"), **extra})


def storage_for(config):
    return collect(get_plugin_manager(), "register_log_storage", "log storage").get("local")(config)


def test_random_uuid_and_format_commands(tmp_path):
    runner = CliRunner()
    cli = build_cli()
    cluster_id = runner.invoke(cli, ["storage", "random-uuid"]).output.strip()
    assert len(cluster_id) == 22
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={tmp_path / 'a'},{tmp_path / 'b'}\nnode.id=3\n")
    result = runner.invoke(cli, ["storage", "format", "-t", cluster_id, "-c", str(props)])
    assert result.exit_code == 0, result.output
    assert {read(tmp_path / d).cluster_id for d in "ab"} == {cluster_id}
    assert read(tmp_path / "a").node_id == 3
    again = runner.invoke(cli, ["storage", "format", "-t", cluster_id, "-c", str(props)])
    assert again.exit_code != 0 and "already formatted" in again.output
    assert runner.invoke(cli, ["storage", "format", "-t", cluster_id, "-c", str(props), "-g"]).exit_code == 0
    bad = runner.invoke(cli, ["storage", "format", "-t", "not-a-uuid", "-c", str(props)])
    assert bad.exit_code != 0 and "cluster id" in bad.output
    info = runner.invoke(cli, ["storage", "info", "-c", str(props)])
    assert f"cluster.id={cluster_id} node.id=3" in info.output


def test_unformatted_dirs_refuse_to_start_unless_auto(tmp_path):
    config = config_for(tmp_path)
    with pytest.raises(NotFormattedError, match="josef storage format"):
        check(config, auto_format=False)
    cluster_id = check(config, auto_format=True)
    assert check(config, auto_format=False) == cluster_id
    with pytest.raises(ConfigError, match="node.id"):
        check(config_for(tmp_path, **{"node.id": "2"}), auto_format=False)


class Recorder:
    """A metadata listener that keeps what it was given."""

    def __init__(self):
        self.seen = []
        self.current = MetadataImage()

    def on_commit(self, offset, records):
        self.seen.append((offset, list(records)))
        self.current, _ = self.current.apply(offset, records)

    def on_snapshot(self, offset, records):
        self.seen.append(("snapshot", offset, len(records)))
        self.current, _ = MetadataImage().apply(offset, records)

    def current_image(self):
        return self.current


def run_session(config, batches):
    async def session():
        storage = storage_for(config)
        quorum = KRaftQuorum(config, storage)
        recorder = Recorder()
        async with anyio.create_task_group() as tg:
            await quorum.start(recorder, tg)
            assert quorum.controller_id == 1  # a lone voter leads as soon as it starts
            offsets = [await quorum.append(batch) for batch in batches]
            await quorum.snapshot_written()  # snapshots are written in a worker thread
            tg.cancel_scope.cancel()
        await quorum.close()
        storage.close()
        return recorder, offsets

    return anyio.run(session)


def test_records_replayed_after_restart(tmp_path):
    config = config_for(tmp_path)
    check(config, auto_format=True)
    topic_id = uuid_from_text(random_uuid())
    first = [[TopicRecord(name="t", topic_id=topic_id)],
             [ConfigRecord(resource_type=2, resource_name="t", name="retention.ms", value="5"),
              ConfigRecord(resource_type=4, resource_name="", name="x", value=None)]]
    recorder, offsets = run_session(config, first)
    # Offset 0 is the leader's LeaderChange control record; each append is one batch after it.
    assert offsets == [1, 3] and [o for o, _ in recorder.seen] == [1, 3]
    replayed, _ = run_session(config, [])
    assert replayed.seen == recorder.seen
    assert (tmp_path / "data" / "__cluster_metadata-0" / "quorum-state").exists()


def test_a_restart_loads_the_snapshot_then_the_tail(tmp_path):
    config = config_for(tmp_path, **{"metadata.log.max.record.bytes.between.snapshots": "200"})
    check(config, auto_format=True)
    batches = [[TopicRecord(name=f"t{i}", topic_id=uuid_from_text(random_uuid()))] for i in range(20)]
    recorder, _ = run_session(config, batches)
    metadata_dir = tmp_path / "data" / "__cluster_metadata-0"
    assert list(metadata_dir.glob("*.checkpoint"))
    restarted, _ = run_session(config, [])
    assert restarted.seen[0][0] == "snapshot"
    assert restarted.current.topics.keys() == recorder.current.topics.keys() == {f"t{i}" for i in range(20)}


@pytest.mark.parametrize("overrides,message", [
    ({"controller.quorum.voters": "2@localhost:9093,3@localhost:9094"},
     r"node.id 1 has the controller role but controller.quorum.voters names only \[2, 3\]"),
    ({"process.roles": "broker"}, "a broker-only node needs controller.quorum.voters"),
    ({"process.roles": "broker", "controller.quorum.voters": "1@localhost:9093"},
     "names node 1, whose process.roles \\(broker\\) has no controller"),
    ({"controller.quorum.voters": "localhost:9093"}, "ID@HOST:PORT"),
])
def test_a_voter_list_that_disagrees_with_the_node_is_one_clear_error(tmp_path, overrides, message):
    config = config_for(tmp_path)
    check(config, auto_format=True)
    with pytest.raises(ConfigError, match=message):
        KRaftQuorum(config_for(tmp_path, **overrides), storage_for(config))


@pytest.mark.parametrize("flags,expected", [
    ((), None),  # no file: the first start takes the latest release's defaults
    (("--release-version", "4.0"), {"metadata.version": 25, "eligible.leader.replicas.version": 0}),
    (("--release-version", "4.1"), {"metadata.version": 26, "eligible.leader.replicas.version": 1}),
    (("--feature", "eligible.leader.replicas.version=0"), {"metadata.version": 26, "eligible.leader.replicas.version": 0}),
    (("--feature", "metadata.version=24"), {"metadata.version": 24, "eligible.leader.replicas.version": 0}),
    (("--release-version", "4.0-IV2", "--feature", "eligible.leader.replicas.version=1"),
     {"metadata.version": 24, "eligible.leader.replicas.version": 1}),
])
def test_format_starts_eligible_leader_replicas_as_the_release_does(tmp_path, flags, expected):
    from josef.metadata import bootstrap
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={tmp_path / 'data'}\nnode.id=1\n")
    result = CliRunner().invoke(build_cli(), ["storage", "format", "-t", random_uuid(), "-c", str(props), *flags])
    assert result.exit_code == 0, result.output
    config = load_config(props, ())
    supported = dict(collect(get_plugin_manager(), "register_features", "feature").items())
    assert bootstrap.path(config).exists() == (expected is not None)
    levels = bootstrap.levels(config, supported)
    assert {name: levels[name] for name in ("metadata.version", "eligible.leader.replicas.version")} == (
        expected or {"metadata.version": 26, "eligible.leader.replicas.version": 1})


def test_format_refuses_eligible_leader_replicas_below_the_metadata_version_they_need(tmp_path):
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={tmp_path / 'data'}\nnode.id=1\n")
    result = CliRunner().invoke(build_cli(), ["storage", "format", "-t", random_uuid(), "-c", str(props),
                                              "--release-version", "4.0-IV1", "--feature",
                                              "eligible.leader.replicas.version=1"])
    assert result.exit_code != 0
    assert ("eligible.leader.replicas.version could not be set to 1 because it depends on metadata.version level 24"
            in result.output)
    assert not (tmp_path / "data" / "meta.properties").exists()
