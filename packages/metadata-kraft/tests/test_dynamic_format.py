"""``josef storage format --standalone | --initial-controllers | --no-initial-controllers`` (KIP-853)."""

from click.testing import CliRunner

from josef.cli import build_cli
from josef.metadata.meta_properties import read
from josef.metadata.records import random_uuid, uuid_from_text
from josef_metadata_kraft.raft.voters import VoterSetHistory

CHECKPOINT = "__cluster_metadata-0/00000000000000000000-0000000000.checkpoint"


def properties(tmp_path, name="c.properties", **extra):
    values = {"process.roles": "controller", "node.id": "1", "listeners": "CONTROLLER://localhost:19093",
              "controller.listener.names": "CONTROLLER", "controller.quorum.bootstrap.servers": "localhost:19093",
              "log.dirs": str(tmp_path / "data"), **extra}
    path = tmp_path / name
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items() if v is not None))
    return path


def fmt(path, *flags):
    return CliRunner().invoke(build_cli(), ["storage", "format", "-t", random_uuid(), "-c", str(path), *flags])


def voters_in(directory):
    history = VoterSetHistory({})
    history.scan((directory / CHECKPOINT).read_bytes(), offset_base=-1)
    return history


def test_standalone_writes_the_bootstrap_snapshot_with_this_controller_alone(tmp_path):
    result = fmt(properties(tmp_path), "--standalone")
    assert result.exit_code == 0, result.output
    history = voters_in(tmp_path / "data")
    assert history.kraft_version == 1
    [voter] = history.current().values()
    assert voter.node_id == 1 and voter.endpoints == (("CONTROLLER", "localhost", 19093),)
    assert voter.directory_id == uuid_from_text(read(tmp_path / "data").directory_id)


def test_initial_controllers_names_every_voter_and_this_directory_id(tmp_path):
    dirs = {n: random_uuid() for n in (1, 2, 3)}
    listed = ",".join(f"{n}@c{n}:9093:{d}" for n, d in dirs.items())
    result = fmt(properties(tmp_path, **{"node.id": "2"}), "--initial-controllers", listed)
    assert result.exit_code == 0, result.output
    voters = voters_in(tmp_path / "data").current()
    assert sorted(voters) == [1, 2, 3]
    assert voters[3].endpoints == (("CONTROLLER", "c3", 9093),)
    assert read(tmp_path / "data").directory_id == dirs[2]


def test_no_initial_controllers_writes_no_snapshot(tmp_path):
    assert fmt(properties(tmp_path), "--no-initial-controllers").exit_code == 0
    assert not (tmp_path / "data" / CHECKPOINT).exists()


def test_refusals(tmp_path):
    path = properties(tmp_path)
    both = fmt(path, "--standalone", "--no-initial-controllers")
    assert both.exit_code != 0 and "cannot be used together" in both.output
    missing = fmt(path)
    assert missing.exit_code != 0 and "--standalone, --initial-controllers or --no-initial-controllers" in missing.output
    broker = fmt(properties(tmp_path, "b.properties", **{"process.roles": "broker", "listeners": None}), "--standalone")
    assert broker.exit_code != 0 and "only for controllers" in broker.output
    static = fmt(properties(tmp_path, "s.properties", **{"controller.quorum.voters": "1@localhost:19093"}),
                 "--standalone")
    assert static.exit_code != 0 and "controller.quorum.voters" in static.output
    absent = fmt(path, "--initial-controllers", f"2@c2:9093:{random_uuid()}")
    assert absent.exit_code != 0 and "does not name this node" in absent.output
    bad = fmt(path, "--initial-controllers", "1@c1:9093")
    assert bad.exit_code != 0 and "ID@HOST:PORT:DIRECTORY_ID" in bad.output
    assert not (tmp_path / "data").exists()
