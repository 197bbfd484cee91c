"""What the consumer knows of its assigned partitions: positions, pending offset resets, pause state.

This is the one place positions live (Kafka's SubscriptionState). The
fetcher, ``poll()`` and the group membership only read and change them
through :class:`SubscriptionState`. Every change of position not made by
``poll()`` bumps the partition's *generation*: data fetched for an older
generation is void. Changes the fetcher must act on (data to drop, a
partition to fetch or reset) are told to its :class:`SubscriptionListener`.
"""

from __future__ import annotations

from typing import AbstractSet, Iterable, Protocol

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.errors import KafkaError
from josef.protocol.topic_partition import TopicPartition

__all__ = ["NoOffsetForPartitionError", "PartitionState", "SubscriptionListener", "SubscriptionState"]


class NoOffsetForPartitionError(KafkaError):
    """A partition has no position and ``auto.offset.reset`` is ``none``: seek (or commit, for groups) first."""

    def __init__(self, partitions: Iterable[TopicPartition]) -> None:
        self.partitions = frozenset(partitions)
        where = ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(self.partitions))
        super().__init__(ErrorCode.offset_out_of_range, f"no position and auto.offset.reset=none for {where}")


@attrs.define(slots=True)
class PartitionState:
    """What the consumer knows of one assigned partition."""

    #: Next offset poll() returns; None until set by seek or an offset reset.
    position: int | None = None
    #: "earliest"/"latest" while a reset by ListOffsets is wanted, None otherwise.
    reset: str | None = None
    paused: bool = False
    #: Bumped by every change of position not made by poll(): older fetched data is void.
    generation: int = 0
    #: Part of an outstanding Fetch or ListOffsets request.
    busy: bool = False
    #: Not fetched before this time (monotonic), after an error.
    backoff_until: float = 0.0
    #: An error poll() raises until the application seeks (out of range, no offset).
    error: KafkaError | None = None
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1


class SubscriptionListener(Protocol):
    """What the fetcher hears of changes, so that it drops void data and fetches or resets at once."""

    def assignment_changed(self, assigned: AbstractSet[TopicPartition]) -> None:
        """The assignment is now ``assigned``: data of other partitions is void."""

    def seeked(self, tp: TopicPartition) -> None:
        """``tp`` has a new position: its buffered data is void."""

    def resumed(self, partitions: Iterable[TopicPartition]) -> None:
        """These partitions may be fetched and returned again."""

    def wake(self) -> None:
        """A partition may have become fetchable, or wants an offset reset."""


class SubscriptionState:
    """The assigned partitions and their :class:`PartitionState`.

    Where assignments come from: everything below the assignment (positions,
    pause state, the fetcher, poll) only reads :attr:`states`, which
    :meth:`set_assignment` replaces. ``assign()`` is one source of
    assignments; group membership (see :mod:`josef_client.group`) is the
    other: it calls ``set_assignment(partitions, reset=False)`` after each
    rebalance, leaving new partitions without a position (so the fetcher
    neither fetches nor resets them), then seeks each one to its committed
    offset and calls :meth:`request_reset` for those with none, so
    ``auto.offset.reset`` applies only where nothing was committed.
    """

    def __init__(self, reset_strategy: str) -> None:
        #: ``auto.offset.reset``: "earliest", "latest" or "none".
        self.reset_strategy = reset_strategy
        self.states: dict[TopicPartition, PartitionState] = {}
        #: Set once by the consumer, to its fetcher.
        self.listener: SubscriptionListener | None = None

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self.states)

    def state(self, tp: TopicPartition) -> PartitionState:
        state = self.states.get(tp)
        if state is None:
            raise ValueError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return state

    def set_assignment(self, partitions: Iterable[TopicPartition], *, reset: bool) -> None:
        """Replace the assignment; kept partitions keep their state, new ones reset if ``reset``."""
        wanted = set(partitions)
        for tp in set(self.states) - wanted:
            del self.states[tp]
        for tp in wanted - set(self.states):
            self.states[tp] = state = PartitionState()
            if reset:
                self.request_reset(tp, state)
        if self.listener is not None:
            self.listener.assignment_changed(wanted)

    def request_reset(self, tp: TopicPartition, state: PartitionState) -> None:
        """Forget the position; the fetcher looks one up by ``auto.offset.reset`` (or poll raises, for none)."""
        state.position = None
        state.generation += 1
        if self.reset_strategy == "none":
            state.reset = None
            state.error = NoOffsetForPartitionError([tp])
        else:
            state.reset = self.reset_strategy
            state.error = None
        if self.listener is not None:
            self.listener.wake()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next one poll() returns for ``tp``, clearing its reset, error and backoff."""
        state = self.state(tp)
        state.position = offset
        state.generation += 1
        state.reset = None
        state.error = None
        state.backoff_until = 0.0
        if self.listener is not None:
            self.listener.seeked(tp)

    def set_position(self, state: PartitionState, offset: int) -> None:
        """The position an offset reset found."""
        state.position = offset
        state.reset = None
        state.generation += 1
        if self.listener is not None:
            self.listener.wake()

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self.state(tp).paused = True

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        partitions = list(partitions)
        for tp in partitions:
            self.state(tp).paused = False
        if self.listener is not None:
            self.listener.resumed(partitions)

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(tp for tp, state in self.states.items() if state.paused)

    def positions(self, partitions: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """The known positions of ``partitions`` (default: all assigned ones), in partition order."""
        wanted = None if partitions is None else set(partitions)
        return {tp: state.position for tp, state in sorted(self.states.items())
                if state.position is not None and (wanted is None or tp in wanted)}
