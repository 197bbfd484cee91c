"""josef's Kafka-style tools run as a user runs them: ``python -m josef ...`` against a broker process."""

import re
import signal
import socket
import subprocess
import sys

import pytest
from conftest import BrokerProcess, own_topics

from josef_client import Admin, ConfigResource, NewTopic, TopicPartition

TIMEOUT_S = 120


def josef(*args, input=None, timeout=TIMEOUT_S):
    return subprocess.run([sys.executable, "-m", "josef", *args], input=input, capture_output=True, text=True,
                          timeout=timeout, check=False)


def ok(*args, input=None):
    result = josef(*args, input=input)
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result


def one_line_error(result, pattern):
    """Bad input: exit status 1, exactly one ``Error:`` line on stderr, and no traceback."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines[0]
    assert re.search(pattern, lines[0]), (pattern, lines[0])


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def admin(broker):
    client = Admin(bootstrap_servers=broker.bootstrap_servers)
    yield client
    client.close()


def end_offsets(admin, topic):
    partitions = admin.describe_topics([topic])[topic].partitions
    found = admin.list_offsets({TopicPartition(topic, p.partition): "latest" for p in partitions})
    return {tp.partition: info.offset for tp, info in found.items()}


# topics ---------------------------------------------------------------------------------------------------


def test_topics_lifecycle(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    created = ok("topics", "create", *b, "--topic", "orders", "--partitions", "3", "--replication-factor", "1",
                 "--config", "retention.ms=60000", "--config", "cleanup.policy=compact")
    assert created.stdout == "Created topic orders.\n"
    ok("topics", "create", *b, "--topic", "payments")
    assert own_topics(ok("topics", "list", *b).stdout) == ["orders", "payments"]
    assert ok("topics", "list", *b, "--topic", "ord.*").stdout == "orders\n"

    ok("topics", "alter", *b, "--topic", "orders", "--partitions", "5")
    assert len(admin.describe_topics(["orders"])["orders"].partitions) == 5

    ok("topics", "delete", *b, "--topic", "payments")
    assert own_topics(admin.list_topics()) == ["orders"]
    ok("topics", "delete", *b, "--topic", "payments", "--if-exists")
    ok("topics", "create", *b, "--topic", "orders", "--if-not-exists")
    assert len(admin.describe_topics(["orders"])["orders"].partitions) == 5


@pytest.mark.default_broker_config
def test_describe_prints_kafkas_format(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    ok("topics", "create", *b, "--topic", "t", "--partitions", "2", "--config", "retention.ms=60000")
    ok("topics", "create", *b, "--topic", "u", "--replica-assignment", "1")
    topic_id = admin.list_topics()["t"].topic_id
    lines = ok("topics", "describe", *b, "--topic", "t").stdout.splitlines()
    # min.insync.replicas is the cluster-level value eligible leader replicas set (a dynamic default), as Kafka 4.1's.
    assert lines == [
        f"Topic: t\tTopicId: {topic_id}\tPartitionCount: 2\tReplicationFactor: 1\tConfigs: min.insync.replicas=1,"
        "retention.ms=60000",
        "\tTopic: t\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1\tElr: \tLastKnownElr: ",
        "\tTopic: t\tPartition: 1\tLeader: 1\tReplicas: 1\tIsr: 1\tElr: \tLastKnownElr: ",
    ]
    everything = ok("topics", "describe", *b).stdout.splitlines()
    assert everything[:3] == lines
    assert re.fullmatch(r"Topic: u\tTopicId: [\w-]{22}\tPartitionCount: 1\tReplicationFactor: 1\t"
                        r"Configs: min.insync.replicas=1", everything[3])
    assert ok("topics", "describe", *b, "--under-replicated-partitions").stdout == ""


def test_kafka_action_flags(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    assert ok("topics", *b, "--create", "--topic", "flagged", "--partitions", "2").stdout == "Created topic flagged.\n"
    assert own_topics(ok("topics", "--list", *b).stdout) == ["flagged"]
    assert "PartitionCount: 2" in ok("topics", "--describe", *b, "--topic", "flagged").stdout
    ok("configs", *b, "--alter", "--entity-type", "topics", "--entity-name", "flagged", "--add-config", "retention.ms=5000")
    assert "retention.ms=5000" in ok("configs", "--describe", *b, "--entity-type", "topics", "--entity-name", "flagged").stdout
    ok("topics", *b, "--delete", "--topic", "flagged")
    assert admin.list_topics() == {}


# configs ---------------------------------------------------------------------------------------------------


@pytest.mark.default_broker_config
def test_configs_alter_and_describe_topics(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    admin.create_topics([NewTopic("cfg", 1, 1, {"segment.ms": "600000"})])
    changed = ok("configs", "alter", *b, "--entity-type", "topics", "--entity-name", "cfg",
                 "--add-config", "retention.ms=1000,cleanup.policy=[compact,delete]", "--delete-config", "segment.ms")
    assert changed.stdout == "Completed updating config for topic cfg.\n"
    resource = ConfigResource.topic("cfg")
    entries = admin.describe_configs([resource])[resource]
    assert (entries["retention.ms"].value, entries["cleanup.policy"].value) == ("1000", "compact,delete")
    assert entries["segment.ms"].is_default
    described = ok("configs", "describe", *b, "--entity-type", "topics", "--entity-name", "cfg").stdout
    assert described.splitlines() == [
        "Dynamic configs for topic cfg are:",
        ("  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact,delete, "
         "DEFAULT_CONFIG:log.cleanup.policy=delete}"),
        ("  retention.ms=1000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=1000, "
         "DEFAULT_CONFIG:log.retention.ms=604800000}"),
    ]
    everything = ok("configs", "describe", *b, "--topic", "cfg", "--all").stdout.splitlines()
    assert everything[0] == "All configs for topic cfg are:"
    assert "  segment.bytes=1073741824 sensitive=false synonyms={DEFAULT_CONFIG:log.segment.bytes=1073741824}" in everything
    ok("configs", "alter", *b, "--topic", "cfg", "--delete-config", "retention.ms,cleanup.policy")
    assert ok("configs", "describe", *b, "--topic", "cfg").stdout == "Dynamic configs for topic cfg are:\n"


def test_configs_alter_and_describe_brokers(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    changed = ok("configs", "alter", *b, "--entity-type", "brokers", "--entity-name", "1", "--add-config", "log.retention.bytes=4096")
    assert changed.stdout == "Completed updating config for broker 1.\n"
    described = ok("configs", "describe", *b, "--entity-type", "brokers", "--entity-name", "1").stdout.splitlines()
    assert described == ["Dynamic configs for broker 1 are:",
                         "  log.retention.bytes=4096 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.retention.bytes=4096}"]
    everything = ok("configs", "describe", *b, "--broker", "1", "--all").stdout
    assert "  log.dirs=" in everything and "  num.partitions=1 sensitive=false" in everything
    default = ok("configs", "alter", *b, "--entity-type", "brokers", "--entity-default", "--add-config", "log.segment.bytes=1048576")
    assert default.stdout == "Completed updating default config for brokers in the cluster.\n"
    resource = ConfigResource.broker(1)
    assert admin.describe_configs([resource], keys=["log.segment.bytes"])[resource]["log.segment.bytes"].value == "1048576"


# console-producer and console-consumer -------------------------------------------------------------------


def test_console_round_trip_with_keys(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    admin.create_topics([NewTopic("chat", 3)])
    lines = [f"user{i}:message {i}" for i in range(30)] + ["user0:with:colons", "null:keyless"]
    ok("console-producer", *b, "--topic", "chat", "--property", "parse.key=true", "--property", "key.separator=:",
       "--property", "null.marker=null", "--producer-property", "linger.ms=0", input="\n".join(lines) + "\n")
    assert sum(end_offsets(admin, "chat").values()) == len(lines)

    consumed = ok("console-consumer", *b, "--topic", "chat", "--from-beginning", "--max-messages", str(len(lines)),
                  "--property", "print.key=true", "--property", "key.separator=|")
    assert sorted(consumed.stdout.splitlines()) == sorted(
        [f"user{i}|message {i}" for i in range(30)] + ["user0|with:colons", "null|keyless"])
    assert consumed.stderr.splitlines() == [f"Processed a total of {len(lines)} messages"]

    # Records with one key land in one partition, in order.
    detailed = ok("console-consumer", *b, "--topic", "chat", "--from-beginning", "--timeout-ms", "1000",
                  "--property", "print.key=true", "--property", "print.partition=true", "--property", "print.offset=true",
                  "--property", "print.timestamp=true").stdout.splitlines()
    assert len(detailed) == len(lines)
    fields = [line.split("\t") for line in detailed]
    assert all(re.fullmatch(r"CreateTime:\d{13}", f[0]) for f in fields)
    user0 = [(f[1], f[2], f[4]) for f in fields if f[3] == "user0"]
    assert len({p for p, _, _ in user0}) == 1
    assert [v for _, _, v in sorted(user0, key=lambda x: int(x[1].split(":")[1]))] == ["message 0", "with:colons"]


def test_console_consumer_partition_offset_and_latest(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    admin.create_topics([NewTopic("log", 2)])
    ok("console-producer", *b, "--topic", "log", "--sync", "--request-required-acks", "1",
       input="".join(f"line {i}\n" for i in range(10)))
    offsets = end_offsets(admin, "log")
    partition = max(offsets, key=offsets.get)
    from_offset = ok("console-consumer", *b, "--topic", "log", "--partition", str(partition), "--offset", "2",
                     "--timeout-ms", "1000", "--property", "print.offset=true")
    printed = from_offset.stdout.splitlines()
    assert [line.split("\t")[0] for line in printed] == [f"Offset:{o}" for o in range(2, offsets[partition])]
    # From the end (the default) there is nothing yet.
    latest = ok("console-consumer", *b, "--topic", "log", "--timeout-ms", "500")
    assert (latest.stdout, latest.stderr) == ("", "Processed a total of 0 messages\n")
    limited = ok("console-consumer", *b, "--topic", "log", "--from-beginning", "--max-messages", "3")
    assert len(limited.stdout.splitlines()) == 3


def test_console_producer_many_lines_are_all_acknowledged(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    ok("console-producer", *b, "--topic", "bulk", "--compression-codec", "lz4",
       input="".join(f"{i}\n" for i in range(20000)))
    assert sum(end_offsets(admin, "bulk").values()) == 20000


def test_console_consumer_stops_cleanly_on_ctrl_c(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    ok("console-producer", *b, "--topic", "live", input="a\nb\n")
    proc = subprocess.Popen([sys.executable, "-m", "josef", "console-consumer", *b, "--topic", "live", "--from-beginning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert [proc.stdout.readline(), proc.stdout.readline()] == ["a\n", "b\n"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert err == "Processed a total of 2 messages\n"


def test_console_consumer_into_a_closed_pipe(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    ok("console-producer", *b, "--topic", "big", input="".join("x" * 1000 + "\n" for _ in range(1000)))
    proc = subprocess.Popen([sys.executable, "-m", "josef", "console-consumer", *b, "--topic", "big", "--from-beginning",
                             "--timeout-ms", "5000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "x" * 1000 + "\n"
        proc.stdout.close()  # like `| head -1`: a megabyte does not fit in the pipe
        err = proc.stderr.read()
        proc.wait(timeout=TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err and "Error" not in err, err


# perf ------------------------------------------------------------------------------------------------------------

WINDOW = re.compile(r"\d+ records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, [\d.]+ ms max latency\.")
SUMMARY = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), [\d.]+ ms avg latency, "
                     r"[\d.]+ ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th\.")


def test_perf_produce_and_consume(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    produced = ok("perf", "produce", *b, "--topic", "perf", "--num-records", "20000", "--record-size", "100",
                  "--throughput", "-1", "--producer-props", "acks=1", "linger.ms=2", "--compression", "lz4")
    last = produced.stdout.splitlines()[-1]
    match = SUMMARY.fullmatch(last)
    assert match, last
    assert int(match.group(1)) == 20000
    p50, p95, p99, p999 = (int(match.group(i)) for i in range(4, 8))
    assert p50 <= p95 <= p99 <= p999
    assert sum(end_offsets(admin, "perf").values()) == 20000

    consumed = ok("perf", "consume", *b, "--topic", "perf", "--messages", "20000").stdout.splitlines()
    assert consumed[0] == ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
                           "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
    row = consumed[1].split(", ")
    assert len(row) == 10
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}", row[0])
    assert float(row[2]) == pytest.approx(20000 * 100 / 1048576, abs=1e-4)
    assert int(row[4]) == 20000


def test_perf_produce_paces_and_reports_progress(broker):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    produced = ok("perf", "produce", *b, "--topic", "paced", "--num-records", "1500", "--record-size", "10",
                  "--throughput", "3000", "--reporting-interval", "100")
    lines = produced.stdout.splitlines()
    assert len(lines) >= 3 and all(WINDOW.fullmatch(line) for line in lines[:-1]), lines
    rate = float(SUMMARY.fullmatch(lines[-1]).group(2))
    assert rate <= 3000 * 1.05


def test_perf_consume_timeout_still_reports(broker, admin):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    ok("console-producer", *b, "--topic", "few", input="a\nb\nc\n")
    result = ok("perf", "consume", *b, "--topic", "few", "--messages", "10", "--timeout", "500", "--hide-header")
    assert "timeout (500 ms) exceeded" in result.stderr
    [row] = result.stdout.splitlines()
    assert row.split(", ")[4] == "3"


# bad input ------------------------------------------------------------------------------------------------------


BAD_INPUT = [
    (("topics", "create", "--topic", "x", "--partitions", "abc"), r"Invalid value for '--partitions'"),
    (("topics", "create", "--topic", "x", "--partitions", "0"), r"--partitions"),
    (("topics", "create", "--partitions", "1"), r"Missing option '--topic'"),
    (("topics", "create", "--topic", "x", "--no-such-flag"), r"No such option '--no-such-flag'"),
    (("topics", "create", "--topic", "x", "--partitons", "3"), r"Did you mean '--partitions'"),
    (("topics", "create", "--topic", "bad topic"), r"INVALID_TOPIC_EXCEPTION"),
    (("topics", "create", "--topic", "existing"), r"TOPIC_ALREADY_EXISTS .*'existing' already exists"),
    (("topics", "create", "--topic", "x", "--replication-factor", "3"), r"INVALID_REPLICATION_FACTOR"),
    (("topics", "create", "--topic", "x", "--config", "retention.ms"), r"invalid --config 'retention.ms': expected KEY=VALUE"),
    (("topics", "create", "--topic", "x", "--config", "retention.ms=soon"), r"INVALID_CONFIG"),
    (("topics", "create", "--topic", "x", "--replica-assignment", "1:a"), r"invalid --replica-assignment"),
    (("topics", "describe", "--topic", "missing"), r"topic 'missing' does not exist"),
    (("topics", "describe", "--topic", "(["), r"not a valid regular expression"),
    (("topics", "alter", "--topic", "missing", "--partitions", "3"), r"topic 'missing' does not exist"),
    (("topics", "alter", "--topic", "existing", "--partitions", "1"), r"INVALID_PARTITIONS"),
    (("topics", "alter", "--topic", "existing"), r"--partitions is required"),
    (("topics", "delete", "--topic", "missing"), r"topic 'missing' does not exist"),
    (("topics", "no-such-command",), r"No such command 'no-such-command'"),
    (("topics", "--create", "--delete", "--topic", "x"), r"only one of"),
    (("configs", "describe", "--entity-type", "topics", "--entity-name", "missing"), r"UNKNOWN_TOPIC_OR_PARTITION"),
    (("configs", "describe", "--entity-type", "nodes"), r"Invalid value for '--entity-type'"),
    (("configs", "describe", "--entity-name", "existing"), r"At least one entity type must be specified"),
    (("configs", "describe", "--entity-type", "brokers", "--entity-name", "one"), r"must be a broker id"),
    (("configs", "alter", "--topic", "existing", "--add-config", "retention.ms=abc"), r"INVALID_CONFIG"),
    (("configs", "alter", "--topic", "existing", "--add-config", "no.such.config=1"), r"INVALID_CONFIG.*no.such.config"),
    (("configs", "alter", "--topic", "existing", "--add-config", "retention.ms"), r"expected KEY=VALUE"),
    (("configs", "alter", "--topic", "existing", "--delete-config", "no.such.config"), r"invalid config\(s\): no.such.config"),
    (("configs", "alter", "--topic", "existing"), r"--add-config or --delete-config"),
    (("configs", "alter", "--entity-type", "topics", "--add-config", "retention.ms=1"), r"An entity name must be specified for every entity type"),
    (("configs", "alter", "--broker", "1", "--add-config", "log.dirs=/elsewhere"), r"INVALID_CONFIG"),
    (("console-producer", "--topic", "existing", "--producer-property", "no.such=1"), r"unknown producer configuration 'no.such'"),
    (("console-producer", "--topic", "existing", "--producer-property", "acks=2"), r"acks"),
    (("console-producer", "--topic", "existing", "--property", "parse.key=true", "--property", "key.separator=:"),
     r"No key separator found on line number 2: 'no separator here'"),
    (("console-producer", "--topic", "existing", "--property", "parse.key=maybe"), r"parse.key must be true or false"),
    (("console-consumer", "--topic", "missing", "--timeout-ms", "100"), r"topic 'missing' does not exist"),
    (("console-consumer", "--topic", "existing", "--offset", "5"), r"--partition is required"),
    (("console-consumer", "--topic", "existing", "--partition", "0", "--offset", "abc"), r"--offset 'abc' is not valid"),
    (("console-consumer", "--topic", "existing", "--partition", "0", "--offset", "1", "--from-beginning"), r"cannot be combined"),
    (("console-consumer", "--topic", "existing", "--partition", "9"), r"has no partition 9"),
    (("console-consumer", "--topic", "existing", "--property", "print.key=maybe"), r"print.key must be true or false"),
    (("console-consumer", "--topic", "existing", "--max-messages", "-1"), r"--max-messages"),
    (("perf", "produce", "--topic", "x", "--num-records", "10", "--record-size", "1", "--throughput", "0"), r"--throughput"),
    (("perf", "produce", "--topic", "x", "--num-records", "10", "--throughput", "-1"), r"exactly one of --record-size"),
    (("perf", "produce", "--topic", "x", "--num-records", "10", "--record-size", "1", "--throughput", "-1",
      "--producer-props", "acks=1", "no.such.prop=2"), r"no.such.prop"),
    (("perf", "produce", "--topic", "x", "--num-records", "ten", "--record-size", "1", "--throughput", "-1"), r"--num-records"),
    (("perf", "consume", "--topic", "missing", "--messages", "10"), r"topic 'missing' does not exist"),
    (("perf", "consume", "--topic", "existing", "--messages", "0"), r"--messages"),
]


@pytest.fixture(scope="module")
def refusing_broker(tmp_path_factory):
    """One broker with a topic ``existing`` (2 partitions) for every bad-input case: each is refused before it changes
    anything, so they need no broker of their own (starting one per case took most of this module's time)."""
    broker = BrokerProcess(tmp_path_factory.mktemp("refusing-broker")).start()
    try:
        client = Admin(bootstrap_servers=broker.bootstrap_servers)
        try:
            client.create_topics([NewTopic("existing", 2)])
        finally:
            client.close()
        yield broker
    finally:
        broker.kill()
        print("--- broker log ---\n" + "".join(broker.log[-200:]))


@pytest.mark.parametrize("args, pattern", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_error(refusing_broker, args, pattern):
    one_line_error(josef(*args, "--bootstrap-server", refusing_broker.bootstrap_servers,
                         input="key:value\nno separator here\n"), pattern)


UNREACHABLE = [
    ("topics", "list"),
    ("topics", "create", "--topic", "x"),
    ("configs", "describe", "--entity-type", "topics"),
    ("console-producer", "--topic", "x"),
    ("console-consumer", "--topic", "x"),
    ("perf", "produce", "--topic", "x", "--num-records", "1", "--record-size", "1", "--throughput", "-1"),
    ("perf", "consume", "--topic", "x", "--messages", "1"),
]


@pytest.mark.parametrize("args", UNREACHABLE, ids=[" ".join(a) for a in UNREACHABLE])
def test_unreachable_bootstrap_server_is_one_line_error(args):
    port = closed_port()
    one_line_error(josef(*args, "--bootstrap-server", f"127.0.0.1:{port}", input="x\n"), rf"cannot connect to 127.0.0.1:{port}")
    one_line_error(josef(*args, "--bootstrap-server", "no-port-here", input="x\n"), r"'no-port-here' is not host:port")


def test_producing_to_a_missing_topic_without_auto_creation(broker_factory):
    broker = broker_factory(**{"auto.create.topics.enable": "false"})
    one_line_error(josef("console-producer", "--bootstrap-server", broker.bootstrap_servers, "--topic", "absent",
                         input="x\n"), r"topic 'absent' does not exist")
    one_line_error(josef("perf", "produce", "--bootstrap-server", broker.bootstrap_servers, "--topic", "absent",
                         "--num-records", "1", "--record-size", "1", "--throughput", "-1"), r"topic 'absent' does not exist")


def test_properties_files(broker, admin, tmp_path):
    b = ("--bootstrap-server", broker.bootstrap_servers)
    good = tmp_path / "admin.properties"
    good.write_text("# a comment\nclient.id = cli-test\nrequest.timeout.ms: 5000\n")
    ok("topics", "create", *b, "--topic", "props", "--command-config", str(good))
    producer = tmp_path / "producer.properties"
    producer.write_text("linger.ms=0\nacks=1\n")
    ok("console-producer", *b, "--topic", "props", "--producer.config", str(producer), input="a\nb\n")
    assert end_offsets(admin, "props") == {0: 2}
    bad = tmp_path / "bad.properties"
    bad.write_text("no.such.key=1\n")
    one_line_error(josef("topics", "list", *b, "--command-config", str(bad)), r"unknown admin configuration 'no.such.key'")
    one_line_error(josef("console-consumer", *b, "--topic", "props", "--consumer.config", str(bad)),
                   r"unknown consumer configuration 'no.such.key'")
    garbled = tmp_path / "garbled.properties"
    garbled.write_text("just words\n")
    one_line_error(josef("topics", "list", *b, "--command-config", str(garbled)), r"garbled.properties:1: expected key=value")
