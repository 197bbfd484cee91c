"""The ``local-dir`` backend: a directory (an NFS or other shared mount, or a test's temporary directory).

Settings (under ``rsm.config.``), named as Aiven's ``FileSystemStorage``:

==================  ==========================================================================================
``storage.root``    the directory (required). It must exist: a mount that is not mounted must fail the copy,
                    not fill the local disk under the mount point
``key.prefix``      prepended to every object's path (default none)
``chunk.size``      bytes read from a large local file at a time while copying it (default 8 MiB)
==================  ==========================================================================================

Objects are files at the keys of :mod:`josef_storage_tiered.object_store`
under the root; each is written to a temporary file and renamed into place
(obstore's ``LocalStore``), so a reader never sees a half-written object, and
directories left empty by a delete are removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from obstore.store import LocalStore

from josef_storage_tiered.config import Settings, full_key
from josef_storage_tiered.object_store import ObjectStoreRemoteStorage, SegmentLayout

ROOT = "storage.root"
KEY_PREFIX = "key.prefix"
CHUNK_SIZE = "chunk.size"
DEFAULT_CHUNK_SIZE = 8 * 1024 * 1024


@attrs.frozen
class LocalDirSettings:
    """The ``local-dir`` backend's settings, read and checked."""

    root: Path
    key_prefix: str = ""
    chunk_size: int = DEFAULT_CHUNK_SIZE

    @classmethod
    def parse(cls, settings: Mapping[str, Any]) -> LocalDirSettings:
        read = Settings(settings)
        root = Path(read.required(ROOT))
        if not root.is_dir():
            raise ValueError(f"{full_key(ROOT)}={str(root)!r} is not an existing directory")
        chunk_size = read.integer(CHUNK_SIZE, DEFAULT_CHUNK_SIZE, minimum=1)
        assert chunk_size is not None
        return cls(root=root.resolve(), key_prefix=read.string(KEY_PREFIX, "") or "", chunk_size=chunk_size)


class LocalDirRemoteStorage(ObjectStoreRemoteStorage):
    """The ``local-dir`` backend (see the module's docstring)."""

    def __init__(self, settings: LocalDirSettings) -> None:
        self.settings = settings
        self.where = f"directory {settings.root}"
        super().__init__(LocalStore(settings.root, automatic_cleanup=True), layout=SegmentLayout(settings.key_prefix),
                         part_size=settings.chunk_size)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> LocalDirRemoteStorage:
        """The factory registered as ``local-dir``: the broker's ``rsm.config.*`` keys, prefix removed."""
        return cls(LocalDirSettings.parse(settings))
