"""``josef client-metrics`` (kafka-client-metrics.sh) and ``josef configs --client-metrics`` against an in-process broker."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from josef_client.commands.client_metrics import client_metrics
from josef_client.commands.configs import configs

NOWHERE = "127.0.0.1:1"  # flag checks happen before connecting


def run(command, bootstrap: str, *args: str):
    result = CliRunner().invoke(command, ["--bootstrap-server", bootstrap, *args])
    assert "Traceback" not in result.output + result.stderr, result.output + result.stderr
    return result


def ok(command, broker, *args: str) -> list[str]:
    result = run(command, broker.bootstrap_servers, *args)
    assert result.exit_code == 0, result.stderr
    return result.output.splitlines()


def test_subscriptions_are_altered_listed_described_and_deleted_as_kafka_prints_them(josef_broker):
    assert ok(client_metrics, josef_broker, "--alter", "--name", "rd", "--metrics", "org.apache.kafka.producer.",
              "--metrics", "org.apache.kafka.consumer.", "--match", "client_software_name=librdkafka,client_id=app-.*",
              "--interval", "2000") == ["Altered client metrics config for rd."]
    [generated] = ok(client_metrics, josef_broker, "--alter", "--generate-name", "--metrics", "*")
    name = generated.removeprefix("Altered client metrics config for ").removesuffix(".")
    assert sorted(ok(client_metrics, josef_broker, "--list")) == sorted(["rd", name])
    assert ok(client_metrics, josef_broker, "--describe", "--name", "rd") == [
        "Client metrics configs for rd are:", "  interval.ms=2000",
        "  match=client_software_name=librdkafka,client_id=app-.*",
        "  metrics=org.apache.kafka.producer.,org.apache.kafka.consumer."]
    # An empty value removes that config, as Kafka's tool does.
    ok(client_metrics, josef_broker, "--alter", "--name", "rd", "--match", "")
    assert ok(configs, josef_broker, "--describe", "--client-metrics", "rd") == [
        "Dynamic configs for client-metric rd are:",
        "  interval.ms=2000 sensitive=false synonyms={CLIENT_METRICS_CONFIG:interval.ms=2000}",
        "  metrics=org.apache.kafka.producer.,org.apache.kafka.consumer. sensitive=false "
        "synonyms={CLIENT_METRICS_CONFIG:metrics=org.apache.kafka.producer.,org.apache.kafka.consumer.}"]
    assert ok(configs, josef_broker, "--alter", "--entity-type", "client-metrics", "--entity-name", "rd",
              "--add-config", "interval.ms=500") == ["Completed updating config for client-metric rd."]
    refused = run(client_metrics, josef_broker.bootstrap_servers, "--alter", "--name", "rd", "--interval", "50")
    assert refused.exit_code == 1 and "interval must be between 100 and 3600000" in refused.stderr
    assert ok(client_metrics, josef_broker, "--delete", "--name", "rd") == ["Deleted client metrics config for rd."]
    assert ok(client_metrics, josef_broker, "--list") == [name]


@pytest.mark.parametrize(("args", "message"), [
    (("--alter", "--metrics", "a."), "One of --name or --generate-name must be specified with --alter."),
    (("--alter", "--name", "x", "--generate-name"), "One of --name or --generate-name must be specified with --alter."),
    (("--delete",), "A client metrics resource name must be specified with --delete."),
    (("--list", "--describe"), "give only one of --alter, --delete, --describe, --list"),
    (("--list", "--name", "x"), "No such option"),  # (click 8.1 adds ': --name', 8.2 " '--name'")
])
def test_kafka_s_refusals_before_connecting(args, message):
    result = run(client_metrics, NOWHERE, *args)
    assert result.exit_code != 0 and message in result.stderr, result.stderr
