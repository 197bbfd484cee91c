"""Brokers for end-to-end tests: real ``josef server start`` processes on free ports of 127.0.0.1.

Each test starts its own broker and the fixture stops it by its PID. The
backend under test comes from ``JOSEF_TEST_METADATA``/``JOSEF_TEST_STORAGE``,
which the nox matrix sets.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

READY = re.compile(r"ready on PLAINTEXT://([^:,\s]+):(\d+)")
START_TIMEOUT_S = 30


class BrokerProcess:
    """``josef server start`` in a child process; stdout+stderr kept in ``log`` for failure reports."""

    def __init__(self, data_dir: Path, **overrides: str) -> None:
        self.data_dir = data_dir
        self.overrides = {
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "log.dirs": str(data_dir),
            "metadata.quorum": os.environ.get("JOSEF_TEST_METADATA", "kraft"),
            "log.storage": os.environ.get("JOSEF_TEST_STORAGE", "local"),
            **overrides,
        }
        self.proc: subprocess.Popen[str] | None = None
        self.port = -1
        self.log: list[str] = []
        self._logged = threading.Condition()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> BrokerProcess:
        args = [sys.executable, "-m", "josef", "server", "start"]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(self.proc, ready), daemon=True).start()
        if not ready.wait(START_TIMEOUT_S) or self.port < 0:
            self.kill()
            raise RuntimeError("broker did not become ready:\n" + "".join(self.log[-50:]))
        return self

    def _pump(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._logged:
                self.log.append(line)
                self._logged.notify_all()
            match = READY.search(line)
            if match and not ready.is_set():
                self.port = int(match.group(2))
                ready.set()
        ready.set()  # the process ended: let start() fail with the log

    def wait_for_log(self, text: str, timeout: float = 10) -> bool:
        """Whether a line containing ``text`` is logged within ``timeout`` seconds (lines are read by a thread)."""
        with self._logged:
            return self._logged.wait_for(lambda: any(text in line for line in self.log), timeout)

    def stop(self) -> int:
        """SIGTERM and wait: a clean shutdown. Returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self.proc = None
        return code

    def kill(self) -> None:
        """``kill -9``: no shutdown at all."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None

    def restart(self) -> BrokerProcess:
        if self.proc is not None:
            self.stop()
        return self.start()


@pytest.fixture
def broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    started: list[BrokerProcess] = []

    def make(data_dir: Path | None = None, **overrides: str) -> BrokerProcess:
        broker = BrokerProcess(data_dir or tmp_path_factory.mktemp("broker"), **overrides)
        started.append(broker)
        return broker.start()

    yield make
    for broker in started:
        broker.kill()
        # Shown by pytest only when the test fails.
        print(f"--- broker log ({broker.data_dir}) ---\n" + "".join(broker.log[-200:]))


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory()
