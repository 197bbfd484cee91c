"""The entry point (``coordinator-txn = josef_coordinator_txn.plugin``): transactions for josef.

Installing this distribution is what turns transactions on: the broker
starts the ``transaction`` coordinator, answers FindCoordinator for
transactional ids, registers the transaction APIs and takes InitProducerId
over from the core.
"""

from __future__ import annotations

import josef
from josef.hookspecs import Register
from josef_coordinator_txn.configs import CONFIG_KEYS
from josef_coordinator_txn.coordinator import TransactionCoordinator

#: The plugin API versions this plugin works with (checked when the plugin manager loads it).
JOSEF_PLUGIN_API = ">=1.5,<2"


@josef.hookimpl
def register_coordinators(register: Register) -> None:
    register("transaction", TransactionCoordinator)


@josef.hookimpl
def register_configs(register: Register) -> None:
    for key in CONFIG_KEYS:
        register(key)


@josef.hookimpl
def register_features(register: Register) -> None:
    """``transaction.version`` 0-2, as Kafka 4.x: 2 (Transactions V2, KIP-890) for a new cluster.

    Level 1 writes ``__transaction_state`` values in their flexible version;
    level 2 also makes the coordinator's own aborts (a fenced or timed-out
    producer) bump the epoch as Transactions V2 does. Which protocol a client
    uses is its own choice (EndTxn v5 and Produce v12 are V2).
    """
    from josef.metadata.features import SupportedFeature

    register("transaction.version", SupportedFeature(0, 2, 2))


@josef.hookimpl
def register_record_decoders(register: Register) -> None:
    """``josef dump-log --transaction-log-decoder``: the records of ``__transaction_state``."""
    from josef_coordinator_txn.record_decoder import decode

    register("transaction-log", decode)
