"""What the broker's Prometheus metrics cost per request, and how long a /metrics scrape of 10,000 partitions takes.

    cd /work/main && git worktree add --detach /work/wt-baseline f75d12b~1     # once: the broker before metrics
    cd /work/main && uv run python benchmarks/metrics_cost.py                    # every part, about 3.5 minutes
    cd /work/main && uv run python benchmarks/metrics_cost.py --only cost --repeat 9 --json /tmp/metrics-cost.json
    cd /work/main && uv run python benchmarks/metrics_cost.py --only scrape --partitions 5000

**cost**: "metrics off" is the broker of ``--baseline-commit`` (f75d12b~1, the commit before the
metrics), started from the git worktree ``--baseline-tree`` with ``PYTHONPATH`` naming that tree's
``packages/*/src`` (PYTHONPATH comes before the venv's editable-install paths, so the child imports
the old code; the child prints which file ``josef`` came from and whether ``josef.metrics`` exists,
and the run stops if that is not what the side expects). "metrics on" is the broker of this tree as
it is (working tree included), with its HTTP listener on a free port. Plugins installed in the venv
that the old tree does not have (their entry points would load new code into the old broker) are
blocked with ``JOSEF_BLOCK_PLUGINS`` on both sides, looked up again at every start
(``--keep-new-plugins``: not on the "on" side).

Each of ``--repeat`` repeats starts a fresh broker of each side (both up at once, off first in odd
repeats, on first in even ones). Then:

* request_cost.py's raw-socket loops: a Produce v9 (acks=1, one 1 KB batch per partition) to 1 and
  to 100 partitions, and a Fetch v11 of 100 caught-up partitions (an empty topic, ``max_wait`` 0),
  each with 1 and 8 requests in flight. Each loop's requests are split in ``--blocks`` blocks that
  alternate between the two brokers (off on on off ... or on off off on ...), so that both sides
  see the same moments of a shared machine; the figure is the broker's CPU per request over its
  blocks, read to the nanosecond from the broker's process CPU clock (broker.py's /proc ticks are
  10 ms);
* broker.py's produce of ``--records`` x 100 B records with librdkafka (its settings: acks=1,
  linger.ms=5, 1 MB batches, no compression) to a topic of 100 partitions, once on each broker:
  records/s (the client shares the 2 cores and is often the limit) and broker CPU s/GB.

Per scenario: the median, min and max of each side over the repeats, on/off of the medians, and
on/off within each repeat (median, min, max). Cost is on/off - 1 for CPU and off/on - 1 for
records/s; the issue's goal is under 3%.

**scrape**: one broker of this tree with an HTTP listener (``http.listeners=http://127.0.0.1:0``)
and topics of ``--topic-partitions`` (1,000) partitions, replication factor 1, created one by one
with broker.py's ``load_partitions`` (CreateTopics, leaders waited for, one 100 B record produced to
every partition) up to ``--partitions`` (10,000). After each topic, ``--step-scrapes`` scrapes (the
fastest is kept: a full garbage collection every few scrapes is not linear in the partitions); at the end
``--scrapes`` back-to-back scrapes (wall time from GET to the last byte, response bytes, samples,
the broker's CPU per scrape) while loop_stall.py's probe sends ApiVersions every 5 ms, against a
phase of the same probe without scrapes. The broker's own log says, per scrape, how long
``NodeMetrics.families()`` took on the event loop and the rendering in the worker thread (the
child sets ``josef.metrics``'s logger to DEBUG).

A broker keeps three files open per partition (the active segment's .log, .index, .timeindex). The
script raises its soft ``RLIMIT_NOFILE`` to the hard limit (the broker inherits it); if the hard
limit is too low for ``--partitions`` (20,000 allows about 6,300) it stops at the largest whole
number of topics that fits, says so, and extrapolates the figures to ``--partitions`` with a
least-squares line through the per-topic steps.

**breakdown** (where a scrape's time goes): a ``BrokerThread`` in this process with the scrape's
partitions; each collector's ``collect()`` on the event loop, ``NodeMetrics.families()`` with the
garbage collector on and off and the collections it triggers, the rendering
(``josef.metrics._exposition``, what the worker thread runs), cProfile of both, and the fix
proposed for the per-partition gauges, timed: a flat snapshot of their numbers on the loop and
their text written from it.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import http.client
import importlib.metadata
import json
import io
import os
import pstats
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker import (  # noqa: E402  (the sibling benchmarks' helpers)
    Broker, BenchmarkError, Meter, cpu_seconds_of, create_topic, load_partitions, machine, produce, progress,
)
from loop_stall import Probe, summary  # noqa: E402
from request_cost import fetch_frame, loop, produce_frame  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HTTP_LINE = re.compile(r"HTTP listener \(metrics, health\) on http://[^:\s]+:(\d+)")
IMPORT_LINE = re.compile(r"metrics_cost: josef imported from (\S+); josef\.metrics (present|absent)")
SCRAPE_LINE = re.compile(r"scrape: (\d+) families read in ([0-9.]+) ms, written in ([0-9.]+) ms")
#: Files a broker keeps open per partition (the active segment's log, offset index and time index).
FILES_PER_PARTITION = 3
#: Descriptors left for everything else (sockets, the metadata log, internal topics).
FILES_RESERVED = 1200

#: The child: say which josef it imports, then run ``python -m josef`` exactly as broker.py does.
CHILD = """\
import importlib.util, logging, runpy, sys
import josef
metrics = importlib.util.find_spec("josef.metrics") is not None
print(f"metrics_cost: josef imported from {josef.__file__}; josef.metrics {'present' if metrics else 'absent'}",
      flush=True)
if DEBUG_METRICS:
    logging.getLogger("josef.metrics").setLevel(logging.DEBUG)
runpy.run_module("josef", run_name="__main__", alter_sys=True)
"""


class TreeBroker(Broker):
    """broker.py's ``Broker``, started from a given source tree (``PYTHONPATH``) and checked to have imported it."""

    def __init__(self, overrides: dict[str, str], start_timeout: float, *, side: str, src_paths: list[str],
                 block: list[str], expect_metrics: bool, debug_metrics: bool = False,
                 keep_log: str | None = None) -> None:
        super().__init__(overrides, start_timeout, keep_log)
        self.side, self.src_paths, self.block = side, src_paths, block
        self.expect_metrics, self.debug_metrics = expect_metrics, debug_metrics
        self.josef_file = ""
        self.http_port = -1

    @property
    def command(self) -> list[str]:
        args = super().command  # [python, -m, josef, server, start, --override, ...]
        return [args[0], "-c", CHILD.replace("DEBUG_METRICS", repr(self.debug_metrics)), *args[3:]]

    def start(self) -> None:
        saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "JOSEF_BLOCK_PLUGINS")}
        if self.src_paths:
            os.environ["PYTHONPATH"] = os.pathsep.join(self.src_paths)
        else:
            os.environ.pop("PYTHONPATH", None)
        if self.block:
            os.environ["JOSEF_BLOCK_PLUGINS"] = ",".join(self.block)
        else:
            os.environ.pop("JOSEF_BLOCK_PLUGINS", None)
        try:
            super().start()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        lines = list(self.log)
        found = next((m for m in map(IMPORT_LINE.search, lines) if m), None)
        if found is None:
            raise BenchmarkError(f"{self.side} broker: no import line in its log\n{self.tail(20)}")
        self.josef_file = found.group(1)
        # josef must come from the tree on PYTHONPATH (under its packages/), or else from this tree
        root = Path(self.src_paths[0]).parent.parent if self.src_paths else REPO / "packages"
        if (found.group(2) == "present") != self.expect_metrics or not self.josef_file.startswith(f"{root}/"):
            raise BenchmarkError(f"{self.side} broker imported the wrong josef (wanted one under {root}, "
                                 f"josef.metrics {'present' if self.expect_metrics else 'absent'}): {found.group(0)}")
        http = next((m for m in map(HTTP_LINE.search, lines) if m), None)
        self.http_port = int(http.group(1)) if http else -1


# --------------------------------------------------------------------------- the two trees


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def source_dirs(tree: Path) -> list[str]:
    return sorted(str(p) for p in (tree / "packages").glob("*/src") if p.is_dir())


def plugins_missing_from(src_paths: list[str]) -> list[str]:
    """Entry points of the venv whose top-level module the tree does not have (they would load this tree's code)."""
    missing = []
    for ep in importlib.metadata.entry_points(group="josef"):
        top = ep.value.split(":")[0].split(".")[0]
        if not any((Path(src) / top).is_dir() for src in src_paths):
            missing.append(ep.name)
    return sorted(missing)


def baseline_tree(args: argparse.Namespace) -> dict[str, Any]:
    tree = Path(args.baseline_tree)
    wanted = git("rev-parse", f"{args.baseline_commit}^{{commit}}")
    if not (tree / ".git").exists():
        raise SystemExit(f"no baseline worktree at {tree}: create it with\n"
                         f"  git -C {REPO} worktree add --detach {tree} {args.baseline_commit}")
    head = git("rev-parse", "HEAD", cwd=tree)
    if head != wanted:
        raise SystemExit(f"{tree} is at {head[:12]}, not {args.baseline_commit} ({wanted[:12]}): move it with\n"
                         f"  git -C {tree} checkout --detach {wanted}")
    if git("status", "--porcelain", "--untracked-files=no", cwd=tree):
        raise SystemExit(f"{tree} has local changes: the baseline must be the commit as it is")
    src = source_dirs(tree)
    return {"tree": str(tree), "commit": wanted, "src_paths": src, "blocked_plugins": plugins_missing_from(src)}


# --------------------------------------------------------------------------- cost


#: (name, kind, partitions, depth, requests at --scale 1): sized for 1-2 broker CPU seconds each on the 2-core box.
LOOPS = [
    ("produce 1 partition, depth 1", "produce", 1, 1, 15_000),
    ("produce 1 partition, depth 8", "produce", 1, 8, 25_000),
    ("produce 100 partitions, depth 1", "produce", 100, 1, 1_000),
    ("produce 100 partitions, depth 8", "produce", 100, 8, 1_000),
    ("fetch 100 caught-up partitions, depth 1", "fetch", 100, 1, 6_000),
    ("fetch 100 caught-up partitions, depth 8", "fetch", 100, 8, 8_000),
]
THROUGHPUT = "librdkafka produce 100 B, 100 partitions"


def precise_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds of these processes to the nanosecond, exited threads included: each one's process CPU clock
    (``clock_gettime`` of the clock id ``clock_getcpuclockid(pid)`` gives, (~pid << 3) | CPUCLOCK_SCHED); broker.py's
    tick-based ``cpu_seconds_of`` (10 ms steps) where the kernel refuses it."""
    total = 0.0
    for pid in pids:
        try:
            total += time.clock_gettime((~pid << 3) | 2)
        except OSError:
            total += cpu_seconds_of([pid])
    return total


def one_repeat(i: int, sides: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """A fresh broker of each side, both up at once; every scenario alternates between them in ``--blocks`` blocks
    (off on, on off, ...) so that both see the same moments of a noisy machine. One run (figures) per side."""
    order = ("off", "on") if i % 2 == 0 else ("on", "off")
    with contextlib.ExitStack() as stack:
        brokers: dict[str, TreeBroker] = {}
        blocked: dict[str, list[str]] = {}
        for side in order:
            spec = sides[side]
            # looked up at every start: other people install packages into the venv while this runs
            blocked[side] = [] if side == "on" and args.keep_new_plugins else plugins_missing_from(spec["baseline_src"])
            brokers[side] = stack.enter_context(TreeBroker(
                spec["overrides"], args.start_timeout, side=side, src_paths=spec["src_paths"], block=blocked[side],
                expect_metrics=spec["metrics"], keep_log=args.broker_log))
        pids = {side: broker.pids() for side, broker in brokers.items()}
        for broker in brokers.values():
            for kind, n in sorted({(kind, n) for _, kind, n, _, _ in LOOPS}):
                create_topic(broker.bootstrap, f"mc-{kind}-{n}", n, 60)
            create_topic(broker.bootstrap, "mc-small", 100, 60)
        figures: dict[str, dict[str, dict[str, float]]] = {side: {} for side in order}
        for name, kind, n, depth, requests in LOOPS:
            topic = f"mc-{kind}-{n}"
            frame = fetch_frame(topic, n, 0) if kind == "fetch" else produce_frame(topic, n)
            count = max(200, round(requests * args.scale / args.blocks))
            sums = {side: {"cpu": 0.0, "seconds": 0.0, "requests": 0, "other": 0.0} for side in order}
            for block in range(args.blocks):
                for side in order if block % 2 == 0 else order[::-1]:
                    meter = Meter(brokers[side])
                    cpu = precise_cpu_seconds(pids[side])  # loop()'s own figure is in 10 ms ticks
                    row = loop(brokers[side].bootstrap, pids[side], frame, count, depth)
                    cpu = precise_cpu_seconds(pids[side]) - cpu  # (+ the connection and loop()'s first round trip)
                    other = meter.stop(1)["other_cpu_util"]
                    acc = sums[side]
                    acc["cpu"] += cpu
                    acc["seconds"] += count / row["requests_per_s"]
                    acc["requests"] += count
                    acc["other"] = max(acc["other"], other)
            for side, acc in sums.items():
                figures[side][name] = {"broker_us_per_request": acc["cpu"] / acc["requests"] * 1e6,
                                       "requests_per_s": acc["requests"] / acc["seconds"],
                                       "requests": acc["requests"], "other_cpu_util": acc["other"]}
        for side in order:
            cpu = precise_cpu_seconds(pids[side])
            res = produce(brokers[side].bootstrap, "mc-small", args.records, 100, {}, brokers[side], 300)
            cpu = precise_cpu_seconds(pids[side]) - cpu  # (+ the producer's connection and metadata requests)
            figures[side][THROUGHPUT] = {key: res[key] for key in (
                "records_per_s", "other_cpu_util", "client_cpu_util", "broker_cpu_util", "seconds")}
            figures[side][THROUGHPUT]["broker_cpu_s_per_gb"] = cpu / (args.records * 100 / 1e9)
            figures[side][THROUGHPUT]["broker_cpu_s_per_gb_ticks"] = res["broker_cpu_s_per_gb"]
        return [{"side": side, "repeat": i, "josef": brokers[side].josef_file, "blocked_plugins": blocked[side],
                 "figures": figures[side]} for side in ("off", "on")]


#: (scenario, figure key, label, higher is better)
MEASURES = [(name, "broker_us_per_request", "broker us/request", False) for name, *_ in LOOPS] + [
    (THROUGHPUT, "records_per_s", "records/s", True),
    (THROUGHPUT, "broker_cpu_s_per_gb", "broker CPU s/GB", False),
]


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    off = [r for r in runs if r["side"] == "off"]
    on = [r for r in runs if r["side"] == "on"]
    rows = []
    for scenario, key, label, higher in MEASURES:
        a = [r["figures"][scenario][key] for r in off]
        b = [r["figures"][scenario][key] for r in on]
        pairs = [y["figures"][scenario][key] / x["figures"][scenario][key] for x, y in zip(off, on)]
        ratio = statistics.median(b) / statistics.median(a)
        rows.append({
            "scenario": scenario, "figure": key, "label": label, "higher_is_better": higher,
            "off": {"median": statistics.median(a), "min": min(a), "max": max(a), "runs": a},
            "on": {"median": statistics.median(b), "min": min(b), "max": max(b), "runs": b},
            "ratio_on_off": ratio,
            "paired_ratios": {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs), "runs": pairs},
            "cost": (1 / ratio - 1) if higher else (ratio - 1),
            "other_cpu_util_max": max(r["figures"][scenario]["other_cpu_util"] for r in runs),
        })
    return rows


def cost(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    sides = {"off": {"src_paths": base["src_paths"], "baseline_src": base["src_paths"], "metrics": False,
                     "overrides": {}},
             # the HTTP listener is part of "on" (the quick start serves it on 9644; port 0 here, as tests do)
             "on": {"src_paths": [], "baseline_src": base["src_paths"], "metrics": True,
                    "overrides": {"http.listeners": "http://127.0.0.1:0"}}}
    progress(f"cost: metrics off = {base['commit'][:12]} from {base['tree']}, metrics on = {REPO} as it is; "
             f"plugins the baseline lacks, blocked on {'the off side' if args.keep_new_plugins else 'both sides'}: "
             f"{', '.join(base['blocked_plugins']) or 'none'} (looked up again at every start)")
    runs: list[dict[str, Any]] = []
    for i in range(args.repeat):
        progress(f"cost: repeat {i + 1}/{args.repeat}: a fresh broker of each side, "
                 f"{'off' if i % 2 == 0 else 'on'} first")
        for run in one_repeat(i, sides, args):
            runs.append(run)
            f = run["figures"]
            progress(f"  {run['side']:3}: " + ", ".join(f"{kind} {n}p d{depth} {f[name]['broker_us_per_request']:.1f} us"
                                                      for name, kind, n, depth, _ in LOOPS)
                     + f"; librdkafka {f[THROUGHPUT]['records_per_s']:,.0f} rec/s, "
                       f"{f[THROUGHPUT]['broker_cpu_s_per_gb']:.2f} s/GB ({run['josef']}; "
                       f"blocked: {', '.join(run['blocked_plugins']) or 'none'})")
    return {"baseline": base, "runs": runs, "summary": summarise(runs)}


def number(value: float, key: str) -> str:
    return f"{value:,.0f}" if key == "records_per_s" else f"{value:,.2f}" if key == "broker_cpu_s_per_gb" \
        else f"{value:,.1f}"


def print_cost(result: dict[str, Any], args: argparse.Namespace) -> None:
    base = result["baseline"]
    print(f"\nmetrics cost: off = {base['commit'][:12]} (worktree {base['tree']}), on = {REPO} (working tree); "
          f"{args.repeat} repeats, each with a fresh broker of each side; each loop alternates {args.blocks} blocks "
          f"between them (ABBA), the librdkafka produce runs once on each (alternating which first)")
    headers = ("scenario", "figure", "off median [min-max]", "on median [min-max]", "on/off", "pairs on/off [min-max]",
               "cost")
    rows = []
    for r in result["summary"]:
        k = r["figure"]
        rows.append((r["scenario"], r["label"],
                     f"{number(r['off']['median'], k)} [{number(r['off']['min'], k)}-{number(r['off']['max'], k)}]",
                     f"{number(r['on']['median'], k)} [{number(r['on']['min'], k)}-{number(r['on']['max'], k)}]",
                     f"{r['ratio_on_off']:.3f}",
                     f"{r['paired_ratios']['median']:.3f} [{r['paired_ratios']['min']:.3f}-"
                     f"{r['paired_ratios']['max']:.3f}]",
                     f"{r['cost']:+.1%}"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    print(fmt.format(*headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(fmt.format(*row))
    noisy = sorted({r["scenario"] for r in result["summary"] if r["other_cpu_util_max"] > 0.15})
    if noisy:
        print(f"WARNING: other processes used over 15% of a core during some runs of: {'; '.join(noisy)}")
    print("cost: on/off - 1 of CPU per request or per GB, off/on - 1 of records/s (goal: under 3%)")


# --------------------------------------------------------------------------- scrape


def raise_file_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Scraper:
    """GET /metrics over one kept-alive connection, as Prometheus scrapes."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def scrape(self) -> dict[str, Any]:
        start = time.perf_counter()
        self.conn.request("GET", "/metrics")
        response = self.conn.getresponse()
        body = response.read()
        seconds = time.perf_counter() - start
        if response.status != 200:
            raise BenchmarkError(f"/metrics answered {response.status}: {body[:200]!r}")
        samples = sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))
        return {"seconds": seconds, "bytes": len(body), "samples": samples}

    def close(self) -> None:
        self.conn.close()


def broker_breakdown(broker: Broker, since: int) -> list[tuple[int, float, float]]:
    """(families, ms reading them on the loop, ms writing them in the thread) of the scrapes logged after line ``since``."""
    lines = list(broker.all_log or [])[since:]
    return [(int(m.group(1)), float(m.group(2)), float(m.group(3))) for m in map(SCRAPE_LINE.search, lines) if m]


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept."""
    if len(xs) < 2:
        return (ys[0] / xs[0] if xs and xs[0] else 0.0), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return slope, my - slope * mx


def scrape_partitions(args: argparse.Namespace) -> tuple[int, int, int]:
    """(partitions the open-file limit allows, of --partitions in whole topics; those wanted; the limit)."""
    per_topic = args.topic_partitions
    limit = raise_file_limit()
    fits = max(0, (limit - FILES_RESERVED) // FILES_PER_PARTITION) // per_topic * per_topic
    wanted = args.partitions // per_topic * per_topic
    return min(wanted, fits), wanted, limit


def scrape(args: argparse.Namespace) -> dict[str, Any]:
    per_topic = args.topic_partitions
    target, wanted, limit = scrape_partitions(args)
    result: dict[str, Any] = {"requested_partitions": args.partitions, "topic_partitions": per_topic,
                              "nofile_limit": limit, "partitions": target, "steps": []}
    if target < wanted:
        progress(f"scrape: RLIMIT_NOFILE is {limit} (hard limit; {FILES_PER_PARTITION} files per partition): "
                 f"{target:,} partitions fit, not {wanted:,}; the figures are extrapolated to {wanted:,}")
    if target == 0:
        raise SystemExit("scrape: not even one topic fits under RLIMIT_NOFILE")
    # the scrape broker's whole log is kept in memory (all_log) for its DEBUG lines; keep_log names a file
    keep = args.broker_log or os.devnull
    with TreeBroker({"http.listeners": "http://127.0.0.1:0"}, args.start_timeout, side="scrape", src_paths=[],
                    block=[], expect_metrics=True, debug_metrics=True, keep_log=keep) as broker:
        if broker.http_port < 0:
            raise BenchmarkError("the broker logged no HTTP listener\n" + broker.tail(20))
        scraper = Scraper(broker.http_port)
        first = scraper.scrape()
        result["empty"] = first
        made = 0
        create_s = 0.0
        while made < target:
            name = f"mc-scrape-{made // per_topic}"
            seconds, _ = load_partitions(broker, [name], per_topic, {})
            create_s += seconds
            made += per_topic
            since = len(broker.all_log or [])
            shots = [scraper.scrape() for _ in range(args.step_scrapes)]
            time.sleep(0.2)  # the log pump catches up with the broker's DEBUG lines
            inside = broker_breakdown(broker, since)
            # the fastest of each: a full garbage collection (every few scrapes) is not linear in the partitions
            step = {"partitions": made, "scrape_s": min(s["seconds"] for s in shots),
                    "scrape_median_s": statistics.median(s["seconds"] for s in shots),
                    "bytes": shots[-1]["bytes"], "samples": shots[-1]["samples"],
                    "families_ms": min(b[1] for b in inside) if inside else None,
                    "render_ms": min(b[2] for b in inside) if inside else None,
                    "rss_mb": broker.rss_bytes() / 1e6}
            result["steps"].append(step)
            progress(f"scrape: {made:,} partitions: {step['scrape_s'] * 1000:.0f} ms, {step['bytes']:,} B, "
                     f"{step['samples']:,} samples; in the broker: families {step['families_ms']} ms on the loop, "
                     f"rendering {step['render_ms']} ms in a thread")
        result["create_and_produce_s"] = create_s

        probe = Probe(broker.bootstrap, args.interval_ms / 1000)
        probe.start()
        time.sleep(args.idle_seconds)
        probe.mark("scrapes")
        since = len(broker.all_log or [])
        cpu = broker.cpu_seconds()
        shots = [scraper.scrape() for _ in range(args.scrapes)]
        cpu = broker.cpu_seconds() - cpu
        probe.mark("after")
        time.sleep(0.5)
        probe.stop()
        scraper.close()
        inside = broker_breakdown(broker, since)
    seconds = sorted(s["seconds"] for s in shots)
    result["final"] = {
        "scrapes": len(shots), "median_s": statistics.median(seconds), "max_s": seconds[-1], "min_s": seconds[0],
        "bytes": shots[-1]["bytes"], "samples": shots[-1]["samples"], "broker_cpu_s_per_scrape": cpu / len(shots),
        "families_ms": {"median": statistics.median(b[1] for b in inside), "max": max(b[1] for b in inside)}
        if inside else None,
        "render_ms": {"median": statistics.median(b[2] for b in inside), "max": max(b[2] for b in inside)}
        if inside else None,
        "families": inside[-1][0] if inside else None,
    }
    result["probe"] = {phase: summary(samples) for phase, samples in probe.samples.items() if samples}
    steps = result["steps"]
    if target < wanted and len(steps) >= 2:
        xs = [s["partitions"] for s in steps]
        result["extrapolated"] = {"partitions": wanted, "method": "least squares over the per-topic steps"}
        for key in ("scrape_s", "bytes", "samples", "families_ms", "render_ms"):
            ys = [s[key] for s in steps if s[key] is not None]
            if len(ys) == len(xs):
                slope, intercept = fit(xs, ys)
                result["extrapolated"][key] = intercept + slope * wanted
                result["extrapolated"][f"{key}_per_1000_partitions"] = slope * 1000
    return result


def print_scrape(r: dict[str, Any], args: argparse.Namespace) -> None:
    f = r["final"]
    print(f"\n/metrics scrape: {r['partitions']:,} partitions ({r['partitions'] // r['topic_partitions']} topics x "
          f"{r['topic_partitions']:,}, RF 1, one 100 B record each), {f['scrapes']} scrapes back to back")
    if r["partitions"] < r["requested_partitions"]:
        print(f"  (RLIMIT_NOFILE {r['nofile_limit']}: {r['partitions']:,} partitions fit, not "
              f"{r['requested_partitions']:,}; see the extrapolation below)")
    print(f"  scrape wall time: median {f['median_s'] * 1000:.0f} ms, min {f['min_s'] * 1000:.0f}, "
          f"max {f['max_s'] * 1000:.0f} ms; {f['bytes']:,} bytes, {f['samples']:,} samples, "
          f"{f['families']} families; broker CPU {f['broker_cpu_s_per_scrape'] * 1000:.0f} ms per scrape")
    if f["families_ms"]:
        print(f"  in the broker: NodeMetrics.families() on the event loop median {f['families_ms']['median']:.1f} ms "
              f"(max {f['families_ms']['max']:.1f}), rendering in the worker thread median "
              f"{f['render_ms']['median']:.1f} ms (max {f['render_ms']['max']:.1f})")
    print(f"  event loop (ApiVersions every {args.interval_ms:g} ms, round trip):")
    for phase, s in r["probe"].items():
        print(f"    {phase:8} {s['probes']:5} probes  p50 {s['p50_ms']:6.1f} ms  p99 {s['p99_ms']:6.1f} ms  "
              f"max {s['max_ms']:6.1f} ms")
    print(f"  by size (the fastest of {args.step_scrapes} scrapes after each topic; median in brackets):")
    for s in r["steps"]:
        print(f"    {s['partitions']:6,} partitions  {s['scrape_s'] * 1000:6.0f} ms ({s['scrape_median_s'] * 1000:.0f})  "
              f"{s['bytes']:>11,} B  "
              f"{s['samples']:>7,} samples  families {s['families_ms']} ms, rendering {s['render_ms']} ms")
    e = r.get("extrapolated")
    if e:
        print(f"  extrapolated to {e['partitions']:,} partitions ({e['method']}, fastest scrapes): scrape "
              f"{e['scrape_s'] * 1000:.0f} ms (+{e['scrape_s_per_1000_partitions'] * 1000:.1f} ms per 1,000), "
              f"{e['bytes']:,.0f} B, {e['samples']:,.0f} samples"
              + (f", families {e['families_ms']:.1f} ms on the loop, rendering {e['render_ms']:.1f} ms"
                 if "families_ms" in e and "render_ms" in e else ""))


# --------------------------------------------------------------------------- breakdown (in process)


class InProcessBroker:
    """What broker.py's ``load_partitions`` asks of a broker, for a ``BrokerThread`` in this process."""

    def __init__(self, thread: Any) -> None:
        self.thread = thread

    @property
    def bootstrap(self) -> str:
        return self.thread.bootstrap_servers

    def tail(self, lines: int = 60) -> str:
        return "(in-process broker: its log is this process's)"

    def rss_bytes(self) -> int:
        return 0


def timings(values: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(values) * 1000, "max_ms": max(values) * 1000}


def top(profile: cProfile.Profile, lines: int) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(lines)
    text = out.getvalue()
    return text[text.find("   ncalls"):].rstrip()


def breakdown(args: argparse.Namespace, partitions: int) -> dict[str, Any]:
    """Where a scrape's time goes: a ``BrokerThread`` with the scrape's partitions, timed piece by piece."""
    from josef.metrics import _exposition  # what the broker's worker thread runs
    from josef.node.runner import BrokerThread

    per_topic = args.topic_partitions
    scratch = tempfile.mkdtemp(prefix="josef-metrics-cost-")
    result: dict[str, Any] = {"partitions": partitions}
    try:
        with BrokerThread({"log.dirs": scratch, "listeners": "PLAINTEXT://127.0.0.1:0"}) as thread:
            broker = thread.broker
            for i in range(partitions // per_topic):
                load_partitions(InProcessBroker(thread), [f"mc-breakdown-{i}"], per_topic, {})
            metrics = broker.metrics
            rounds = args.breakdown_rounds

            def per_collector() -> list[tuple[str, float, int]]:
                rows = []
                for collector in metrics._collectors:  # noqa: SLF001 (one collector at a time)
                    start = time.perf_counter()
                    families = list(collector.collect())
                    rows.append((type(collector).__name__, time.perf_counter() - start,
                                 sum(len(f.samples) for f in families)))
                return rows

            runs = [thread.call(per_collector) for _ in range(5)]
            result["collectors"] = sorted(
                ({"collector": name, "median_ms": statistics.median(r[i][1] for r in runs) * 1000,
                  "samples": runs[-1][i][2]} for i, (name, _, _) in enumerate(runs[0])),
                key=lambda row: -row["median_ms"])

            def families_timed(collect_garbage: bool) -> float:
                was = gc.isenabled()
                gc.enable() if collect_garbage else gc.disable()
                try:
                    start = time.perf_counter()
                    metrics.families()
                    return time.perf_counter() - start
                finally:
                    gc.enable() if was else gc.disable()

            pauses: list[tuple[int, float]] = []
            begun: dict[str, float] = {}

            def on_gc(phase: str, info: dict[str, int]) -> None:
                if phase == "start":
                    begun["t"] = time.perf_counter()
                elif "t" in begun:
                    pauses.append((info["generation"], time.perf_counter() - begun.pop("t")))

            gc.callbacks.append(on_gc)
            try:
                with_gc = [thread.call(families_timed, True) for _ in range(rounds)]
            finally:
                gc.callbacks.remove(on_gc)
            without_gc = [thread.call(families_timed, False) for _ in range(rounds)]
            full = [p for g, p in pauses if g == 2]
            result["families"] = {"gc_on": timings(with_gc), "gc_off": timings(without_gc), "calls": rounds,
                                  "gen2_collections": len(full), "gen2_ms": [p * 1000 for p in full],
                                  "gen0_1_collections": len(pauses) - len(full),
                                  "gen0_1_total_ms": sum(p for g, p in pauses if g < 2) * 1000}

            def full_collection() -> tuple[float, int]:
                start = time.perf_counter()
                gc.collect()
                return time.perf_counter() - start, len(gc.get_objects())

            seconds, objects = thread.call(full_collection)
            result["gc_collect_ms"], result["gc_tracked_objects"] = seconds * 1000, objects

            families = thread.call(metrics.families)
            rendered: list[float] = []
            for collect_garbage in (True, False):
                gc.enable() if collect_garbage else gc.disable()
                try:
                    rendered.clear()
                    for _ in range(rounds):
                        start = time.perf_counter()
                        _exposition(metrics.registry, families)
                        rendered.append(time.perf_counter() - start)
                finally:
                    gc.enable()
                result["render_gc_on" if collect_garbage else "render_gc_off"] = timings(rendered)
            start = time.perf_counter()
            list(metrics.registry.collect())
            result["process_platform_ms"] = (time.perf_counter() - start) * 1000

            # The fix proposed for the per-partition gauges, timed: on the loop only a flat snapshot of the numbers
            # _replicas reads (and its leadership counts); the text written from it in the worker thread.
            replicas, node_id = broker.replicas, broker.node_id

            def snapshot() -> list[tuple[str, int, int, int, int, int]]:
                rows = []
                led = under = 0
                for tp, partition in list(replicas.partitions.items()):
                    log = partition.log
                    rows.append((tp.topic, tp.partition, log.size_bytes, log.log_start_offset, log.log_end_offset,
                                 log.segment_count))
                    if partition.leader_id == node_id:
                        led += 1
                        if len(partition.isr) < len(partition.replicas) or \
                                len(partition.isr) < partition.topic_config.get("min.insync.replicas", 1):
                            under += 1
                return rows

            def snapshot_timed() -> float:
                start = time.perf_counter()
                snapshot()
                return time.perf_counter() - start

            pauses.clear()
            gc.callbacks.append(on_gc)
            try:
                taken = [thread.call(snapshot_timed) for _ in range(rounds)]
            finally:
                gc.callbacks.remove(on_gc)
            rows = thread.call(snapshot)
            names = ("kafka_log_log_size", "kafka_log_log_logstartoffset", "kafka_log_log_logendoffset",
                     "kafka_log_log_numlogsegments")

            def write() -> bytes:
                out = []
                for column, name in enumerate(names, 2):
                    out.append(f"# HELP {name} ...\n# TYPE {name} gauge\n")
                    out.extend(f'{name}{{topic="{r[0]}",partition="{r[1]}"}} {r[column]}\n' for r in rows)
                return "".join(out).encode()

            written = []
            for _ in range(rounds):
                start = time.perf_counter()
                write()
                written.append(time.perf_counter() - start)
            result["fix"] = {"snapshot": timings(taken), "gen2_collections": sum(1 for g, _ in pauses if g == 2),
                             "write": timings(written), "lines": len(rows) * len(names)}

            profile = cProfile.Profile()

            def profiled() -> None:
                profile.enable()
                metrics.families()
                profile.disable()

            for _ in range(3):
                thread.call(profiled)
            result["families_profile"] = top(profile, args.profile_lines)
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(3):
                _exposition(metrics.registry, families)
            profile.disable()
            result["render_profile"] = top(profile, args.profile_lines)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


def print_breakdown(r: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nwhere a scrape's time goes: {r['partitions']:,} partitions, a BrokerThread in this process")
    for row in r["collectors"]:
        print(f"  {row['collector']:32} collect() {row['median_ms']:7.2f} ms  {row['samples']:6,} samples")
    f = r["families"]
    print(f"  NodeMetrics.families() on the loop, {f['calls']} calls: median {f['gc_on']['median_ms']:.1f} ms, "
          f"max {f['gc_on']['max_ms']:.1f} ms; with the garbage collector off: median {f['gc_off']['median_ms']:.1f}, "
          f"max {f['gc_off']['max_ms']:.1f} ms")
    print(f"  garbage collections during them: {f['gen2_collections']} full (generation 2: "
          f"{', '.join(f'{p:.0f}' for p in f['gen2_ms']) or '-'} ms), {f['gen0_1_collections']} young "
          f"({f['gen0_1_total_ms']:.1f} ms in all); gc.collect() now: {r['gc_collect_ms']:.0f} ms over "
          f"{r['gc_tracked_objects']:,} tracked objects")
    print(f"  rendering (josef.metrics._exposition, the worker thread's part): median "
          f"{r['render_gc_on']['median_ms']:.1f} ms, max {r['render_gc_on']['max_ms']:.1f} ms (collector off: "
          f"{r['render_gc_off']['median_ms']:.1f} / {r['render_gc_off']['max_ms']:.1f}), of which the process and "
          f"platform collectors {r['process_platform_ms']:.1f} ms")
    x = r["fix"]
    print(f"  the fix, timed: a flat snapshot of the per-partition numbers on the loop median "
          f"{x['snapshot']['median_ms']:.1f} ms, max {x['snapshot']['max_ms']:.1f} ms ({x['gen2_collections']} full "
          f"collections in {f['calls']} calls); writing their {x['lines']:,} lines as text median "
          f"{x['write']['median_ms']:.1f} ms")
    if args.profile_lines:
        print("  cProfile of NodeMetrics.families() (3 calls, by own time):")
        print("\n".join("    " + line for line in r["families_profile"].splitlines()))
        print("  cProfile of the rendering (3 calls, by own time):")
        print("\n".join("    " + line for line in r["render_profile"].splitlines()))


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--only", default="cost,scrape,breakdown",
                        help="comma-separated: cost, scrape, breakdown (where a scrape's time goes, in process)")
    parser.add_argument("--repeat", type=int, default=5, help="cost: runs of each side (ABBA order)")
    parser.add_argument("--scale", type=float, default=1.0, help="cost: multiplies the requests of every loop")
    parser.add_argument("--blocks", type=int, default=4,
                        help="cost: each loop's requests are split in this many blocks, alternating between the sides")
    parser.add_argument("--records", type=int, default=2_000_000, help="cost: 100 B records of the librdkafka produce")
    parser.add_argument("--baseline-commit", default="f75d12b~1", help="cost: the broker before metrics")
    parser.add_argument("--baseline-tree", default="/work/wt-baseline", help="cost: a git worktree at that commit")
    parser.add_argument("--keep-new-plugins", action="store_true",
                        help="cost: do not block, on the 'on' side, the plugins the baseline tree does not have")
    parser.add_argument("--partitions", type=int, default=10_000, help="scrape: partitions of the broker")
    parser.add_argument("--topic-partitions", type=int, default=1000, help="scrape: partitions per topic")
    parser.add_argument("--scrapes", type=int, default=30, help="scrape: back-to-back scrapes measured at the end")
    parser.add_argument("--step-scrapes", type=int, default=5, help="scrape: scrapes after each topic created")
    parser.add_argument("--interval-ms", type=float, default=5, help="scrape: time between event-loop probes")
    parser.add_argument("--idle-seconds", type=float, default=3, help="scrape: probe phase without scrapes")
    parser.add_argument("--breakdown-rounds", type=int, default=20, help="breakdown: calls timed of each piece")
    parser.add_argument("--profile-lines", type=int, default=10, help="breakdown: cProfile lines shown (0: none)")
    parser.add_argument("--start-timeout", type=float, default=60, help="seconds for a broker to be ready")
    parser.add_argument("--broker-log", metavar="FILE", help="append every broker's output to FILE")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    args = parser.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    if not only or only - {"cost", "scrape", "breakdown"}:
        parser.error("--only takes cost, scrape, breakdown")
    info = machine()
    progress(f"machine: {info['nproc']} x {info['cpu_model']}, {info['mem_gib']} GiB, Python {info['python']}")
    out: dict[str, Any] = {"machine": info, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "parameters": vars(args),
                           "tree": {"head": git("rev-parse", "HEAD"),
                                    "modified_files": len(git("status", "--porcelain").splitlines())}}
    failed = None
    try:
        if "cost" in only:
            out["cost"] = cost(args, baseline_tree(args))
        if "scrape" in only:
            out["scrape"] = scrape(args)
        if "breakdown" in only:
            partitions = out["scrape"]["partitions"] if "scrape" in out else scrape_partitions(args)[0]
            out["breakdown"] = breakdown(args, partitions)
    except BenchmarkError as exc:
        failed = str(exc)
    print(f"\nmachine: {info['nproc']} x {info['cpu_model']}, {info['mem_gib']} GiB, Linux {info['kernel']}, "
          f"{info['implementation']} {info['python']}, confluent-kafka {info['confluent_kafka']} "
          f"(librdkafka {info['librdkafka']}); this tree at {out['tree']['head'][:12]} with "
          f"{out['tree']['modified_files']} modified/untracked files")
    if "cost" in out:
        print_cost(out["cost"], args)
    if "scrape" in out:
        print_scrape(out["scrape"], args)
    if "breakdown" in out:
        print_breakdown(out["breakdown"], args)
    out["failed"] = failed
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    if failed:
        print(f"BENCHMARK FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
