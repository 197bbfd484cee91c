"""The ``josef`` command line; plugins add their commands through the ``register_commands`` hook."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from josef import __version__
from josef.config import ConfigError
from josef.log import LogDirError
from josef.plugins import PluginError, get_plugin_manager


@click.group()
@click.version_option(__version__, prog_name="josef")
def cli() -> None:
    """josef: a Kafka-compatible event streaming platform."""


@cli.group()
def server() -> None:
    """Run a broker."""


@server.command("start")
@click.argument("properties", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Set a configuration key, over the file (repeatable).")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), show_default=True)
def start(properties: Path | None, overrides: tuple[str, ...], log_level: str) -> None:
    """Start a broker from PROPERTIES (server.properties).

    With no file, runs the embedded default: one process acting as broker and
    KRaft controller, storing in log.dir, listening on localhost:9092, and
    formatting its storage on first start.
    """
    from josef.runner import run_forever
    from josef.server_properties import load_config

    logging.basicConfig(level=log_level, format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)")
    pm = get_plugin_manager()
    try:
        config = load_config(properties, overrides, pm)
        run_forever(config, auto_format=properties is None, pm=pm)
    except (ConfigError, PluginError, LogDirError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a log directory or listener the broker cannot use
        raise click.ClickException(f"cannot start: {exc}") from None


def build_cli() -> click.Group:
    pm = get_plugin_manager()
    pm.hook.register_commands(cli=cli)
    return cli


def main() -> None:
    try:
        command = build_cli()
    except PluginError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    command()
