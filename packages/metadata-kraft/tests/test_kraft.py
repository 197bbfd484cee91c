import anyio
import pytest
from click.testing import CliRunner

from josef.cli import build_cli
from josef.config import ConfigError
from josef.meta_properties import NotFormattedError, check, read
from josef.metadata.records import ConfigRecord, TopicRecord, random_uuid, uuid_from_text
from josef.plugins import collect, get_plugin_manager
from josef.server_properties import load_config
from josef_metadata_kraft.quorum import SingleVoterQuorum


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


def test_records_replayed_after_restart(tmp_path):
    config = config_for(tmp_path)
    check(config, auto_format=True)

    async def session(records):
        storage = storage_for(config)
        quorum = SingleVoterQuorum(config, storage)
        seen = []
        async with anyio.create_task_group() as tg:
            await quorum.start(lambda offset, batch: seen.append((offset, list(batch))), tg)
            for batch in records:
                await quorum.append(batch)
        await quorum.close()
        storage.close()
        return seen

    topic_id = uuid_from_text(random_uuid())
    first = [[TopicRecord(name="t", topic_id=topic_id)],
             [ConfigRecord(resource_type=2, resource_name="t", name="retention.ms", value="5"),
              ConfigRecord(resource_type=4, resource_name="", name="x", value=None)]]
    seen = anyio.run(session, first)
    assert [offset for offset, _ in seen] == [0, 2]
    replayed = anyio.run(session, [])
    assert replayed == seen
    assert (tmp_path / "data" / "__cluster_metadata-0" / "quorum-state").exists()


def test_only_a_single_voter_in_combined_mode(tmp_path):
    config = config_for(tmp_path, **{"controller.quorum.voters": "1@localhost:9093,2@localhost:9094"})
    check(config, auto_format=True)
    with pytest.raises(ConfigError, match="single voter"):
        SingleVoterQuorum(config, storage_for(config))
    config = config_for(tmp_path, **{"process.roles": "broker"})
    with pytest.raises(ConfigError, match="combined mode"):
        SingleVoterQuorum(config, storage_for(config))
    with pytest.raises(ConfigError, match="ID@HOST:PORT"):
        SingleVoterQuorum(config_for(tmp_path, **{"controller.quorum.voters": "localhost:9093"}), storage_for(config))
