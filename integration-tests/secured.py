"""A cluster whose every listener is SASL_SSL, for the replication suite and test_secured_cluster.py.

Clients reach the brokers' listener (named PLAINTEXT by the cluster harness,
which finds brokers by that name) over TLS with SCRAM-SHA-512; brokers
authenticate to each other there, and every node to the controllers on
CONTROLLER, with PLAIN as ``broker``. The StandardAuthorizer runs on every
node with ``User:broker`` and ``User:admin`` as super users; ``admin`` has a
SCRAM-SHA-512 credential from ``josef storage format --add-scram``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from josef.node.cluster import JosefCluster
from josef.testing.tls import TlsFiles

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"
BROKER_PASSWORD = "broker-secret"
#: A user the controllers know (PLAIN) who is no super user: valid credentials without CLUSTER_ACTION.
OUTSIDER, OUTSIDER_PASSWORD = "outsider", "outsider-secret"
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def plain_jaas(username: str = "broker", password: str = BROKER_PASSWORD) -> str:
    """The PLAIN entry of a node: its own credentials (``username``, ``password``) and the users it accepts."""
    return (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{username}" '
            f'password="{password}" user_broker="{BROKER_PASSWORD}" user_{OUTSIDER}="{OUTSIDER_PASSWORD}";')


def secured_properties(tls: TlsFiles) -> dict[str, str]:
    """Every node's properties: SASL_SSL listeners, SCRAM for clients, PLAIN between nodes, the StandardAuthorizer."""
    return {
        "listener.security.protocol.map": "PLAINTEXT:SASL_SSL,CONTROLLER:SASL_SSL",
        **tls.broker_properties(),
        "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
        "listener.name.plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        "listener.name.plaintext.plain.sasl.jaas.config": plain_jaas(),
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": plain_jaas(),
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:broker;User:{ADMIN}",
    }


def client_settings(tls: TlsFiles, username: str = ADMIN, password: str = ADMIN_PASSWORD) -> dict[str, str]:
    """librdkafka's settings for SASL_SSL with SCRAM-SHA-512, trusting the test CA."""
    return {"security.protocol": "SASL_SSL", "ssl.ca.location": str(tls.ca_pem), "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": username, "sasl.password": password}


def start_secured_cluster(josef_cluster: Callable[..., JosefCluster], directory: Path, **overrides: str | None,
                          ) -> tuple[JosefCluster, TlsFiles]:
    """A started ``josef_cluster(**overrides)`` (node counts among them) with every listener SASL_SSL, and its CA."""
    tls = TlsFiles.create(directory)
    admin_credential = f"SCRAM-SHA-512=[name={ADMIN},password={ADMIN_PASSWORD}]"
    options: Mapping[str, object] = {"format_args": ("--add-scram", admin_credential)}
    cluster = josef_cluster(**{**secured_properties(tls), **overrides}, cluster_options=options)
    return cluster, tls
