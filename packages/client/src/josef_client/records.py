"""One partition's part of a fetch response, handed out in pieces by successive polls.

The records themselves are decoded by the core's
:func:`josef.protocol.records.decode_batch`, the consumer's only per-record
loop; this module decides which batches a consumer may see: none below the
fetch position (a batch may start earlier than the offset asked for), no
control batches, and, for ``read_committed``, no batches of aborted
transactions.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterable

from josef.protocol.records import (
    ABORT_MARKER,
    CONTROL_BIT,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TRANSACTIONAL_BIT,
    ConsumerRecord,
    Deserializer,
    control_type,
    decode_batch,
)

__all__ = ["FetchedPartition"]


class FetchedPartition:
    """One partition's records from one fetch response, consumed in pieces by successive polls.

    ``next_offset`` is where the consumer's position goes once everything
    taken so far is returned: past skipped control and aborted batches too,
    so a poll that yields no record still makes progress.

    Aborted transactions (``read_committed``) are dropped as the Java client
    does, per batch: the response lists ``(producer_id, first_offset)`` of
    transactions aborted in the fetched range. Walking the batches in order,
    every listed transaction whose first offset is at or before the batch's
    last offset marks its producer as aborted; a transactional batch of an
    aborted producer is skipped; that producer's ABORT control batch ends the
    aborted run. Control batches themselves are never returned.
    """

    __slots__ = ("topic", "partition", "tp", "fetch_offset", "generation", "next_offset", "high_watermark",
                 "_buf", "_pos", "_records", "_index", "_check_crc", "_key_deserializer",
                 "_value_deserializer", "_aborted", "_aborted_producers", "_read_committed", "_batch_next")

    def __init__(
        self,
        tp: Any,
        buf: bytes,
        fetch_offset: int,
        *,
        generation: int = 0,
        high_watermark: int = -1,
        aborted_transactions: Iterable[tuple[int, int]] | None = None,
        read_committed: bool = False,
        check_crc: bool = True,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
    ) -> None:
        self.tp = tp
        self.topic, self.partition = tp.topic, tp.partition
        self.fetch_offset = fetch_offset
        self.generation = generation
        self.next_offset = fetch_offset
        self.high_watermark = high_watermark
        self._buf = bytes(buf) if not isinstance(buf, bytes) else buf
        self._pos = 0
        self._records: list[ConsumerRecord] = []
        self._index = 0
        self._check_crc = check_crc
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._read_committed = read_committed
        self._aborted: list[tuple[int, int]] = [(first, pid) for pid, first in aborted_transactions or ()]
        heapq.heapify(self._aborted)
        self._aborted_producers: set[int] = set()
        self._batch_next = fetch_offset

    @property
    def exhausted(self) -> bool:
        return self._index >= len(self._records) and not self._next_batch_available()

    def _next_batch_available(self) -> bool:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_SIZE:
            return False
        return pos + LOG_OVERHEAD + HEADER.unpack_from(buf, pos)[1] <= len(buf)

    def take(self, max_records: int) -> list[ConsumerRecord]:
        """Up to ``max_records`` records, in offset order; advances ``next_offset`` past them."""
        out: list[ConsumerRecord] = []
        while len(out) < max_records:
            if self._index < len(self._records):
                chunk = self._records[self._index : self._index + max_records - len(out)]
                self._index += len(chunk)
                out.extend(chunk)
                self.next_offset = chunk[-1].offset + 1
                if self._index < len(self._records):
                    break
                # The batch is done: skip past its end even if its last records were compacted away.
                self.next_offset = max(self.next_offset, self._batch_next)
                continue
            try:
                if not self._load_next_batch():
                    break
            except Exception:
                if out:  # return what decoded; the next take() meets the bad batch again
                    break
                raise
        return out

    def _load_next_batch(self) -> bool:
        """Decode the next batch that has anything to return; False when the buffer is used up."""
        buf = self._buf
        while True:
            pos = self._pos
            if len(buf) - pos < HEADER_SIZE:
                return False
            (base_offset, length, _epoch, _magic, _crc, attributes, last_delta, _bts, _mts,
             pid, _pe, _bs, _count) = HEADER.unpack_from(buf, pos)
            end = pos + LOG_OVERHEAD + length
            if end > len(buf):
                return False  # a partial batch at the end of the response: fetched again next time
            last_offset = base_offset + last_delta
            if last_offset < self.next_offset:
                self._pos = end
                continue  # wholly before the position (the broker returns whole batches)
            if self._read_committed and pid >= 0:
                aborted = self._aborted
                while aborted and aborted[0][0] <= last_offset:
                    self._aborted_producers.add(heapq.heappop(aborted)[1])
                if attributes & CONTROL_BIT:
                    if control_type(buf, pos) == ABORT_MARKER:
                        self._aborted_producers.discard(pid)
                elif attributes & TRANSACTIONAL_BIT and pid in self._aborted_producers:
                    self._pos = end
                    self.next_offset = last_offset + 1
                    continue
            if attributes & CONTROL_BIT:
                self._pos = end
                self.next_offset = last_offset + 1
                continue
            records = decode_batch(buf, pos, self.topic, self.partition, self.next_offset, self._check_crc,
                                   self._key_deserializer, self._value_deserializer)
            self._pos = end  # only now: a batch that fails to decode is met again by the next take()
            self._batch_next = last_offset + 1
            if not records:
                self.next_offset = last_offset + 1
                continue
            self._records, self._index = records, 0
            return True

