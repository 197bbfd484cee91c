"""Settings of both backends (Aiven's key names, errors naming the full key), the Kafka-operator aliases of
``select``, and the plugin's registration."""

from __future__ import annotations

import logging

import pytest

from josef.plugins import PluginError, collect, get_plugin_manager
from josef.remote_storage import RemoteStorageManager
from josef_storage_tiered.local_dir import LocalDirSettings
from josef_storage_tiered.remote import AIVEN_RSM, select
from josef_storage_tiered.s3 import S3Settings

MiB = 1024 * 1024
BUCKET = {"storage.s3.bucket.name": "tiered"}
AIVEN_S3 = "io.aiven.kafka.tieredstorage.storage.s3.S3Storage"
AIVEN_FS = "io.aiven.kafka.tieredstorage.storage.filesystem.FileSystemStorage"


def test_s3_settings_with_aivens_names():
    settings = S3Settings.parse({
        "storage.s3.bucket.name": "tiered", "storage.s3.region": "eu-west-1",
        "storage.s3.endpoint.url": "http://127.0.0.1:9000", "storage.s3.path.style.access.enabled": "true",
        "storage.aws.access.key.id": "AKIA1", "storage.aws.secret.access.key": "s3cr3t",
        "storage.s3.multipart.upload.part.size": str(16 * MiB), "key.prefix": "kafka/",
        "storage.s3.api.call.timeout": "5000", "storage.s3.api.call.attempt.timeout": "1000",
        "storage.aws.certificate.check.enabled": "false",
        "fetch.chunk.cache.size": "1000",  # Aiven's cache settings: not josef's, ignored
    })
    assert settings == S3Settings(bucket="tiered", region="eu-west-1", endpoint_url="http://127.0.0.1:9000",
                                  path_style=True, access_key_id="AKIA1", secret_access_key="s3cr3t",
                                  certificate_check=False, part_size=16 * MiB, key_prefix="kafka/",
                                  call_timeout_ms=5000, attempt_timeout_ms=1000)
    assert "s3cr3t" not in repr(settings)


def test_s3_defaults():
    settings = S3Settings.parse(BUCKET)
    assert (settings.region, settings.endpoint_url, settings.path_style, settings.access_key_id) == (
        "us-east-1", None, None, None)
    assert settings.part_size == 8 * MiB
    assert settings.endpoint == "https://s3.us-east-1.amazonaws.com"
    assert settings.store() is not None  # builds without credentials: the AWS environment's are used later


def test_chunk_size_is_the_part_size_raised_to_s3s_smallest(caplog):
    assert S3Settings.parse({**BUCKET, "chunk.size": str(16 * MiB)}).part_size == 16 * MiB
    with caplog.at_level(logging.INFO):
        assert S3Settings.parse({**BUCKET, "chunk.size": str(4 * MiB)}).part_size == 5 * MiB
    assert "rsm.config.chunk.size=4194304 is below S3's smallest part" in caplog.text
    both = {**BUCKET, "chunk.size": str(4 * MiB), "storage.s3.multipart.upload.part.size": str(6 * MiB)}
    assert S3Settings.parse(both).part_size == 6 * MiB


@pytest.mark.parametrize(("settings", "message"), [
    ({}, "rsm.config.storage.s3.bucket.name is required"),
    ({"storage.s3.bucket.name": "  "}, "rsm.config.storage.s3.bucket.name is required"),
    ({**BUCKET, "storage.s3.path.style.access.enabled": "maybe"},
     "rsm.config.storage.s3.path.style.access.enabled='maybe' is not a boolean"),
    ({**BUCKET, "storage.s3.multipart.upload.part.size": str(MiB)},
     "rsm.config.storage.s3.multipart.upload.part.size=1048576 must be between 5242880 and 2147483648"),
    ({**BUCKET, "chunk.size": "4MiB"}, "rsm.config.chunk.size='4MiB' is not an integer"),
    ({**BUCKET, "storage.s3.api.call.timeout": "0"}, "rsm.config.storage.s3.api.call.timeout=0 must be at least 1"),
    ({**BUCKET, "storage.s3.endpoint.url": "127.0.0.1:9000"},
     "rsm.config.storage.s3.endpoint.url='127.0.0.1:9000' is not an http:// or https:// URL"),
    ({**BUCKET, "storage.aws.access.key.id": "AKIA1"},
     "rsm.config.storage.aws.secret.access.key is required with rsm.config.storage.aws.access.key.id"),
    ({**BUCKET, "storage.aws.secret.access.key": "s3cr3t"},
     "rsm.config.storage.aws.access.key.id is required with rsm.config.storage.aws.secret.access.key"),
])
def test_s3_setting_errors_name_the_full_key(settings, message):
    with pytest.raises(ValueError) as refused:
        S3Settings.parse(settings)
    assert str(refused.value).startswith(message)
    assert "s3cr3t" not in str(refused.value)


def test_local_dir_settings(tmp_path):
    assert LocalDirSettings.parse({"storage.root": str(tmp_path), "key.prefix": "p/", "chunk.size": "1024"}) == (
        LocalDirSettings(root=tmp_path.resolve(), key_prefix="p/", chunk_size=1024))
    with pytest.raises(ValueError, match=r"^rsm\.config\.storage\.root is required$"):
        LocalDirSettings.parse({})
    with pytest.raises(ValueError, match=r"^rsm\.config\.storage\.root='.*/missing' is not an existing directory$"):
        LocalDirSettings.parse({"storage.root": str(tmp_path / "missing")})


# Selecting a backend -------------------------------------------------------------------------------------------------


def test_the_plugin_registers_both_backends_and_they_build():
    registry = collect(get_plugin_manager(), "register_remote_storage", "remote storage")
    assert {"s3", "local-dir"} <= set(registry.names())
    built = registry.get("s3")(BUCKET)
    assert isinstance(built, RemoteStorageManager)
    built.close()


@pytest.mark.parametrize(("class_name", "settings", "expected"), [
    ("s3", {}, "s3"),
    (" local-dir ", {}, "local-dir"),
    (AIVEN_RSM, {"storage.backend.class": AIVEN_S3}, "s3"),
    (AIVEN_RSM, {"storage.backend.class": AIVEN_FS}, "local-dir"),
    (AIVEN_RSM, {"rsm.config.storage.backend.class": AIVEN_FS}, "local-dir"),
])
def test_select_reads_josef_names_and_aivens_classes(class_name, settings, expected):
    assert select(class_name, settings) == expected


def test_select_errors_list_what_is_installed():
    with pytest.raises(PluginError) as unknown:
        select("gcs", {}, installed=["local-dir", "s3"])
    assert str(unknown.value).startswith(
        "no remote storage backend named 'gcs' is installed (remote.log.storage.manager.class.name=gcs); "
        "installed: local-dir, s3; also understood: io.aiven.kafka.tieredstorage.RemoteStorageManager with "
        "rsm.config.storage.backend.class one of ")
    with pytest.raises(PluginError, match=r"RemoteStorageManager needs rsm\.config\.storage\.backend\.class: one of"):
        select(AIVEN_RSM, {}, installed=["s3"])
    gcs = "io.aiven.kafka.tieredstorage.storage.gcs.GcsStorage"
    with pytest.raises(PluginError) as no_backend:
        select(AIVEN_RSM, {"storage.backend.class": gcs}, installed=["local-dir", "s3"])
    assert f"rsm.config.storage.backend.class={gcs} has no josef backend" in str(no_backend.value)
    assert "installed backends: local-dir, s3" in str(no_backend.value)
    with pytest.raises(PluginError, match=r"no remote storage backend named 's3' is installed .* installed: none"):
        select(AIVEN_RSM, {"storage.backend.class": AIVEN_S3}, installed=[])
