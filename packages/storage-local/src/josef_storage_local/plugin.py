"""The entry point (``josef = josef_storage_local.plugin``): the local storage as ``local``, and ``josef dump-log``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import josef
from josef.hookspecs import Register

from josef_storage_local.storage import LocalLogStorage

if TYPE_CHECKING:
    import click

#: The plugin API versions this plugin works with (checked when the plugin manager loads it): the storage contract
#: of 1.3 (closed segments, the retention limit, josef.segment_files).
JOSEF_PLUGIN_API = ">=1.3,<2"


@josef.hookimpl
def register_log_storage(register: Register) -> None:
    register("local", LocalLogStorage)


@josef.hookimpl
def register_commands(cli: click.Group) -> None:
    """``josef dump-log``: the segments, indexes and snapshots of a log directory, as kafka-dump-log.sh prints them."""
    from josef_storage_local.dump_log import dump_log

    cli.add_command(dump_log)
