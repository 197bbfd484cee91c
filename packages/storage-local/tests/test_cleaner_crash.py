"""kill -9 at every step of a cleaned segment's swap: the reopened log is consistent and holds every key's latest value."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cleaner_crash_child import CONFIG
from cleaning import read_all
from local_harness import Harness

from josef.testing import ManualClock

CHILD = Path(__file__).with_name("cleaner_crash_child.py")
#: The first swap of the child's second pass renames 32 files: 4 ``.cleaned`` to ``.swap``, 6 old segments
#: of 4 files each to ``.deleted``, 4 ``.swap`` to their final names.
STEPS = ["before-commit", *(f"rename:{n}" for n in (1, 2, 3, 4, 5, 6, 9, 16, 27, 28, 29, 30, 31, 32)), "after-swap"]


@pytest.mark.parametrize("step", STEPS)
def test_kill_during_a_segment_swap_recovers_a_consistent_log(tmp_path: Path, step: str) -> None:
    child = subprocess.run([sys.executable, str(CHILD), str(tmp_path), step], capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    expected = {key.encode(): value.encode() for key, value in json.loads((tmp_path / "expected.json").read_text()).items()}

    directory = tmp_path / "logs" / "orders-0"
    interrupted = [p.name for p in directory.iterdir() if p.name.endswith((".cleaned", ".swap"))]
    assert bool(interrupted) == (step != "after-swap")  # the kill came in the middle of the swap

    harness = Harness(tmp_path / "logs", ManualClock())
    log = harness.open(CONFIG)
    try:
        leftovers = [p.name for p in harness.path().iterdir() if p.name.endswith((".cleaned", ".swap"))]
        assert leftovers == []
        batches, records = read_all(log)  # CRCs checked, offsets increasing
        assert {r.key: r.value for r in records} == expected
        for base, last, _ in batches:  # the indexes find every batch
            found = log.read(last, 1, log.log_end_offset)
            assert int.from_bytes(found[:8], "big") == base
        log.attach_last_stable_offset(lambda: log.log_end_offset)
        log.clean(harness.clock.now)  # and it cleans on
        _, records = read_all(log)
        assert {r.key: r.value for r in records} == expected
        assert sum(r.key != b"filler" for r in records) == len(expected) - 1  # one record per key (the active
        # segment's filler supersedes an older one the cleaner cannot see past)
    finally:
        log.release()
