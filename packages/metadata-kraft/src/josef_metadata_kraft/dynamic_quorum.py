"""Dynamic controller quorums (KIP-853) outside the Raft core: formatting and configuration.

``josef storage format --standalone`` or ``--initial-controllers`` writes the
bootstrap snapshot ``__cluster_metadata-0/00000000000000000000-0000000000.checkpoint``
holding a KRaftVersionRecord (kraft.version 1) and a VotersRecord, as Kafka's
Formatter does; ``--no-initial-controllers`` formats a controller that joins
later through ``josef metadata-quorum add-controller``. Nodes of a dynamic
quorum set ``controller.quorum.bootstrap.servers`` instead of
``controller.quorum.voters``.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from josef.config import Config, ConfigError
from josef.metadata.meta_properties import log_dirs
from josef.metadata.records import random_uuid, uuid_from_text
from josef_metadata_kraft.raft import OffsetAndEpoch
from josef_metadata_kraft.raft.messages import snapshot_bytes
from josef_metadata_kraft.raft.voters import VoterInfo, voters_control

METADATA_DIR_NAME = "__cluster_metadata-0"
BOOTSTRAP_SNAPSHOT = "00000000000000000000-0000000000.checkpoint"


def metadata_log_dir(config: Config) -> Path:
    """Where ``__cluster_metadata-0`` lives: the first log directory (where josef's storage opens it)."""
    return log_dirs(config)[0] / METADATA_DIR_NAME


def parse_host_port(item: str, key: str) -> tuple[str, int]:
    host, colon, port = item.strip().rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ConfigError(f"invalid value {item!r} for {key}: not HOST:PORT")
    return host.strip("[]"), int(port)


def bootstrap_servers(config: Config) -> list[tuple[str, int]]:
    """``controller.quorum.bootstrap.servers`` as ``(host, port)`` pairs."""
    key = "controller.quorum.bootstrap.servers"
    value = config[key] if key in config.definition else None
    return [parse_host_port(item, key) for item in value or []]


def controller_endpoints(config: Config) -> tuple[tuple[str, str, int], ...]:
    """``(listener, host, port)`` of this node's controller listeners (advertised ones first, as Kafka)."""
    names = config["controller.listener.names"] or ["CONTROLLER"]
    found: dict[str, tuple[str, str, int]] = {}
    for key in ("advertised.listeners", "listeners"):
        for item in config[key] or []:
            name, sep, address = item.partition("://")
            if not sep or name not in names or name in found:
                continue
            host, port = parse_host_port(address, key)
            if port == 0:
                raise ConfigError(f"the controller listener {item} needs a fixed port to be a voter")
            found[name] = (name, host or "localhost", port)
    if not found:
        raise ConfigError(f"no controller listener ({','.join(names)}) in listeners")
    return tuple(found[n] for n in names if n in found)


def parse_initial_controllers(text: str) -> dict[int, VoterInfo]:
    """``ID@HOST:PORT:DIRECTORY_ID,...`` (Kafka's --initial-controllers) into voters."""
    voters: dict[int, VoterInfo] = {}
    for item in text.split(","):
        node, sep, rest = item.strip().partition("@")
        address, colon, directory = rest.rpartition(":")
        try:
            if not sep or not node.isdigit() or not colon:
                raise ValueError
            host, port = parse_host_port(address, "--initial-controllers")
            directory_id = uuid_from_text(directory)
            if len(directory) != 22:
                raise ValueError
        except (ValueError, ConfigError):
            raise ConfigError(f"--initial-controllers: {item!r} is not ID@HOST:PORT:DIRECTORY_ID") from None
        if int(node) in voters:
            raise ConfigError(f"--initial-controllers names node {node} twice")
        voters[int(node)] = VoterInfo(int(node), directory_id, (("", host, port),))
    return voters


def initial_voters(config: Config, *, standalone: bool, initial_controllers: str | None,
                   no_initial_controllers: bool) -> dict[int, VoterInfo] | None:
    """The voters to write in the bootstrap snapshot; ``None`` when formatting writes none."""
    chosen = [flag for flag, on in (("--standalone", standalone), ("--initial-controllers", bool(initial_controllers)),
                                    ("--no-initial-controllers", no_initial_controllers)) if on]
    roles = config["process.roles"]
    static = config["controller.quorum.voters"]
    if len(chosen) > 1:
        raise ConfigError(f"{' and '.join(chosen)} cannot be used together")
    if chosen:
        if "controller" not in roles:
            raise ConfigError(f"{chosen[0]} is only for controllers: process.roles is {','.join(roles)}")
        if static:
            raise ConfigError(f"{chosen[0]} cannot be used with controller.quorum.voters (a static quorum); "
                              "set controller.quorum.bootstrap.servers instead")
    elif "controller" in roles and not static and bootstrap_servers(config):
        raise ConfigError("because controller.quorum.voters is not set on this controller, give one of "
                          "--standalone, --initial-controllers or --no-initial-controllers")
    if no_initial_controllers or not chosen:
        return None
    listener = (config["controller.listener.names"] or ["CONTROLLER"])[0]
    node_id = config["node.id"]
    if standalone:
        endpoints = controller_endpoints(config)
        return {node_id: VoterInfo(node_id, uuid_from_text(random_uuid()), endpoints)}
    assert initial_controllers is not None
    voters = parse_initial_controllers(initial_controllers)
    if node_id not in voters:
        raise ConfigError(f"--initial-controllers does not name this node (node.id {node_id})")
    return {v: VoterInfo(v, info.directory_id, tuple((listener, h, p) for _, h, p in info.endpoints))
            for v, info in voters.items()}


def write_bootstrap_snapshot(config: Config, voters: dict[int, VoterInfo]) -> Path:
    """The ``0-0`` checkpoint with kraft.version 1 and the initial voters, written atomically."""
    directory = metadata_log_dir(config)
    directory.mkdir(parents=True, exist_ok=True)
    data = snapshot_bytes(OffsetAndEpoch(0, 0), [], int(time.time() * 1000),
                          control=voters_control(voters, with_version=True))
    path = directory / BOOTSTRAP_SNAPSHOT
    tmp = directory / (BOOTSTRAP_SNAPSHOT + ".part")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def directory_uuid(text: str) -> uuid.UUID | None:
    return uuid_from_text(text) if text else None
