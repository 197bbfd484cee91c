"""``josef configs`` for client quotas (kafka-configs.sh --entity-type users|clients|ips) against an in-process broker."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from josef_client.admin import Admin, QuotaFilterComponent
from josef_client.commands.configs import configs

NOWHERE = "127.0.0.1:1"  # flag checks happen before connecting


def run(bootstrap: str, *args: str):
    result = CliRunner().invoke(configs, ["--bootstrap-server", bootstrap, *args])
    assert "Traceback" not in result.output + result.stderr, result.output + result.stderr
    return result


def ok(broker, *args: str) -> list[str]:
    result = run(broker.bootstrap_servers, *args)
    assert result.exit_code == 0, result.stderr
    return result.output.splitlines()


def test_user_client_and_default_quotas_are_set_described_and_removed_as_kafka_shapes_them(josef_broker):
    assert ok(josef_broker, "--alter", "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048",
              "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients", "--entity-name", "app") \
        == ["Completed updating config for user alice."]
    assert ok(josef_broker, "--alter", "--add-config", "request_percentage=200", "--entity-type", "users",
              "--entity-default") == ["Completed updating default config for users in the cluster."]
    assert ok(josef_broker, "--alter", "--add-config", "producer_byte_rate=512", "--client", "batch") \
        == ["Completed updating config for client batch."]
    assert ok(josef_broker, "--alter", "--add-config", "connection_creation_rate=10", "--ip", "10.0.0.1") \
        == ["Completed updating config for ip 10.0.0.1."]
    assert ok(josef_broker, "--describe", "--user", "alice", "--client", "app") == [
        "Quota configs for user-principal 'alice', client-id 'app' are consumer_byte_rate=2048.0, "
        "producer_byte_rate=1024.0"]
    assert ok(josef_broker, "--describe", "--entity-type", "users", "--entity-default") == [
        "Quota configs for the default user-principal are request_percentage=200.0"]
    assert ok(josef_broker, "--describe", "--entity-type", "clients") == [
        "Quota configs for client-id 'batch' are producer_byte_rate=512.0"]
    assert ok(josef_broker, "--describe", "--ip", "10.0.0.1") == [
        "Quota configs for ip '10.0.0.1' are connection_creation_rate=10.0"]
    ok(josef_broker, "--alter", "--delete-config", "consumer_byte_rate", "--user", "alice", "--client", "app")
    with Admin({"bootstrap.servers": josef_broker.bootstrap_servers}) as admin:
        assert admin.describe_client_quotas([QuotaFilterComponent("user", "alice")]) == {
            (("client-id", "app"), ("user", "alice")): {"producer_byte_rate": 1024.0}}


def test_a_user_s_quotas_and_scram_credentials_are_described_together(josef_broker):
    ok(josef_broker, "--alter", "--add-config", "SCRAM-SHA-256=[password=pw]", "--entity-type", "users",
       "--entity-name", "carol")
    ok(josef_broker, "--alter", "--add-config", "producer_byte_rate=100", "--entity-type", "users", "--entity-name",
       "carol")
    assert ok(josef_broker, "--describe", "--entity-type", "users", "--entity-name", "carol") == [
        "Quota configs for user-principal 'carol' are producer_byte_rate=100.0",
        "SCRAM credential configs for user-principal 'carol' are SCRAM-SHA-256=iterations=4096"]


@pytest.mark.parametrize("args, message", [
    (["--alter", "--add-config", "producer_byte_rate=1", "--entity-type", "users", "--entity-type", "ips",
      "--entity-name", "a", "--entity-name", "b"], "Only 'users' and 'clients' entity types may be specified together"),
    (["--alter", "--add-config", "SCRAM-SHA-256=[password=x],producer_byte_rate=1", "--user", "a"],
     "Cannot alter both quota and SCRAM credential configs simultaneously for 'users'"),
    (["--alter", "--add-config", "SCRAM-SHA-256=[password=x]", "--user-defaults"],
     "The use of --entity-default or --user-defaults is not allowed with User SCRAM Credentials"),
    (["--alter", "--add-config", "retention.ms=1", "--client", "a"],
     "Only quota configs can be added for 'clients' using --bootstrap-server. Unexpected config names: "
     "Set(retention.ms)"),
    (["--alter", "--add-config", "producer_byte_rate=1", "--ip", "1.2.3.4"],
     "Only connection quota configs can be added for 'ips'"),
    (["--alter", "--add-config", "producer_byte_rate=1", "--user", "a", "--entity-type", "users"],
     "--entity-{type,name,default} should not be used in conjunction with specific entity flags"),
    (["--describe", "--entity-name", "a"], "At least one entity type must be specified"),
])
def test_kafka_s_refusals_before_connecting(args, message):
    result = run(NOWHERE, *args)
    assert result.exit_code == 1 and message in result.stderr, result.stderr
