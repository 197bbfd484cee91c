"""The feature levels and first records a new cluster starts with: Kafka's ``bootstrap.checkpoint``.

``josef storage format --release-version``/``--feature`` writes the chosen
levels beside ``meta.properties`` in the metadata log directory, and
``--add-scram`` the SCRAM credentials of the first users (so an admin can
log in to a cluster whose every listener needs SASL); the first active
controller commits them all before anything else. A feature the file does
not name starts at its default for the file's ``metadata.version`` (Kafka's
``Feature.defaultLevel``); without the file (the single-node default formats
itself on first start), each feature starts at the default its plugin
declares for the latest release. With eligible leader replicas among them,
the controller also records a cluster-level ``min.insync.replicas``
(:meth:`josef.metadata.controller.Controller.bootstrap`).
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from pathlib import Path
from typing import Mapping, Sequence

from josef import scram
from josef.config import Config, ConfigError
from josef.metadata.meta_properties import log_dirs
from josef.metadata.features import METADATA_VERSION, SupportedFeature, unmet_dependency
from josef.metadata.records import (
    FeatureLevelRecord,
    MetadataRecord,
    UnknownRecordError,
    UserScramCredentialRecord,
    decode,
    encode,
)
from josef.protocol.records import CorruptRecordError, batch_is_valid, build_batch, iter_batches, iter_records

FILE_NAME = "bootstrap.checkpoint"


def path(config: Config) -> Path:
    """Where the file lives: the first log directory, which holds the metadata log."""
    return log_dirs(config)[0] / FILE_NAME


def check_levels(levels: Mapping[str, int], supported: Mapping[str, SupportedFeature]) -> None:
    """Every level is one this node supports, and the levels it depends on are among ``levels``."""
    for name, level in levels.items():
        feature = supported.get(name)
        if feature is None:
            raise ConfigError(f"unknown feature {name!r}; this node supports {', '.join(sorted(supported))}")
        if level != 0 and not feature.min_level <= level <= feature.max_level:
            raise ConfigError(f"feature {name} level {level} is outside the supported {feature.min_level}-{feature.max_level}")
    for name, level in levels.items():
        unmet = unmet_dependency(name, level, levels, supported)
        if unmet is not None:
            raise ConfigError(unmet)


def defaults(supported: Mapping[str, SupportedFeature], metadata_version: int | None = None) -> dict[str, int]:
    """The level of each feature a new cluster at ``metadata_version`` starts with (the latest release when None)."""
    return {name: f.default_level if metadata_version is None else f.default_for(metadata_version)
            for name, f in supported.items()}


def write(config: Config, levels: Mapping[str, int], others: Sequence[MetadataRecord] = ()) -> None:
    """The file: the levels, then ``others`` (the credentials of ``--add-scram``)."""
    now = int(time.time() * 1000)
    records = [(None, encode(FeatureLevelRecord(name=n, feature_level=v)), now) for n, v in sorted(levels.items())]
    records += [(None, encode(record), now) for record in others]
    target = path(config)
    tmp = target.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        out.write(build_batch(records))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)


def _read(config: Config) -> list[MetadataRecord] | None:
    """Every record of the file, or None without one."""
    target = path(config)
    if not target.exists():
        return None
    data = target.read_bytes()
    found: list[MetadataRecord] = []
    try:
        end = 0
        for pos, header in iter_batches(data):
            if not batch_is_valid(data, pos, header):
                raise CorruptRecordError(f"batch at byte {pos} fails its CRC")
            end = pos + header.size
            for record in iter_records(memoryview(data)[pos: pos + header.size]):
                found.append(decode(record.value or b""))
        if end != len(data):
            raise CorruptRecordError(f"{len(data) - end} bytes of a partial batch at the end")
    except (UnknownRecordError, CorruptRecordError) as exc:
        raise ConfigError(f"{target} is damaged: {exc}") from None
    return found


def levels(config: Config, supported: Mapping[str, SupportedFeature]) -> dict[str, int]:
    """The levels to finalize in a new cluster: the file's, over each feature's default for the file's release."""
    found = _read(config)
    if found is None:
        return defaults(supported)
    written = {r.name: r.feature_level for r in found if isinstance(r, FeatureLevelRecord)}
    chosen = defaults(supported, written.get(METADATA_VERSION))
    chosen.update(written)
    check_levels(chosen, supported)
    return chosen


def records(config: Config) -> list[MetadataRecord]:
    """The file's records other than feature levels (SCRAM credentials), committed with the levels."""
    return [r for r in _read(config) or () if not isinstance(r, FeatureLevelRecord)]


def scram_record(argument: str) -> UserScramCredentialRecord:
    """One ``--add-scram`` argument as Kafka's StorageTool reads it (ScramParser), with its messages.

    ``SCRAM-SHA-256=[name=alice,password=alice-secret]``, or with
    ``iterations=8192`` and ``salt="<base64>"``, or a ``saltedpassword``
    (base64, with its salt) instead of the password. The password is used
    here, on the formatting machine, and only the derived keys are written.
    """
    text = argument.strip()
    mechanism_name, sep, config_text = text.partition("=")
    if not sep:
        raise ConfigError(f"Failed to find equals sign in SCRAM argument '{_masked(text)}'")
    algorithm = scram.BY_NAME.get(mechanism_name)
    if algorithm is None:
        raise ConfigError(f"The add-scram mechanism {mechanism_name} is not supported.")
    if not config_text.startswith("["):
        raise ConfigError("Expected configuration string to start with [")
    if not config_text.endswith("]"):
        raise ConfigError("Expected configuration string to end with ]")
    components: dict[str, str] = {}
    for component in config_text[1:-1].split(","):
        key, eq, value = component.partition("=")
        if not eq:
            raise ConfigError(f"No equals sign found in SCRAM component: {key if key in _PUBLIC else '<hidden>'}")
        if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
            value = value[1:-1]
        components[key] = value
    name = components.pop("name", None)
    if name is None:
        raise ConfigError("You must supply 'name' to add-scram")
    salt_text = components.pop("salt", None)
    iterations_text = components.pop("iterations", None)
    password = components.pop("password", None)
    salted_text = components.pop("saltedpassword", None)
    if components:
        raise ConfigError(f"Unknown SCRAM configurations: {', '.join(sorted(components))}")
    try:
        salt = base64.b64decode(salt_text, validate=True) if salt_text is not None else scram.random_salt()
    except binascii.Error:
        raise ConfigError(f"Failed to decode given salt: {salt_text}") from None
    try:
        iterations = int(iterations_text) if iterations_text is not None else scram.DEFAULT_ITERATIONS
    except ValueError:
        raise ConfigError(f"Failed to parse iterations count: {iterations_text}") from None
    if password is None:
        if salted_text is None:
            raise ConfigError("You must supply one of 'password' or 'saltedpassword' to add-scram")
        if salt_text is None:
            raise ConfigError("You must supply 'salt' with 'saltedpassword' to add-scram")
        try:
            salted = base64.b64decode(salted_text, validate=True)
        except binascii.Error:
            raise ConfigError("Failed to decode given saltedPassword") from None
    if iterations < scram.MIN_ITERATIONS:
        raise ConfigError(f"The 'iterations' value must be >= {scram.MIN_ITERATIONS} for add-scram using "
                          f"{algorithm.name.replace('-', '_')}")
    if iterations > scram.MAX_ITERATIONS:
        raise ConfigError(f"The 'iterations' value must be <= {scram.MAX_ITERATIONS} for add-scram using "
                          f"{algorithm.name.replace('-', '_')}")
    if password is not None:
        salted = scram.salted_password(algorithm, password, salt, iterations)
    credential = scram.credential(algorithm, salt, salted, iterations)
    return UserScramCredentialRecord(name=name, mechanism=algorithm.type, salt=credential.salt,
                                     stored_key=credential.stored_key, server_key=credential.server_key,
                                     iterations=iterations)


#: Components of an --add-scram argument that may be shown in an error (the others hold secrets).
_PUBLIC = frozenset({"name", "iterations", "salt"})


def _masked(text: str) -> str:
    """An --add-scram argument for an error message: anything after the mechanism may be a password."""
    mechanism, _, rest = text.partition("[")
    return mechanism + ("[...]" if rest else "")
