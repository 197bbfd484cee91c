"""``josef metadata migrate``: move a running cluster's metadata to a KRaft quorum (KIP-866).

The steps, for an operator (packages/metadata-zk/README.md has the whole procedure):

1. Write each new KRaft controller's properties: ``process.roles=controller``,
   ``controller.quorum.voters`` naming all of them, the old backend's
   settings (``zookeeper.connect``) and ``zookeeper.metadata.migration.enable=true``.
2. ``josef metadata migrate -c ctl-1.properties -c ctl-2.properties ...``:
   the old backend's controllers are fenced for good and its metadata log
   read to its end (offset N); each controller's log directories are
   formatted with the cluster's id, and its metadata log starts with that
   state as a snapshot at N, so the KRaft log continues the old offsets and
   every broker keeps its registration. Until the controllers start, the
   cluster has no controller: partitions keep their leaders and serve;
   metadata changes wait.
3. Start the controllers. The active one becomes the controller the old
   brokers reach, and mirrors every commit back into the old backend.
4. Restart the brokers one at a time as KRaft brokers (``process.roles=broker``,
   ``controller.quorum.voters``, no ``zookeeper.connect``).
5. Finalize: restart the controllers without
   ``zookeeper.metadata.migration.enable``. ZooKeeper then falls behind for
   good; its chroot may be deleted.

Until step 5, ``josef metadata migrate --rollback -c ctl-1.properties`` gives
the cluster back: stop the KRaft controllers first, run it (the old backend
elects one of its own controllers again, from the log the KRaft controllers
kept mirrored), then restart any broker already moved as it was before.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from josef.config import Config, ConfigError
from josef.metadata.meta_properties import format_dirs
from josef.metadata.migration import MetadataMigration, MigratedMetadata, MigrationError, configured_migration
from josef.metadata.records import encode
from josef.node.server_properties import load_config
from josef.plugins import collect, get_plugin_manager
from josef_metadata_kraft.kraft_quorum import METADATA_LOG_CONFIG, METADATA_PARTITION, parse_voters
from josef_metadata_kraft.metadata_log import MetadataLog
from josef_metadata_kraft.raft import OffsetAndEpoch
from josef_metadata_kraft.raft.messages import snapshot_bytes


@click.group("metadata")
def metadata() -> None:
    """Move a cluster's metadata to KRaft (KIP-866)."""


@metadata.command("migrate")
@click.option("-c", "--controller-config", "paths", multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A new KRaft controller's properties (give one for every voter of controller.quorum.voters).")
@click.option("--rollback", is_flag=True,
              help="Give the cluster back to its old metadata backend (before the migration is finalized; stop the "
                   "KRaft controllers first).")
def migrate_command(paths: tuple[Path, ...], rollback: bool) -> None:
    """Take a running ZooKeeper-backed cluster's metadata over into new KRaft controllers' log directories."""
    pm = get_plugin_manager()
    try:
        configs = [load_config(path, ()) for path in paths]
        sources = [_source(pm, config, path) for config, path in zip(configs, paths)]
        if rollback:
            epoch = sources[0].roll_back()
            click.echo(f"The migration is rolled back: the old backend's nodes may elect a controller again "
                       f"(controller epoch {epoch}). Restart any broker already moved to KRaft as it was before.")
            return
        _check_controllers(configs, paths)
        state = sources[0].take_over()
        for config in configs:
            _prepare(pm, config, state)
    except (ConfigError, MigrationError) as exc:
        raise click.ClickException(str(exc)) from None
    ids = ", ".join(str(c["node.id"]) for c in configs)
    click.echo(f"Cluster {state.cluster_id}: the old backend's controllers are fenced; its metadata up to offset "
               f"{state.offset} ({len(state.records)} records) is the first snapshot of KRaft controllers {ids}. "
               f"Start them now, then restart each broker as a KRaft broker; finalize by restarting the "
               f"controllers without the migration setting.")


def _source(pm: Any, config: Config, path: Path) -> MetadataMigration:
    migration = configured_migration(pm, config)
    if migration is None:
        raise ConfigError(f"{path} asks for no migration: set zookeeper.metadata.migration.enable=true and "
                          f"zookeeper.connect on every KRaft controller")
    return migration


def _check_controllers(configs: list[Config], paths: tuple[Path, ...]) -> None:
    voters = set(parse_voters(configs[0]["controller.quorum.voters"] or []))
    if not voters:
        raise ConfigError(f"{paths[0]}: a migration needs controller.quorum.voters (the new KRaft controllers)")
    for config, path in zip(configs, paths):
        if list(config["process.roles"]) != ["controller"]:
            raise ConfigError(f"{path}: process.roles must be controller (the KRaft controllers are new nodes)")
        if set(parse_voters(config["controller.quorum.voters"] or [])) != voters:
            raise ConfigError(f"{path}: controller.quorum.voters differs from {paths[0]}'s")
    given = {config["node.id"] for config in configs}
    if given != voters:
        raise ConfigError(f"give the properties of every voter: controller.quorum.voters names {sorted(voters)}, "
                          f"the files given are of {sorted(given)}")


def _prepare(pm: Any, config: Config, state: MigratedMetadata) -> None:
    """Format the controller's log directories with the cluster's id and start its metadata log at the old log's end."""
    format_dirs(config, state.cluster_id)
    storage = collect(pm, "register_log_storage", "log storage").get(config["log.storage"])(config)
    log = MetadataLog(storage.open(METADATA_PARTITION, METADATA_LOG_CONFIG))
    try:
        snapshot_id = OffsetAndEpoch(state.offset + 1, 0)
        log.install_snapshot(snapshot_id, snapshot_bytes(snapshot_id, [encode(r) for r in state.records],
                                                         int(time.time() * 1000)))
        log.flush()
    finally:
        log.close()
