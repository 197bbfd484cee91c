"""Raw TCP loopback baseline: how many MB/s this machine moves between two processes over 127.0.0.1.

    cd /work/main && uv run python benchmarks/loopback.py                 # 1 GB in 1 MiB writes
    cd /work/main && uv run python benchmarks/loopback.py --bytes 2e8 --json /tmp/loopback.json

A broker's throughput on its own says little when the machine is shared or slow: the same
figure can be fast on one box and slow on another. This is the ceiling of any broker on this
machine (one TCP connection, no protocol, no disk, no Python per record), measured in the
same run, so omb.py (``--baseline``) can report a broker figure as a fraction of it.

A sender process writes ``--bytes`` bytes in ``--chunk``-byte ``sendall`` calls to a receiver
(this process) that reads them with ``recv_into`` into one reused buffer, so neither side
allocates per write. Timing runs from ``accept`` to end of stream. Used as a module,
``measure()`` returns the same figures as a dict.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import sys
import time
from typing import Any

MB = 1e6


def _send(port: int, total: int, chunk: int) -> None:
    """The sender process: connect, write ``total`` bytes in ``chunk``-byte writes, close."""
    payload = memoryview(os.urandom(chunk))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        left = total
        while left >= chunk:
            sock.sendall(payload)
            left -= chunk
        if left:
            sock.sendall(payload[:left])
        sock.shutdown(socket.SHUT_WR)


def measure(total_bytes: int = 1_000_000_000, chunk: int = 1 << 20, timeout: float = 120.0) -> dict[str, Any]:
    """Move ``total_bytes`` from a child process to this one over TCP on 127.0.0.1; returns MB/s.

    The child is started with the ``spawn`` method so it never inherits a caller's threads
    (librdkafka's, a broker's log pump) through ``fork``. Raises RuntimeError if the byte count
    is short or the sender fails.
    """
    ctx = multiprocessing.get_context("spawn")
    with socket.create_server(("127.0.0.1", 0), backlog=1) as server:
        server.settimeout(timeout)
        port = server.getsockname()[1]
        sender = ctx.Process(target=_send, args=(port, total_bytes, chunk), name="loopback-sender", daemon=True)
        sender.start()
        try:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(timeout)
                t0 = time.perf_counter()
                buf = bytearray(chunk)
                view = memoryview(buf)
                got = 0
                while True:
                    n = conn.recv_into(view)
                    if not n:
                        break
                    got += n
                seconds = time.perf_counter() - t0
        finally:
            sender.join(timeout)
            if sender.is_alive():  # only ours: the Process object we started
                sender.kill()
                sender.join(5)
    if sender.exitcode != 0:
        raise RuntimeError(f"loopback sender exited with code {sender.exitcode}")
    if got != total_bytes:
        raise RuntimeError(f"loopback: received {got:,} of {total_bytes:,} bytes")
    return {"bytes": got, "chunk": chunk, "seconds": seconds, "mb_per_s": got / seconds / MB}


def cpu_model() -> str:
    """The first "model name" of /proc/cpuinfo (broker.machine() needs confluent-kafka; this does not)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=float, default=1e9, help="bytes to move (1e9 = 1 GB)")
    parser.add_argument("--chunk", type=int, default=1 << 20, help="bytes per write and per read buffer")
    parser.add_argument("--repeat", type=int, default=1, help="runs; the median is reported")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    a = parser.parse_args(argv)
    runs = [measure(int(a.bytes), a.chunk) for _ in range(a.repeat)]
    best = sorted(runs, key=lambda r: r["mb_per_s"])[(len(runs) - 1) // 2]
    each = " ".join(f"{r['mb_per_s']:,.0f}" for r in runs)
    print(f"TCP loopback 127.0.0.1, 2 processes: {best['bytes'] / MB:,.0f} MB in {a.chunk:,} B writes, "
          f"{best['seconds']:.3f} s, {best['mb_per_s']:,.0f} MB/s"
          + (f" (median of {a.repeat}: {each})" if a.repeat > 1 else ""))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"machine": {"nproc": os.cpu_count(), "cpu_model": cpu_model(),
                                   "python": platform.python_version(), "kernel": platform.release()},
                       "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "parameters": {"bytes": int(a.bytes), "chunk": a.chunk, "repeat": a.repeat},
                       "result": best, "runs": runs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
