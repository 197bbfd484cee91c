"""Step 1: produce JSON events into a josef topic, some of them late and out of order.

Each event is ``{"user", "action", "amount", "event_time"}`` with
``event_time`` in ISO 8601 (UTC). Event times advance evenly over
``--minutes``, but about one event in ten arrives late: its time is less
than 91 seconds behind the newest event sent before it. That stays within the
streaming job's watermark delay, so the job counts every event however the
stream is cut into micro-batches, and its results can be checked exactly.

The same ``--seed`` and ``--start`` give the same events. Without
``--start`` the events end now. To continue the stream in a later run, start
it where this one ended (printed at the end): events more than two minutes
behind the newest one the streaming job has seen would be dropped as late.

    python examples/spark_pipeline/produce_events.py --count 300
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import time
from typing import Any

from pipeline import DEFAULT_BOOTSTRAP, EVENTS_TOPIC, WATERMARK_DELAY_SECONDS

from josef_client import Producer

ACTIONS = ("view", "click", "add_to_cart", "purchase")
ACTION_WEIGHTS = (50, 30, 12, 8)
USERS = 20
LATE_SHARE = 0.1
#: How far behind the newest event a late event may be: must stay below the watermark delay.
MAX_LATENESS_MS = 90_000
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

assert MAX_LATENESS_MS + 1_000 < WATERMARK_DELAY_SECONDS * 1000, "late events would be dropped"


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC, exactly (no float rounding)."""
    return (EPOCH + dt.timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_time(text: str) -> int:
    """An ISO 8601 time (UTC unless it says otherwise) as milliseconds since the epoch."""
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return (moment - EPOCH) // dt.timedelta(milliseconds=1)


def generate_events(count: int, seed: int, start_ms: int, minutes: float) -> list[dict[str, Any]]:
    """``count`` events in the order they are sent, their times spread over ``minutes`` from ``start_ms``.

    Event ``i`` has the slot ``start + i * step``: an on-time event happens
    less than a second after its slot, a late one 10 to 90 seconds before it.
    So no event is 91 seconds or more behind any event sent before it.
    """
    rng = random.Random(seed)
    step = minutes * 60_000 / count
    events = []
    for i in range(count):
        slot = start_ms + int(i * step)
        if rng.random() < LATE_SHARE:
            at = slot - rng.randint(10_000, MAX_LATENESS_MS)
        else:
            at = slot + rng.randrange(1_000)
        events.append({
            "user": f"user-{rng.randrange(USERS):02d}",
            "action": rng.choices(ACTIONS, ACTION_WEIGHTS)[0],
            "amount": round(rng.uniform(1, 200), 2),
            "event_time": iso(at),
        })
    return events


def produce(bootstrap_servers: str, topic: str, events: list[dict[str, Any]]) -> None:
    """Send the events keyed by user, and return once the broker acknowledged all of them."""
    with Producer({"bootstrap.servers": bootstrap_servers}) as producer:
        futures = [producer.send(topic, json.dumps(event).encode(), key=event["user"].encode())
                   for event in events]
        producer.flush()
        for future in futures:
            future.result()  # raises the first delivery error


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    parser.add_argument("--topic", default=EVENTS_TOPIC)
    parser.add_argument("--count", type=int, default=300, help="number of events (default 300)")
    parser.add_argument("--seed", type=int, default=42, help="the same seed gives the same events")
    parser.add_argument("--minutes", type=float, default=10, help="event times span this long (default 10)")
    parser.add_argument("--start", type=iso_time, default=None,
                        help="ISO 8601 time of the first event, e.g. 2026-01-05T09:00:00Z "
                             "(default: --minutes before now)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    if args.start is None:
        args.start = time.time_ns() // 1_000_000 - int(args.minutes * 60_000)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    events = generate_events(args.count, args.seed, args.start, args.minutes)
    produce(args.bootstrap_server, args.topic, events)
    late = sum(1 for before, event in zip(events, events[1:]) if event["event_time"] < before["event_time"])
    newest = max(e["event_time"] for e in events)
    print(f"produced {len(events)} events to {args.topic} ({late} out of order), "
          f"event times {min(e['event_time'] for e in events)} .. {newest}; to continue: --start {newest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
