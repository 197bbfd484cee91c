"""What josef's Kafka-style tools share: one-line errors, Kafka's flag spellings, properties, running a client.

Every failure a user can cause (a bad flag value, an unknown topic, a broker
that cannot be reached) ends as a :class:`click.ClickException`: one
``Error: ...`` line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    TypeVar,
)

import click

if TYPE_CHECKING:
    from josef_client.admin import AsyncAdmin, TopicDescription

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _one_line(exc: click.UsageError) -> click.ClickException:
    message = exc.format_message()
    if exc.ctx is not None and exc.ctx.command_path:
        message = f"{exc.ctx.command_path}: {message}"
    return click.ClickException(" ".join(message.split()))


def _passes_through(exc: click.UsageError) -> bool:
    """Errors that are really a request for help (a group called with nothing) keep click's own display."""
    return type(exc).__name__ == "NoArgsIsHelpError"


def _parse_one_line(parse: Callable[[click.Context, list[str]], list[str]], ctx: click.Context,
                    args: list[str]) -> list[str]:
    """``parse(ctx, args)`` with usage errors as one ``Error:`` line."""
    try:
        return parse(ctx, args)
    except click.UsageError as exc:
        if _passes_through(exc):
            raise
        raise _one_line(exc) from None


class Command(click.Command):
    """A command whose usage errors are one ``Error:`` line, like every other failure."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _parse_one_line(super().parse_args, ctx, args)


class Group(click.Group):
    """A group of tool commands that also takes Kafka's action flags: ``topics --create ...`` runs ``topics create ...``."""

    command_class = Command

    def __init__(self, *args: Any, actions: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actions = tuple(actions)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        flags = [a for a in args if a.startswith("--") and a[2:] in self.actions]
        if flags and not (args and args[0] in self.commands):
            if len(flags) > 1:
                raise click.ClickException(f"{ctx.command_path}: give only one of " +
                                           ", ".join(f"--{a}" for a in self.actions))
            args = [flags[0][2:]] + [a for a in args if a != flags[0]]
        return _parse_one_line(super().parse_args, ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            raise _one_line(exc) from None


# Options -------------------------------------------------------------------------------------------


def bootstrap_option(func: F) -> F:
    return click.option("--bootstrap-server", "bootstrap_server", required=True, metavar="HOST:PORT[,HOST:PORT]",
                        help="The broker(s) to connect to.")(func)


def command_config_option(func: F) -> F:
    return click.option("--command-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        help="A properties file of admin client configs (Kafka's --command-config).")(func)


def parse_pairs(values: Iterable[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict; a value without ``=`` is a one-line error naming the flag."""
    result = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.ClickException(f"invalid {flag} {item!r}: expected KEY=VALUE")
        result[key.strip()] = value
    return result


def read_properties(path: Path | None) -> dict[str, str]:
    """A Java-style properties file (``key=value`` or ``key: value`` lines, ``#``/``!`` comments)."""
    if path is None:
        return {}
    result = {}
    try:
        text = path.read_text()
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc.strerror or exc}") from None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise click.ClickException(f"{path}:{number}: expected key=value, got {raw!r}")
        result[line[:cut].strip()] = line[cut + 1:].strip()
    return result


def client_config(bootstrap_server: str, *sources: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for source in sources:
        config.update(source)
    config["bootstrap.servers"] = bootstrap_server
    return config


# Running -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the failures a user causes into one-line click errors."""
    from josef.config import ConfigError
    from josef.plugins import PluginError
    from josef.protocol.errors import KafkaConnectionError, KafkaError

    try:
        yield
    except KafkaConnectionError as exc:  # its message says what failed; the error code adds nothing
        raise click.ClickException(" ".join(exc.message.split())) from None
    except (KafkaError, ConfigError, PluginError) as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None


def run(coro: Awaitable[T]) -> T:
    """Run a command's coroutine on a fresh event loop, with one-line errors."""

    with user_errors():
        return asyncio.run(coro)  # type: ignore[arg-type]


def make_client(factory: Callable[..., T], config: Mapping[str, Any]) -> T:
    """Construct a client, turning a bad configuration (or bootstrap address) into a one-line error."""
    with user_errors():
        try:
            return factory(dict(config))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None


def admin_client(bootstrap_server: str, command_config: Path | None = None) -> AsyncAdmin:
    from josef_client.admin import AsyncAdmin

    return make_client(AsyncAdmin, client_config(bootstrap_server, read_properties(command_config)))


async def require_topic(admin: AsyncAdmin, topic: str, *, auto_create: bool = False) -> TopicDescription:
    """The topic's description; with ``auto_create``, the broker may create it first, as producers do."""
    from kio.schema.errors import ErrorCode

    from josef.protocol.errors import KafkaError

    if auto_create:
        await admin._metadata([topic], auto_create=True)
    try:
        return (await admin.describe_topics([topic]))[topic]
    except KafkaError as exc:
        if exc.code == ErrorCode.unknown_topic_or_partition:
            raise click.ClickException(f"topic {topic!r} does not exist") from None
        raise


def unescape(text: str) -> str:
    """Backslash escapes in a separator given on the command line (``key.separator=\\t``)."""
    if "\\" not in text:
        return text
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        return text


def principals(values: Iterable[str]) -> list[str]:
    """Kafka's ``SecurityUtils.parseKafkaPrincipal`` on each value (trimmed): ``principalType:name``."""
    parsed = []
    for value in values:
        text = value.strip()
        if ":" not in text:
            raise click.ClickException(f"expected a string in format principalType:principalName but got {text}")
        parsed.append(text)
    return parsed


def parse_bool(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise click.ClickException(f"property {name} must be true or false, got {value!r}")


def tab_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The table of Kafka's newer tools (metadata-quorum, transactions): each cell padded to its column's width, then a tab."""
    rows = list(rows)
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    return ["".join(cell.ljust(width) + "\t" for cell, width in zip(row, widths)) for row in [headers, *rows]]


def stderr(message: str) -> None:
    click.echo(message, err=True)


def quiet_broken_pipe(func: F) -> F:
    """A reader that went away (``| head``) ends the command quietly, like it ends ``cat``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BrokenPipeError:
            with contextlib.suppress(OSError, ValueError):  # no flush of the dead pipe at exit
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            raise SystemExit(0) from None

    return wrapper  # type: ignore[return-value]
