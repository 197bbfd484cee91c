"""Log cleaner benchmark: MB/s of dirty log one cleaner thread compacts, as Kafka's cleaner log line counts it.

    cd /work/main && uv run python benchmarks/cleaner.py                  # 4 scenarios of 200 MB, a few minutes
    cd /work/main && uv run python benchmarks/cleaner.py --mb 20 --only 100B,1KB-lz4

Each scenario writes a compacted log of ``--mb`` MB through storage-local
(``LocalLogStorage``, no broker): batches of keyed records whose keys are drawn
from ``--keys-ratio`` x the record count (so most records are superseded), rolled
into 128 MB segments, then cleans it once with ``LocalLog.clean`` in this thread,
with Kafka's default offset map (``log.cleaner.dedupe.buffer.size`` 128 MiB for
one thread). The figure is Kafka's "MB of log processed": bytes of dirty log
read by the cleaning pass over the whole pass's time (offset map included).
The result is checked: one record per key, each key's latest value.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import attrs

from josef.node.broker_config import CORE_KEYS
from josef.config import Config, ConfigDef
from josef.log import LogConfig
from josef.protocol.codecs import Compression
from josef.protocol.record_scan import batch_body, scan_records
from josef.protocol.records import build_batch, iter_batches, validate_and_assign
from josef.protocol.topic_partition import TopicPartition
from josef_storage_local.storage import LocalLogStorage

MB = 1_000_000
SCENARIOS = {
    "100B": (100, Compression.NONE),
    "1KB": (1024, Compression.NONE),
    "1KB-lz4": (1024, Compression.LZ4),
    "1KB-zstd": (1024, Compression.ZSTD),
}


def fill(log, size: int, codec: Compression, total: int, keys_ratio: float, seed: int) -> dict[bytes, bytes]:
    """Append about ``total`` bytes of records of ``size`` bytes (key included); returns the latest value per key."""
    rnd = random.Random(seed)
    per_batch = max(1, 64 * 1024 // size)
    records = max(1, total // size)
    key_space = max(1, int(records * keys_ratio))
    latest: dict[bytes, bytes] = {}
    written = 0
    while written < records:
        batch = []
        for _ in range(per_batch):
            key = b"key-%012d" % rnd.randrange(key_space)
            value = b"%012d" % written + rnd.randbytes(size - len(key) - 12)
            batch.append((key, value, 1_700_000_000_000 + written))
            latest[key] = value
            written += 1
        buf = bytearray(build_batch(batch, compression=codec))
        log.append(buf, validate_and_assign(buf, log.log_end_offset, 0, 1 << 30))
    log.update_config(attrs.evolve(log.config, segment_ms=0))  # the next append rolls: the rest is cleanable
    roll = bytearray(build_batch([(b"roll", b"", 1_800_000_000_000)]))
    log.append(roll, validate_and_assign(roll, log.log_end_offset, 0, 1 << 30))
    return latest


def check(log, latest: dict[bytes, bytes]) -> None:
    """One record per key below the active segment, each the key's latest value."""
    seen: dict[bytes, bytes] = {}
    offset = log.log_start_offset
    end = log.segment_base_offsets[-1]
    while offset < end:
        data = log.read(offset, 1 << 30, end)
        for position, header in iter_batches(data):
            body, start, stop, count = batch_body(data, position)
            for record in scan_records(body, start, stop, count):
                assert record[2] not in seen, f"key {record[2]!r} twice"
                seen[record[2]] = body[record[4] : record[5]]
            offset = header.last_offset + 1
    assert seen.keys() == latest.keys(), "keys lost or kept"
    for key, raw in seen.items():
        assert raw.endswith(latest[key] + b"\x00"), f"key {key!r} has a stale value"  # then no headers


def run(name: str, args: argparse.Namespace) -> dict:
    size, codec = SCENARIOS[name]
    root = Path(tempfile.mkdtemp(prefix="josef-cleaner-bench-"))
    try:
        storage = LocalLogStorage(Config.build(ConfigDef(CORE_KEYS), {"log.dir": str(root)}))
        config = LogConfig(segment_bytes=128 * 1024 * 1024, cleanup_policy=("compact",), retention_ms=-1)
        log = storage.open(TopicPartition("bench", 0), config)
        log.attach_last_stable_offset(lambda: log.log_end_offset)
        started = time.monotonic()
        latest = fill(log, size, codec, args.mb * MB, args.keys_ratio, seed=1)
        dirty = log.size_bytes
        assert len(log.segment_base_offsets) >= 2
        print(f"{name}: wrote {dirty / MB:.0f} MB in {time.monotonic() - started:.1f} s, cleaning...",
              file=sys.stderr, flush=True)
        stats = log.clean(int(time.time() * 1000))
        check(log, latest)
        storage.close()
        return {
            "scenario": name, "record_bytes": size, "codec": codec.name.lower(), "dirty_mb": dirty / MB,
            "read_mb": stats.bytes_read / MB, "written_mb": stats.bytes_written / MB,
            "records_read": stats.records_read, "records_written": stats.records_written,
            "seconds": stats.elapsed_s, "mb_per_s": stats.bytes_read / MB / stats.elapsed_s,
            "records_per_s": stats.records_read / stats.elapsed_s,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="MB of dirty log per scenario (default 200)")
    parser.add_argument("--keys-ratio", type=float, default=0.1, help="distinct keys / records (default 0.1)")
    parser.add_argument("--only", default=",".join(SCENARIOS), help=f"any of {','.join(SCENARIOS)}")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    results = [run(name, args) for name in args.only.split(",")]
    print(f"{'scenario':<10} {'dirty MB':>9} {'seconds':>8} {'MB/s':>7} {'records/s':>11} {'kept':>7}")
    for r in results:
        print(f"{r['scenario']:<10} {r['dirty_mb']:>9.0f} {r['seconds']:>8.1f} {r['mb_per_s']:>7.1f} "
              f"{r['records_per_s']:>11,.0f} {r['records_written'] / max(r['records_read'], 1):>7.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
