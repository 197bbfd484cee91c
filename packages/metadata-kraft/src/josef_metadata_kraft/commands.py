"""``josef storage``: format log directories for KRaft, like kafka-storage.sh."""

from __future__ import annotations

from pathlib import Path

import click

from josef.config import ConfigError
from josef.metadata.meta_properties import format_dirs, log_dirs, read
from josef.metadata import bootstrap
from josef.metadata.features import METADATA_VERSION, FeatureError, release_level
from josef.plugins import collect, get_plugin_manager
from josef.metadata import records
from josef.metadata.records import random_uuid, uuid_from_text
from josef.node.server_properties import load_config
from josef_metadata_kraft import dynamic_quorum


@click.group()
def storage() -> None:
    """Format and inspect KRaft log directories."""


@storage.command("random-uuid")
def random_uuid_command() -> None:
    """Print a new cluster id."""
    click.echo(random_uuid())


@storage.command("format")
@click.option("-t", "--cluster-id", required=True, help="The cluster id (josef storage random-uuid).")
@click.option("-c", "--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a key of the file.")
@click.option("-g", "--ignore-formatted", is_flag=True, help="Skip directories that are already formatted.")
@click.option("-r", "--release-version", help="The metadata.version to start at, as 4.0 or 4.1-IV0 (default: the latest).")
@click.option("-f", "--feature", "features", multiple=True, metavar="NAME=LEVEL", help="A feature level to start at.")
@click.option("-S", "--add-scram", "add_scram", multiple=True, metavar="MECHANISM=[name=...,password=...]",
              help="A SCRAM credential to add to the metadata log, e.g. 'SCRAM-SHA-256=[name=alice,password=alice-secret]' "
                   "or 'SCRAM-SHA-512=[name=alice,iterations=8192,salt=\"N3E=\",saltedpassword=\"YCE=\"]'.")
@click.option("-s", "--standalone", is_flag=True,
              help="This controller is the only initial voter of a dynamic quorum (KIP-853).")
@click.option("-I", "--initial-controllers", metavar="ID@HOST:PORT:DIRECTORY_ID,...",
              help="The initial voters of a dynamic quorum (KIP-853).")
@click.option("-N", "--no-initial-controllers", is_flag=True,
              help="This controller joins an existing dynamic quorum later (josef metadata-quorum add-controller).")
def format_command(cluster_id: str, config_path: Path, overrides: tuple[str, ...], ignore_formatted: bool,
                   release_version: str | None, features: tuple[str, ...], add_scram: tuple[str, ...], standalone: bool,
                   initial_controllers: str | None, no_initial_controllers: bool) -> None:
    """Write meta.properties with CLUSTER_ID into every log directory, and the cluster's starting feature levels
    and SCRAM credentials (--add-scram: the first admin can log in as soon as the cluster starts)."""
    try:
        uuid_from_text(cluster_id)
        if len(cluster_id) != 22:
            raise ValueError
    except ValueError:
        raise click.ClickException(f"cluster id {cluster_id!r} is not a 22-character base64 UUID (josef storage random-uuid)") from None
    try:
        config = load_config(config_path, overrides)
        levels = _levels(release_version, features)
        credentials = [bootstrap.scram_record(argument) for argument in add_scram]
        voters = dynamic_quorum.initial_voters(config, standalone=standalone,
                                               initial_controllers=initial_controllers,
                                               no_initial_controllers=no_initial_controllers)
        own = voters.get(config["node.id"]) if voters else None
        directory_id = (records.uuid_to_text(own.directory_id)
                        if own is not None and own.directory_id is not None else None)
        written = format_dirs(config, cluster_id, ignore_formatted=ignore_formatted,
                              metadata_directory_id=directory_id)
        if written and (levels or credentials):
            bootstrap.write(config, levels, credentials)
        if written and voters:
            dynamic_quorum.write_bootstrap_snapshot(config, voters)
    except (ConfigError, FeatureError) as exc:
        raise click.ClickException(str(exc)) from None
    for directory in written:
        click.echo(f"Formatting {directory} with cluster.id {cluster_id}")
    if not written:
        click.echo("All of the log directories are already formatted.")


def _levels(release_version: str | None, features: tuple[str, ...]) -> dict[str, int]:
    """The feature levels asked for, checked against what the installed plugins support.

    Features not named start at their default for the chosen release, as
    kafka-storage's: ``--release-version 4.0`` leaves eligible leader
    replicas off, the latest release turns them on.
    """
    supported = dict(collect(get_plugin_manager(), "register_features", "feature").items())
    named: dict[str, int] = {}
    if release_version:
        named[METADATA_VERSION] = release_level(release_version)
    for item in features:
        name, sep, level = item.partition("=")
        if not sep or not level.strip().lstrip("-").isdigit():
            raise ConfigError(f"--feature {item!r} is not NAME=LEVEL")
        if name.strip() == METADATA_VERSION and release_version:
            raise ConfigError("give metadata.version either with --release-version or with --feature, not both")
        named[name.strip()] = int(level)
    if not named:
        return {}
    levels = bootstrap.defaults(supported, named.get(METADATA_VERSION))
    levels.update(named)
    bootstrap.check_levels(levels, supported)
    return levels


@storage.command("info")
@click.option("-c", "--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def info_command(config_path: Path) -> None:
    """Show what each log directory was formatted with."""
    try:
        config = load_config(config_path, ())
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for directory in log_dirs(config):
        props = read(directory)
        if props is None:
            click.echo(f"{directory}: not formatted")
        else:
            click.echo(f"{directory}: cluster.id={props.cluster_id} node.id={props.node_id} directory.id={props.directory_id}")
