"""The core's remote storage contract suite (:mod:`josef.testing.remote_storage`) against both backends:
``local-dir`` on a temporary directory and ``s3`` on a real SeaweedFS S3 server."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from josef.remote_storage import RemoteStorageManager
from josef.testing.remote_storage import RemoteStorageContract
from josef_storage_tiered.plugin import local_dir, s3
from josef_storage_tiered.testing import SeaweedS3

MiB = 1024 * 1024


@attrs.define
class LocalDirHarness:
    """A fresh directory per test; small parts are 64 KiB reads of the local file."""

    root: Path
    large_segment_bytes: int = MiB

    def start(self, *, small_parts: bool = False) -> RemoteStorageManager:
        settings = {"storage.root": str(self.root)}
        if small_parts:
            settings["chunk.size"] = str(64 * 1024)
        return local_dir(settings)


@attrs.define
class S3Harness:
    """A fresh bucket per test on the session's SeaweedFS; small parts are S3's smallest, 5 MiB (SeaweedFS, like
    AWS, refuses a smaller part that is not the last), so a large segment is 12 MiB: three parts."""

    server: SeaweedS3
    bucket: str
    large_segment_bytes: int = 12 * MiB

    def start(self, *, small_parts: bool = False) -> RemoteStorageManager:
        overrides = {"storage.s3.multipart.upload.part.size": str(5 * MiB)} if small_parts else {}
        return s3(self.server.rsm_settings(self.bucket, overrides))


class TestLocalDirContract(RemoteStorageContract):
    @pytest.fixture
    def remote_storage_harness(self, tmp_path_factory: pytest.TempPathFactory) -> LocalDirHarness:
        return LocalDirHarness(tmp_path_factory.mktemp("remote"))


class TestS3Contract(RemoteStorageContract):
    @pytest.fixture
    def remote_storage_harness(self, seaweedfs: SeaweedS3, s3_bucket: str) -> S3Harness:
        return S3Harness(seaweedfs, s3_bucket)
