"""What security costs: produce and consume throughput over SASL_SSL (and SSL) as a ratio of PLAINTEXT, same run.

    cd /work/main && uv run python benchmarks/security.py                 # 200 MB each way per protocol
    cd /work/main && uv run python benchmarks/security.py --records 50000 --repeat 3 --json /tmp/sec.json

One broker process with a PLAINTEXT, an SSL and a SASL_SSL (PLAIN) listener; confluent-kafka
(librdkafka, with OpenSSL) produces 1 KB records to a fresh topic on each listener and reads
them back, with broker.py's producer and consumer settings, in turn and then again
(``--repeat``), so the protocols share the machine's noise. Figures per protocol: MB/s and
broker CPU seconds per GB, each as a ratio of PLAINTEXT's (the median of the repeats). Kafka
loses 20-40% of its throughput to TLS; josef's figures say where it stands, and the CPU
ratio where its time goes: TLS records are encrypted by OpenSSL inside Python's ssl module,
and fetched record files are read into memory and encrypted instead of going out with
``sendfile``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker import Broker, consume, create_topic, machine, produce  # noqa: E402  (the sibling benchmark's helpers)

from josef.testing.tls import TlsFiles  # noqa: E402

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="bench" password="bench-pw" '
        'user_bench="bench-pw";')
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")


def broker_overrides(tls: TlsFiles) -> dict[str, str]:
    return {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        **tls.broker_properties(),
    }


def client_settings(protocol: str, tls: TlsFiles) -> dict[str, str]:
    settings: dict[str, str] = {}
    if protocol != "PLAINTEXT":
        settings.update({"security.protocol": protocol, "ssl.ca.location": str(tls.ca_pem)})
    if protocol == "SASL_SSL":
        settings.update({"sasl.mechanism": "PLAIN", "sasl.username": "bench", "sasl.password": "bench-pw"})
    return settings


def ports(broker: Broker) -> dict[str, int]:
    found = {}
    for line in broker.log:
        for name, port in re.findall(r"\b(PLAINTEXT|SSL|SASL_SSL)://127\.0\.0\.1:(\d+)", line):
            found[name] = int(port)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="1 KB records per protocol and run")
    parser.add_argument("--repeat", type=int, default=2, help="runs per protocol (the median is reported)")
    parser.add_argument("--json", help="write machine, parameters and figures as JSON")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PROTOCOLS}
    with tempfile.TemporaryDirectory() as scratch:
        tls = TlsFiles.create(Path(scratch))
        with Broker(broker_overrides(tls), start_timeout=60) as broker:
            bound = ports(broker)
            for run in range(args.repeat):
                for protocol in PROTOCOLS:
                    bootstrap = f"127.0.0.1:{bound[protocol]}"
                    topic = f"security-{protocol.lower()}-{run}"
                    create_topic(f"127.0.0.1:{bound['PLAINTEXT']}", topic, 1, timeout=30)
                    extra = client_settings(protocol, tls)
                    produced = produce(bootstrap, topic, args.records, 1024, extra, broker, timeout=600)
                    consumed = consume(bootstrap, topic, args.records, 1024, extra, broker, timeout=600)
                    runs[protocol].append({"produce": produced, "consume": consumed})
                    print(f"run {run + 1} {protocol:10} produce {produced['mb_per_s']:7.1f} MB/s "
                          f"{produced['broker_cpu_s_per_gb']:6.2f} CPU-s/GB   consume {consumed['mb_per_s']:7.1f} MB/s "
                          f"{consumed['broker_cpu_s_per_gb']:6.2f} CPU-s/GB", flush=True)

    def median(protocol: str, phase: str, key: str) -> float:
        return statistics.median(r[phase][key] for r in runs[protocol])

    summary: dict[str, Any] = {}
    print("\nas a ratio of PLAINTEXT (median of the runs):")
    for protocol in PROTOCOLS[1:]:
        summary[protocol] = {}
        for phase in ("produce", "consume"):
            rate = median(protocol, phase, "mb_per_s") / median("PLAINTEXT", phase, "mb_per_s")
            cpu = median(protocol, phase, "broker_cpu_s_per_gb") / median("PLAINTEXT", phase, "broker_cpu_s_per_gb")
            summary[protocol][phase] = {"throughput_ratio": rate, "broker_cpu_per_gb_ratio": cpu}
            print(f"  {protocol:10} {phase:8} throughput {rate:5.2f}x   broker CPU per GB {cpu:5.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "records": args.records,
                                               "repeat": args.repeat, "runs": runs, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
