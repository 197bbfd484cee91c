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
    KRaft controller, storing in log.dir, listening on localhost:9092 (with
    /metrics and health checks on http://127.0.0.1:9644), and formatting its
    storage on first start.
    """
    from josef.node.runner import run_forever
    from josef.node.server_properties import QUICK_START_DEFAULTS, load_config

    logging.basicConfig(level=log_level, format="[%(asctime)s] %(levelname)s %(message)s (%(name)s)")
    pm = get_plugin_manager()
    try:
        quick_start = [f"{k}={v}" for k, v in QUICK_START_DEFAULTS.items()] if properties is None else []
        config = load_config(properties, (*quick_start, *overrides), pm)
        run_forever(config, auto_format=properties is None, pm=pm)
    except (ConfigError, PluginError, LogDirError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a log directory or listener the broker cannot use
        raise click.ClickException(f"cannot start: {exc}") from None


@cli.command("plugins")
@click.argument("properties", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Set a configuration key, over the file (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
def plugins(properties: Path | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """List installed plugins, what each registers, and what PROPERTIES selects.

    Without PROPERTIES the selection is that of ``josef server start``'s
    embedded default. Client-side registrations (assignors, partitioners,
    interceptors) are chosen by each client's own configuration.
    """
    import json
    import shutil
    import textwrap

    import attrs

    from josef.node.server_properties import load_config
    from josef.plugin_api import PLUGIN_API_VERSION
    from josef.plugin_inventory import SELECTED_BY, inventory, selections

    pm = get_plugin_manager()
    try:
        config = load_config(properties, overrides, pm)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    listed = inventory(pm, config)
    for kind in SELECTED_BY:
        installed = sorted(n for p in listed for n in p.registers.get(kind, ()))
        for key, name in selections(config, kind):
            if name not in installed:
                raise click.ClickException(f"{key}={name}: no {kind} of that name is installed; "
                                           f"installed: {', '.join(installed) or 'none'}")
    if as_json:
        click.echo(json.dumps({"josef": __version__, "plugin_api": PLUGIN_API_VERSION,
                               "plugins": [attrs.asdict(p) for p in listed]}, indent=2))
        return
    width = min(shutil.get_terminal_size().columns, 120)
    click.echo(f"josef {__version__}, plugin API {PLUGIN_API_VERSION}")
    for plugin in listed:
        origin = f"{plugin.distribution} {plugin.version}" if plugin.distribution else "registered in process"
        api = f", plugin API {plugin.plugin_api}" if plugin.plugin_api else ""
        click.echo(f"\n{plugin.name} ({origin}{api})")
        for kind, names in plugin.registers.items():
            chosen = set(plugin.selected.get(kind, ()))
            shown = ", ".join(f"{n} [selected]" if n in chosen else n for n in names)
            if kind == "configs":
                shown = f"{len(names)} keys (--json names them)"
            click.echo(textwrap.fill(f"{kind}: {shown}", width, initial_indent="  ", subsequent_indent="      "))
            for coordinator, apis in plugin.apis.items() if kind == "coordinators" else ():
                click.echo(textwrap.fill(f"{coordinator} answers: {', '.join(apis)}", width,
                                         initial_indent="    ", subsequent_indent="      "))


@cli.group("cluster")
def cluster_group() -> None:
    """A cluster: run a local one for development (start); check a running one's health (status, with josef-client)."""


@cluster_group.command("start")
@click.option("--nodes", default=3, type=click.IntRange(min=1), show_default=True,
              help="Broker nodes; each is also a controller unless --controllers is given.")
@click.option("--controllers", default=0, type=click.IntRange(min=0), show_default=True,
              help="Dedicated controller nodes (split roles); 0 makes every node broker and controller.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Where the nodes keep their properties, logs and data; new or empty, and kept on exit. "
                   "[default: a temporary directory, removed on exit]")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address every listener binds.")
@click.option("--base-port", type=click.IntRange(1, 65535),
              help="Consecutive listener ports from this one, in node order. [default: free ports]")
@click.option("--override", "--property", "overrides", multiple=True, metavar="KEY=VALUE",
              help="A server property for every node (repeatable).")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
              show_default=True)
def cluster_start(nodes: int, controllers: int, directory: Path | None, host: str, base_port: int | None,
                  overrides: tuple[str, ...], log_level: str) -> None:
    """Format and start a KRaft cluster of separate node processes on this host, until Ctrl-C or SIGTERM.

    Prints each node's id, roles, pid, listeners and log file, then the
    bootstrap servers. On Ctrl-C or SIGTERM it stops every node by its PID,
    brokers first (controlled shutdown), and exits 0 if all stopped cleanly.
    """
    import tempfile

    from josef.node.cluster import JosefCluster, run_in_foreground
    from josef.config import parse_overrides

    try:
        properties = parse_overrides(overrides)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--override") from None
    if directory is not None and directory.exists() and any(directory.iterdir()):
        raise click.BadParameter(f"{directory} is not empty; give a new or empty directory", param_hint="--dir")
    with tempfile.TemporaryDirectory(prefix="josef-cluster-") as scratch:
        cluster = JosefCluster(directory or Path(scratch), combined=0 if controllers else nodes,
                               controllers=controllers, brokers=nodes if controllers else 0, overrides=properties,
                               host=host, log_level=log_level, base_port=base_port)
        try:
            status = run_in_foreground(cluster, click.echo)
        except RuntimeError as exc:  # a node that could not format or start; its log is in the message
            raise click.ClickException(str(exc)) from None
    sys.exit(status)


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
