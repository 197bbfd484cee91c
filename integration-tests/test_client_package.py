"""josef-client installed on its own: a fresh virtual environment with the core and the client only.

What a Spark job or an application gets from ``pip install josef-client``: the
producer, consumer, admin and the tools, through the documented import path
``josef_client``, against a broker running elsewhere (here a ``josef server
start`` process of the test environment) — and none of the broker's storage
or metadata plugins.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BROKER_PLUGINS = ("josef-storage-local", "josef-metadata-kraft", "josef-coordinator-group")

ROUND_TRIP = textwrap.dedent("""
    import sys
    from josef_client import Admin, Consumer, NewTopic, Producer, TopicPartition

    bootstrap = sys.argv[1]
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic("standalone", 2, 1)])
    with Producer(bootstrap_servers=bootstrap) as producer:
        futures = [producer.send("standalone", b"v%d" % i, key=b"k%d" % i) for i in range(100)]
        placed = [f.result(30) for f in futures]
    consumer = Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("standalone", 0), TopicPartition("standalone", 1)])
    seen = {}
    while len(seen) < 100:
        for records in consumer.poll(timeout_ms=1000).values():
            for r in records:
                seen[r.value] = (r.partition, r.offset, r.key)
    consumer.close()
    assert {v: (m.partition, m.offset) for v, m in zip((b"v%d" % i for i in range(100)), placed)} == \\
        {v: p[:2] for v, p in seen.items()}
    assert all(seen[b"v%d" % i][2] == b"k%d" % i for i in range(100))
    print("round trip ok", len(seen))
""")


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding ``./packages/core`` and ``./packages/client`` with their dependencies."""
    venv = tmp_path_factory.mktemp("client-only") / "venv"
    uv = shutil.which("uv")
    packages = [str(ROOT / "packages" / "core"), str(ROOT / "packages" / "client")]
    if uv:
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *packages], check=True)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *packages], check=True)
    return venv


def run_in(venv: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """A command with the venv's ``bin`` first on PATH and nothing of the test environment's Python settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env={**env, **extra_env})


def test_the_client_alone_brings_no_broker_plugin(client_venv):
    listed = run_in(client_venv, str(client_venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze")
    if listed.returncode != 0:  # a uv-made environment has no pip of its own
        listed = run_in(client_venv, shutil.which("uv") or "uv", "pip", "list", "--format=freeze",
                        "--python", str(client_venv / "bin" / "python"))
    names = {line.split("==")[0].lower() for line in listed.stdout.split()}
    assert {"josef", "josef-client"} <= names, listed.stdout
    assert not names & set(BROKER_PLUGINS), listed.stdout
    importable = run_in(client_venv, str(client_venv / "bin" / "python"), "-c",
                        "import josef_storage_local")
    assert importable.returncode != 0 and "ModuleNotFoundError" in importable.stderr


def test_round_trip_through_the_documented_import_path(client_venv, broker):
    result = run_in(client_venv, str(client_venv / "bin" / "python"), "-c", ROUND_TRIP, broker.bootstrap_servers)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "round trip ok 100" in result.stdout


def test_the_tools_join_the_josef_command_through_the_hook(client_venv, broker):
    josef = str(client_venv / "bin" / "josef")
    listed = run_in(client_venv, josef, "--help")
    assert listed.returncode == 0, listed.stderr
    for tool in ("topics", "configs", "console-producer", "console-consumer", "consumer-groups", "perf"):
        assert f"  {tool} " in listed.stdout, listed.stdout
    created = run_in(client_venv, josef, "topics", "create", "--bootstrap-server", broker.bootstrap_servers,
                     "--topic", "from-the-tools", "--partitions", "3")
    assert created.returncode == 0, created.stderr
    described = run_in(client_venv, josef, "topics", "describe", "--bootstrap-server", broker.bootstrap_servers,
                       "--topic", "from-the-tools")
    assert "PartitionCount: 3" in described.stdout, described.stdout
    # Without the client plugin the command has no tools: they come from the hook, not from the core.
    blocked = run_in(client_venv, josef, "--help", JOSEF_BLOCK_PLUGINS="client")
    assert blocked.returncode == 0 and "  topics " not in blocked.stdout and "  server " in blocked.stdout
