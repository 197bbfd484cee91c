"""The feature levels a new cluster starts with: Kafka's ``bootstrap.checkpoint``.

``josef storage format --release-version``/``--feature`` writes the chosen
levels beside ``meta.properties`` in the metadata log directory; the first
active controller commits them as FeatureLevelRecords before anything else.
Without the file (the single-node default formats itself on first start),
each feature starts at the default level its plugin declares.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping

from josef.config import Config, ConfigError
from josef.metadata.meta_properties import log_dirs
from josef.metadata.features import SupportedFeature
from josef.metadata.records import FeatureLevelRecord, UnknownRecordError, decode, encode
from josef.protocol.records import CorruptRecordError, batch_is_valid, build_batch, iter_batches, iter_records

FILE_NAME = "bootstrap.checkpoint"


def path(config: Config) -> Path:
    """Where the file lives: the first log directory, which holds the metadata log."""
    return log_dirs(config)[0] / FILE_NAME


def check_levels(levels: Mapping[str, int], supported: Mapping[str, SupportedFeature]) -> None:
    for name, level in levels.items():
        feature = supported.get(name)
        if feature is None:
            raise ConfigError(f"unknown feature {name!r}; this node supports {', '.join(sorted(supported))}")
        if level != 0 and not feature.min_level <= level <= feature.max_level:
            raise ConfigError(f"feature {name} level {level} is outside the supported {feature.min_level}-{feature.max_level}")


def write(config: Config, levels: Mapping[str, int]) -> None:
    records = [(None, encode(FeatureLevelRecord(name=n, feature_level=v)), int(time.time() * 1000))
               for n, v in sorted(levels.items())]
    target = path(config)
    tmp = target.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        out.write(build_batch(records))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)


def levels(config: Config, supported: Mapping[str, SupportedFeature]) -> dict[str, int]:
    """The levels to finalize in a new cluster: the file's, over each feature's default."""
    chosen = {name: f.default_level for name, f in supported.items()}
    target = path(config)
    if target.exists():
        data = target.read_bytes()
        try:
            end = 0
            for pos, header in iter_batches(data):
                if not batch_is_valid(data, pos, header):
                    raise CorruptRecordError(f"batch at byte {pos} fails its CRC")
                end = pos + header.size
                for record in iter_records(memoryview(data)[pos: pos + header.size]):
                    feature = decode(record.value or b"")
                    if isinstance(feature, FeatureLevelRecord):
                        chosen[feature.name] = feature.feature_level
            if end != len(data):
                raise CorruptRecordError(f"{len(data) - end} bytes of a partial batch at the end")
        except (UnknownRecordError, CorruptRecordError) as exc:
            raise ConfigError(f"{target} is damaged: {exc}") from None
        check_levels(chosen, supported)
    return chosen
