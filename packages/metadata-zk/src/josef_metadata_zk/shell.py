"""``josef zookeeper-shell``: Kafka's ``zookeeper-shell.sh`` (ZooKeeperMain) for reading a josef cluster's znodes.

    josef zookeeper-shell 127.0.0.1:2181/josef get /controller
    josef zookeeper-shell 127.0.0.1:2181/josef ls /brokers/ids
    echo "get /brokers/topics/orders" | josef zookeeper-shell 127.0.0.1:2181/josef
    josef zookeeper-shell zk1:2182/josef -zk-tls-config-file zk-tls.properties stat /controller

The server argument is a ``zookeeper.connect`` value (hosts and chroot);
the commands are ZooKeeperMain's reading ones, with its output: ``ls [-R]
PATH`` prints ``[child, ...]``, ``get PATH`` the data, ``stat PATH`` the
znode's Stat, one ``name = value`` a line. Without a command the shell
reads commands from standard input, one a line, as Kafka's does when its
input is not a terminal. ``-zk-tls-config-file`` names a properties file
with a node's ``zookeeper.ssl.*`` keys, as Kafka's shell takes it, for an
ensemble reached over TLS. Writes are left to the cluster: an operator who
edits josef's metadata znodes by hand corrupts the log, which the nodes
then refuse to start on.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path

import click
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat

from josef.config import ConfigError, read_properties
from josef.node.server_properties import load_config
from josef_metadata_zk.zk_client import ZooKeeperClientSettings
from josef_metadata_zk.znodes import split_connect

#: Kafka's zookeeper-shell.sh option for the file of ``zookeeper.ssl.*`` keys (after the server, one dash).
TLS_OPTION = "-zk-tls-config-file"


def _stat_lines(stat: ZnodeStat) -> list[str]:
    def when(ms: int) -> str:
        return time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime(ms / 1000))
    return [f"cZxid = {stat.czxid:#x}", f"ctime = {when(stat.ctime)}", f"mZxid = {stat.mzxid:#x}",
            f"mtime = {when(stat.mtime)}", f"pZxid = {stat.pzxid:#x}", f"cversion = {stat.cversion}",
            f"dataVersion = {stat.version}", f"aclVersion = {stat.aversion}",
            f"ephemeralOwner = {stat.ephemeralOwner:#x}", f"dataLength = {stat.dataLength}",
            f"numChildren = {stat.numChildren}"]


def _walk(zk: KazooClient, path: str) -> Iterable[str]:
    yield path
    for child in sorted(zk.get_children(path)):
        yield from _walk(zk, f"{path.rstrip('/')}/{child}")


def run_command(zk: KazooClient, chroot: str, words: list[str]) -> list[str]:
    """The output lines of one command; raises click.UsageError for what the shell does not do."""
    name, args = words[0], words[1:]
    recursive = name == "ls" and args[:1] == ["-R"]
    args = args[1:] if recursive else args
    if len(args) != 1 or not args[0].startswith("/"):
        raise click.UsageError(f"{name}: give one absolute path, e.g. {name} /brokers/ids")
    path = (chroot + args[0]).rstrip("/") or "/"
    try:
        if name == "ls" and recursive:
            return [full[len(chroot):] or "/" for full in _walk(zk, path)]  # paths as the user names them
        if name == "ls":
            return [f"[{', '.join(sorted(zk.get_children(path)))}]"]
        if name == "get":
            data, _ = zk.get(path)
            return [data.decode(errors="replace") if data is not None else "null"]
        if name == "stat":
            stat = zk.exists(path)
            return _stat_lines(stat) if stat is not None else [f"Node does not exist: {args[0]}"]
    except NoNodeError:
        return [f"Node does not exist: {args[0]}"]
    raise click.UsageError(f"unknown command {name}: the shell reads with ls [-R], get and stat")


@click.command("zookeeper-shell", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for a connection.")
@click.argument("server")
@click.argument("command", nargs=-1)
def zookeeper_shell(server: str, command: tuple[str, ...], timeout: float) -> None:
    """Read the znodes of the ZooKeeper ensemble SERVER (host:port[,...][/chroot]) as Kafka's zookeeper-shell.sh.

    SERVER may be followed by -zk-tls-config-file FILE (zookeeper.ssl.* keys), as in Kafka's shell."""
    try:
        hosts, chroot = split_connect(server)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="SERVER") from None
    words = list(command)
    properties: dict[str, str] = {}
    if words[:1] == [TLS_OPTION]:
        if len(words) < 2:
            raise click.UsageError(f"{TLS_OPTION} needs a file")
        try:
            properties = read_properties(Path(words[1]))
        except OSError as exc:
            raise click.BadParameter(f"cannot read {words[1]}: {exc.strerror}", param_hint=TLS_OPTION) from None
        words = words[2:]
    try:
        settings = ZooKeeperClientSettings.from_config(load_config(None, {**properties, "zookeeper.connect": server}),
                                                       hosts)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Connecting to {server}")
    zk = settings.client()
    try:
        zk.start(timeout=timeout)
    except KazooTimeoutError:
        raise click.ClickException(f"cannot reach ZooKeeper at {hosts} within {timeout:.0f} s") from None
    try:
        commands = [words] if words else [line.split() for line in sys.stdin if line.strip()]
        for words in commands:
            for line in run_command(zk, chroot, words):
                click.echo(line)
    finally:
        zk.stop()
        zk.close()
