"""Which remote storage backend a broker's configuration asks for, Kafka operators' class names included.

A josef broker names a backend by its registered name
(``remote.log.storage.manager.class.name=s3``). A Kafka operator's
configuration names Aiven's RSM class and its storage backend class instead;
:func:`select` reads both forms, so that configuration carries over::

    remote.log.storage.manager.class.name=io.aiven.kafka.tieredstorage.RemoteStorageManager
    rsm.config.storage.backend.class=io.aiven.kafka.tieredstorage.storage.s3.S3Storage   # -> s3

The backend's own keys (``rsm.config.storage.s3.bucket.name``...) already
have Aiven's names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from josef.plugins import PluginError, collect, get_plugin_manager
from josef.remote_storage import RemoteStorageManager

from josef_storage_tiered.config import PREFIX, full_key

CLASS_NAME_KEY = "remote.log.storage.manager.class.name"
BACKEND_CLASS = "storage.backend.class"
AIVEN_RSM = "io.aiven.kafka.tieredstorage.RemoteStorageManager"
#: Aiven's storage backend classes and the josef backend that reads the same settings.
AIVEN_BACKENDS: dict[str, str] = {
    "io.aiven.kafka.tieredstorage.storage.s3.S3Storage": "s3",
    "io.aiven.kafka.tieredstorage.storage.filesystem.FileSystemStorage": "local-dir",
}


def installed_backends() -> list[str]:
    """The names registered through ``register_remote_storage`` by the installed plugins."""
    return collect(get_plugin_manager(), "register_remote_storage", "remote storage").names()


def open_backend(class_name: str, settings: Mapping[str, Any], plugins: Any | None = None) -> RemoteStorageManager:
    """The remote storage that ``class_name`` and ``settings`` name, built by the plugin that registers it.

    A broker passes its plugin manager; a reader outside the brokers (the
    Spark connector's executors, reading what the brokers copied) gets the
    installed plugins', and so the same backend from the same keys.
    """
    backends = collect(plugins or get_plugin_manager(), "register_remote_storage", "remote storage")
    return backends.get(select(class_name, settings, backends.names()))(settings)


def select(class_name: str, settings: Mapping[str, Any], installed: Iterable[str] | None = None) -> str:
    """The registered backend name that ``remote.log.storage.manager.class.name`` and ``settings`` ask for.

    ``settings`` are the ``rsm.config.*`` keys, prefix removed (a key still
    carrying the prefix is read too). ``installed`` defaults to what the
    installed plugins register. A name or class that maps to nothing
    installed is a :class:`josef.plugins.PluginError` that lists the
    installed backends and the class names understood.
    """
    names = sorted(installed_backends() if installed is None else installed)
    name = class_name.strip()
    if name == AIVEN_RSM:
        backend = settings.get(BACKEND_CLASS) or settings.get(PREFIX + BACKEND_CLASS)
        backend = str(backend).strip() if backend is not None else ""
        if not backend:
            raise PluginError(f"{CLASS_NAME_KEY}={AIVEN_RSM} needs {full_key(BACKEND_CLASS)}: "
                              f"one of {', '.join(sorted(AIVEN_BACKENDS))}")
        if backend not in AIVEN_BACKENDS:
            raise PluginError(f"{full_key(BACKEND_CLASS)}={backend} has no josef backend; understood: "
                              f"{', '.join(f'{k} ({v})' for k, v in sorted(AIVEN_BACKENDS.items()))}; "
                              f"installed backends: {', '.join(names) or 'none'}")
        name = AIVEN_BACKENDS[backend]
    if name not in names:
        raise PluginError(f"no remote storage backend named {name!r} is installed ({CLASS_NAME_KEY}={class_name}); "
                          f"installed: {', '.join(names) or 'none'}; also understood: {AIVEN_RSM} with "
                          f"{full_key(BACKEND_CLASS)} one of {', '.join(sorted(AIVEN_BACKENDS))}")
    return name
