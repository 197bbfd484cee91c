"""Run by test_cleaner_crash.py in a subprocess: fill and clean a log, then SIGKILL itself at one step of a segment swap.

``python cleaner_crash_child.py ROOT STEP`` where STEP is ``before-commit``
(the ``.cleaned`` files are written), ``rename:N`` (just before the N-th
file rename of the first swap: ``.cleaned`` to ``.swap``, old segments to
``.deleted``, ``.swap`` to final) or ``after-swap``. The latest value of
each key is written to ``ROOT/expected.json`` first. Exits 3 if the step
never came.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from cleaning import append_keyed  # noqa: E402
from local_harness import Harness  # noqa: E402
from josef.testing import ManualClock  # noqa: E402

from josef.log import LogConfig  # noqa: E402
from josef_storage_local.log import LocalLog  # noqa: E402

CONFIG = LogConfig(segment_bytes=8 * 1024, index_interval_bytes=512, cleanup_policy=("compact",), retention_ms=-1)


def fill(log: LocalLog, clock: ManualClock, batches: int, keys: int, tag: bytes, latest: dict[str, str]) -> None:
    n = 0
    for _ in range(batches):
        records = []
        for _ in range(10):
            key, value = b"key-%03d" % (n % keys), tag + b"-%06d-" % n + b"." * 40
            records.append((key, value, clock.now))
            latest[key.decode()] = value.decode()
            n += 1
        append_keyed(log, records)
        clock.now += 1
    append_keyed(log, [(b"filler", b"x" * CONFIG.segment_bytes, clock.now)])  # rolls: the rest is cleanable
    latest["filler"] = "x" * CONFIG.segment_bytes


def main(root: Path, step: str) -> None:
    clock = ManualClock()
    harness = Harness(root / "logs", clock)
    log = harness.open(CONFIG)
    log.attach_last_stable_offset(lambda: log.log_end_offset)
    latest: dict[str, str] = {}
    fill(log, clock, 60, 100, b"first", latest)
    log.clean(clock.now)
    fill(log, clock, 30, 50, b"second", latest)
    log.flush()
    (root / "expected.json").write_text(json.dumps(latest))

    real_rename = os.rename
    renames = 0
    swapping = False

    def rename(source: str | os.PathLike, target: str | os.PathLike) -> None:
        nonlocal renames
        if swapping:
            renames += 1
            if step == f"rename:{renames}":
                os.kill(os.getpid(), signal.SIGKILL)
        real_rename(source, target)

    real_swap_in = LocalLog._swap_in

    def swap_in(self: LocalLog, *args: object) -> bool:
        nonlocal swapping
        swapping = True
        if step == "before-commit":
            os.kill(os.getpid(), signal.SIGKILL)
        done = real_swap_in(self, *args)
        if step == "after-swap":
            os.kill(os.getpid(), signal.SIGKILL)
        swapping = False
        print(f"renames: {renames}", flush=True)
        return done

    os.rename = rename  # type: ignore[assignment]
    LocalLog._swap_in = swap_in  # type: ignore[method-assign]
    log.clean(clock.now)
    sys.exit(3)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
