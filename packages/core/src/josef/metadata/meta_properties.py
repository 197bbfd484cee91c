"""``meta.properties``: the identity a log directory was formatted with.

Every log directory carries the cluster id and node id it belongs to, so a
broker pointed at another cluster's disk refuses to start instead of mixing
data. Formatting writes it; start-up checks it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import attrs

from josef.config import Config, ConfigError, read_properties
from josef.metadata.records import random_uuid

FILE_NAME = "meta.properties"

log = logging.getLogger(__name__)


class NotFormattedError(ConfigError):
    """A log directory has no meta.properties: run ``josef storage format``."""


@attrs.frozen
class MetaProperties:
    cluster_id: str
    node_id: int
    directory_id: str

    def render(self) -> str:
        return (
            "#\n# written by josef storage format\n"
            f"version=1\ncluster.id={self.cluster_id}\nnode.id={self.node_id}\ndirectory.id={self.directory_id}\n"
        )


def log_dirs(config: Config) -> list[Path]:
    """The configured log directories: ``log.dirs``, else ``log.dir``."""
    return [Path(d) for d in (config["log.dirs"] or [config["log.dir"]])]


def directory_ids(config: Config) -> dict[str, str]:
    """The ``directory.id`` of each formatted log directory, by absolute path (as storages report paths).

    What a broker names its directories by to the controller (KIP-858):
    BrokerRegistration's ``log_dirs``, BrokerHeartbeat's ``offline_log_dirs``.
    """
    found = {}
    for directory in log_dirs(config):
        try:
            props = read(directory)
        except OSError:
            continue  # a failed disk: offline, named by no id (Kafka leaves it out of the registration too)
        if props is not None and props.directory_id:
            found[os.path.abspath(directory)] = props.directory_id
    return found


def read(directory: Path) -> MetaProperties | None:
    """The directory's identity; None when it has none yet. OSError when the directory cannot be read (a failed disk)."""
    path = directory / FILE_NAME
    try:
        path.stat()
    except FileNotFoundError:
        return None
    props = read_properties(path)
    try:
        return MetaProperties(props["cluster.id"], int(props["node.id"]), props.get("directory.id", ""))
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{path} is damaged: {exc}") from None


def format_dirs(config: Config, cluster_id: str, *, ignore_formatted: bool = False,
                metadata_directory_id: str | None = None, skip: tuple[Path, ...] = ()) -> list[Path]:
    """Write meta.properties into every log directory; returns the directories written.

    ``metadata_directory_id`` is the ``directory.id`` of the first directory (the one holding
    the metadata log), when the quorum's voter set names it (KIP-853 ``--initial-controllers``).
    """
    written = []
    for index, directory in enumerate(log_dirs(config)):
        if directory in skip:
            continue
        existing = read(directory)
        if existing is not None:
            if ignore_formatted:
                continue
            raise ConfigError(f"log directory {directory} is already formatted (cluster {existing.cluster_id})")
        directory.mkdir(parents=True, exist_ok=True)
        given = metadata_directory_id if index == 0 else None
        props = MetaProperties(cluster_id, config["node.id"], given or random_uuid())
        tmp = directory / (FILE_NAME + ".tmp")
        tmp.write_text(props.render(), encoding="utf-8")
        os.replace(tmp, directory / FILE_NAME)
        written.append(directory)
    return written


def check(config: Config, *, auto_format: bool) -> str:
    """The cluster id all log directories agree on, formatting them first when ``auto_format``.

    A directory that cannot be read (a failed disk) is left out, to be
    offline in the storage, as Kafka starts without it; the first one holds
    the metadata log, so it must work, as must one at least.
    """
    found: dict[Path, MetaProperties | None] = {}
    unusable: list[Path] = []
    for index, directory in enumerate(log_dirs(config)):
        try:
            found[directory] = read(directory)
        except OSError as exc:
            if index == 0:
                raise ConfigError(f"the metadata log directory {directory} cannot be read: {exc}") from None
            log.error("log directory %s cannot be read, so it is offline: %s", directory, exc)
            unusable.append(directory)
    missing = [d for d, p in found.items() if p is None]
    present = [p for p in found.values() if p is not None]
    if missing:
        if not auto_format:
            raise NotFormattedError(
                f"log directory {missing[0]} is not formatted: run `josef storage format -t $(josef storage random-uuid) -c <server.properties>`"
            )
        cluster_id = present[0].cluster_id if present else random_uuid()
        format_dirs(config, cluster_id, ignore_formatted=True, skip=tuple(unusable))
        found = {d: read(d) for d in found}
        present = [p for p in found.values() if p is not None]
    clusters = {p.cluster_id for p in present}
    if len(clusters) > 1:
        raise ConfigError(f"log directories belong to different clusters: {sorted(clusters)}")
    node_ids = {p.node_id for p in present}
    if node_ids != {config["node.id"]}:
        raise ConfigError(f"log directories were formatted for node {sorted(node_ids)}, but node.id is {config['node.id']}")
    return clusters.pop()
