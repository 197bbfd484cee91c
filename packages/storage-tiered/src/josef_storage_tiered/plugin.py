"""The entry point (``josef = josef_storage_tiered.plugin``): tiered storage as a layer over the local storage, its
broker keys, and the remote storage backends ``s3`` and ``local-dir``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import josef
from josef.hookspecs import Register
from josef.remote_storage import RemoteStorageManager

#: The plugin API versions this plugin works with: josef.remote_storage came with 1.3.
JOSEF_PLUGIN_API = ">=1.4,<2"


def s3(settings: Mapping[str, Any]) -> RemoteStorageManager:
    """``s3``: see :mod:`josef_storage_tiered.s3` (imported when selected, not whenever a broker starts)."""
    from josef_storage_tiered.s3 import S3RemoteStorage

    return S3RemoteStorage.from_settings(settings)


def local_dir(settings: Mapping[str, Any]) -> RemoteStorageManager:
    """``local-dir``: see :mod:`josef_storage_tiered.local_dir`."""
    from josef_storage_tiered.local_dir import LocalDirRemoteStorage

    return LocalDirRemoteStorage.from_settings(settings)


@josef.hookimpl
def register_remote_storage(register: Register) -> None:
    register("s3", s3)
    register("local-dir", local_dir)


@josef.hookimpl
def register_log_storage_layers(register: Register) -> None:
    """``tiered``: on with ``remote.log.storage.system.enable`` (see :mod:`josef_storage_tiered.layer`)."""
    register("tiered", tiered)


def tiered(storage: Any, config: Any, services: Any) -> Any:
    """The layer's factory, imported only when a broker is assembled."""
    from josef_storage_tiered.layer import tiered_storage

    return tiered_storage(storage, config, services)


@josef.hookimpl
def register_record_decoders(register: Register) -> None:
    """``josef dump-log --remote-log-metadata-decoder``: the records of ``__remote_log_metadata``."""
    register("remote-log-metadata", remote_log_metadata)


def remote_log_metadata(key: bytes | None, value: bytes | None) -> tuple[None, str]:
    """One keyless record of ``__remote_log_metadata``, as Kafka's RemoteMetadataLogMessageParser prints it."""
    from josef.remote_log_metadata.records import decode_remote_log_metadata

    return None, decode_remote_log_metadata(key, value)


remote_log_metadata.keyless = True  # type: ignore[attr-defined]


@josef.hookimpl
def register_configs(register: Register) -> None:
    from josef_storage_tiered.broker_config import CONFIG_KEYS

    for key in CONFIG_KEYS:
        register(key)
