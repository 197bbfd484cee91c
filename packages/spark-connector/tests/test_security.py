"""Spark over SASL: kafka.-prefixed security options reach every connection of the sink and the source, as Spark's
Kafka source and sink take them (kafka.security.protocol, kafka.sasl.mechanism, kafka.sasl.jaas.config)."""

import pytest
from conftest import create_topic

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-pw" '
        'user_etl="etl-pw";')
SECURED = pytest.mark.josef_config(**{
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
})


def sasl_options(josef_broker, password: str = "etl-pw") -> dict[str, str]:
    port = next(b.port for b in josef_broker.broker.bound if b.name == "SASL_PLAINTEXT")
    return {"kafka.bootstrap.servers": f"127.0.0.1:{port}", "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.jaas.config":
            f'org.apache.kafka.common.security.plain.PlainLoginModule required username="etl" password="{password}";'}


@SECURED
def test_a_dataframe_written_and_read_back_over_sasl(spark, josef_broker):
    create_topic(josef_broker, "secured-etl", 2)
    rows = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(40)], "key string, value string")
    rows.write.format("josef").mode("append").options(**sasl_options(josef_broker)).option("topic", "secured-etl").save()
    read = spark.read.format("josef").options(**sasl_options(josef_broker)).option("subscribe", "secured-etl").load()
    assert sorted(r.value.decode() for r in read.select("value").collect()) == sorted(f"v{i}" for i in range(40))


@SECURED
def test_a_wrong_password_fails_the_query_with_the_broker_s_message(spark, josef_broker):
    create_topic(josef_broker, "secured-refused", 1)
    read = spark.read.format("josef").options(**sasl_options(josef_broker, "hunter2")).option(
        "subscribe", "secured-refused").load()
    with pytest.raises(Exception, match="Invalid username or password") as refused:
        read.collect()
    assert "hunter2" not in str(refused.value)
