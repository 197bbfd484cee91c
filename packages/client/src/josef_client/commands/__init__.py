"""josef's Kafka-style command-line tools, added to ``josef`` through the ``register_commands`` hook.

``topics`` and ``configs`` (kafka-topics, kafka-configs), ``console-producer``
and ``console-consumer``, ``perf produce``/``perf consume``
(kafka-producer-perf-test, kafka-consumer-perf-test), ``consumer-groups``
(kafka-consumer-groups), ``share-groups`` and ``console-share-consumer``
(kafka-share-groups, kafka-console-share-consumer), ``transactions`` (kafka-transactions), ``log-dirs``
(kafka-log-dirs), ``acls`` (kafka-acls) and ``delegation-tokens`` (kafka-delegation-tokens). Each module imports the client only when its command runs,
so ``josef --help`` stays quick.
"""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    from josef_client.commands.acls import acls
    from josef_client.commands.configs import configs
    from josef_client.commands.console import console_consumer, console_producer, console_share_consumer
    from josef_client.commands.delegation_tokens import delegation_tokens
    from josef_client.commands.groups import consumer_groups
    from josef_client.commands.log_dirs import log_dirs
    from josef_client.commands.perf import perf
    from josef_client.commands.share_groups import share_groups
    from josef_client.commands.topics import topics
    from josef_client.commands.transactions import transactions

    for command in (topics, configs, console_producer, console_consumer, console_share_consumer, perf, consumer_groups,
                    share_groups, transactions, log_dirs, acls, delegation_tokens):
        cli.add_command(command)
