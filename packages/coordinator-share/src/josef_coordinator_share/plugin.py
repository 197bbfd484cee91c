"""The entry point (``coordinator-share = josef_coordinator_share.plugin``): share groups' state for josef.

Installing this distribution starts the ``share`` coordinator: the broker
answers FindCoordinator for share partitions (key type 2,
``group:topicId:partition``) and the five share-state RPCs, keeping the
state in ``__share_group_state``.
"""

from __future__ import annotations

import josef
from josef.hookspecs import Register
from josef_coordinator_share.configs import CONFIG_KEYS
from josef_coordinator_share.coordinator import ShareCoordinator

#: The plugin API versions this plugin works with (checked when the plugin manager loads it).
JOSEF_PLUGIN_API = ">=1.5,<2"


@josef.hookimpl
def register_coordinators(register: Register) -> None:
    register("share", ShareCoordinator)


@josef.hookimpl
def register_configs(register: Register) -> None:
    for key in CONFIG_KEYS:
        register(key)


@josef.hookimpl
def register_record_decoders(register: Register) -> None:
    """``josef dump-log --share-group-state-decoder``: the records of ``__share_group_state``."""
    from josef_coordinator_share.record_decoder import decode

    register("share-group-state", decode)
