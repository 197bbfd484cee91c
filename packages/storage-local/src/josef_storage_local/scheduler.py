"""The local storage's background thread: Kafka's LogManager tasks on one daemon thread.

Kafka's LogManager runs its housekeeping on a scheduler: the flush of a
segment soon after it rolls (``UnifiedLog.roll`` schedules
``flushUptoOffsetExclusive``), ``kafka-log-flusher`` every
``log.flush.scheduler.interval.ms`` (logs past ``flush.ms``),
``kafka-recovery-point-checkpoint`` and
``kafka-log-start-offset-checkpoint``, and the removal of ``.deleted``
segment files after ``file.delete.delay.ms``. All of it blocks on the disk,
so none of it may run on the broker's event loop; one thread is enough,
since the tasks are few and fsync is the disk's time, not the CPU's.

Time is the storage's clock (milliseconds), so a test with a manual clock
can move it and run what is due with :meth:`Scheduler.run_due`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

Task = Callable[[], None]

#: Kafka's "never" for intervals (Long.MaxValue); such a periodic task is not scheduled at all.
NEVER_MS = 2**63 - 1


class Scheduler:
    """Tasks due at a time of ``clock``, run in order on one thread once :meth:`start` is called.

    A failing task is logged and the others go on (as KafkaScheduler does);
    a periodic task is rescheduled after each run.
    """

    def __init__(self, clock: Callable[[], int], name: str = "josef-log-scheduler") -> None:
        self._clock = clock
        self._name = name
        self._wakeup = threading.Condition()
        self._queue: list[tuple[int, int, Task, bool]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: Items waiting for their batch's task (:meth:`add_to_batch`), by batch name.
        self._batches: dict[str, list[Any]] = {}

    @property
    def running(self) -> bool:
        return self._thread is not None

    def schedule(self, task: Task, delay_ms: int = 0, *, run_at_close: bool = False) -> None:
        """Run ``task`` once ``delay_ms`` from now; ``run_at_close`` tasks still pending at :meth:`close` run then."""
        with self._wakeup:
            heapq.heappush(self._queue, (self._clock() + delay_ms, next(self._order), task, run_at_close))
            self._wakeup.notify()

    def add_to_batch(self, name: str, item: Any, run: Callable[[list[Any]], None]) -> None:
        """Have ``run(items)`` called soon with ``item`` and every other item added to batch ``name`` before it runs.

        One task (and one wake-up of the thread) for thousands of items added
        in a burst, as when a broker gains the leadership of thousands of
        partitions at once. ``run`` also runs at :meth:`close`.
        """
        with self._wakeup:
            waiting = self._batches.get(name)
            if waiting is not None:
                waiting.append(item)
                return
            self._batches[name] = [item]

        def task() -> None:
            with self._wakeup:
                items = self._batches.pop(name, [])
            run(items)

        self.schedule(task, run_at_close=True)

    def schedule_periodically(self, task: Task, interval_ms: int) -> None:
        """Run ``task`` every ``interval_ms``, the first time one interval from now."""
        if interval_ms >= NEVER_MS:
            return

        def periodic() -> None:
            try:
                task()
            finally:
                self.schedule(periodic, interval_ms)

        self.schedule(periodic, interval_ms)

    def delete_later(self, paths: Sequence[Path], delay_ms: int) -> None:
        """Remove ``paths`` after ``delay_ms`` (``file.delete.delay.ms``), or at :meth:`close` if that comes first."""
        self.schedule(lambda: remove_files(paths), delay_ms, run_at_close=True)

    def _pop_due(self) -> Task | None:
        with self._wakeup:
            if self._queue and self._queue[0][0] <= self._clock():
                return heapq.heappop(self._queue)[2]
        return None

    def run_due(self) -> int:
        """Run every task due by now in the calling thread; returns how many ran (tests with a manual clock)."""
        count = 0
        while (task := self._pop_due()) is not None:
            _run(task)
            count += 1
        return count

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run_forever, name=self._name, daemon=True)
            self._thread.start()

    def _run_forever(self) -> None:
        while True:
            with self._wakeup:
                while not self._stopping and (
                    not self._queue or self._queue[0][0] > self._clock()
                ):
                    timeout = (self._queue[0][0] - self._clock()) / 1000 if self._queue else None
                    self._wakeup.wait(timeout)
                if self._stopping:
                    return
            self.run_due()

    def close(self) -> None:
        """Stop the thread (after the task it is running), then run the pending ``run_at_close`` tasks and drop the rest."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._wakeup:
            left = [task for _, _, task, run_at_close in sorted(self._queue) if run_at_close]
            self._queue.clear()
        for task in left:
            _run(task)


def _run(task: Task) -> None:
    try:
        task()
    except Exception:
        logger.exception("background storage task failed")


def remove_files(paths: Sequence[Path]) -> None:
    """Unlink ``paths``; one already gone (its log was deleted or moved meanwhile) is not an error."""
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
