"""``josef storage``: format log directories for KRaft, like kafka-storage.sh."""

from __future__ import annotations

from pathlib import Path

import click

from josef.config import ConfigError
from josef.meta_properties import format_dirs, log_dirs, read
from josef.metadata.records import random_uuid, uuid_from_text
from josef.server_properties import load_config


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
def format_command(cluster_id: str, config_path: Path, overrides: tuple[str, ...], ignore_formatted: bool) -> None:
    """Write meta.properties with CLUSTER_ID into every log directory."""
    try:
        uuid_from_text(cluster_id)
        if len(cluster_id) != 22:
            raise ValueError
    except ValueError:
        raise click.ClickException(f"cluster id {cluster_id!r} is not a 22-character base64 UUID (josef storage random-uuid)") from None
    try:
        config = load_config(config_path, overrides)
        written = format_dirs(config, cluster_id, ignore_formatted=ignore_formatted)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for directory in written:
        click.echo(f"Formatting {directory} with cluster.id {cluster_id}")
    if not written:
        click.echo("All of the log directories are already formatted.")


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
