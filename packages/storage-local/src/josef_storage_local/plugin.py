"""The entry point (``josef = josef_storage_local.plugin``) that offers the local storage as ``local``."""

from __future__ import annotations

import josef
from josef.hookspecs import Register

from josef_storage_local.storage import LocalLogStorage


@josef.hookimpl
def register_log_storage(register: Register) -> None:
    register("local", LocalLogStorage)
