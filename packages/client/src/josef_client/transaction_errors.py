"""What a transactional producer raises, sorted by what the application can do next, as Kafka's Java client sorts them.

- :class:`TransactionAbortableError`: the current transaction cannot commit
  (a batch failed, a partition or the group's offsets could not be added, a
  consumer generation was stale); call ``abort_transaction()`` and carry on
  with a new transaction.
- :class:`FatalProducerError` (and its :class:`ProducerFencedError`): the
  producer can do nothing more but be closed; a fenced one was replaced by a
  newer producer with the same ``transactional.id``.
- :class:`TransactionStateError`: a method called in the wrong state
  (``commit_transaction()`` without ``begin_transaction()``); nothing was sent.
- :class:`TransactionAbortedError`: what the records of an aborted
  transaction that were never sent fail with.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from josef.protocol.errors import KafkaError

__all__ = ["FatalProducerError", "ProducerFencedError", "TransactionAbortableError", "TransactionAbortedError",
           "TransactionStateError"]


class FatalProducerError(KafkaError):
    """The producer cannot go on (authorization, a broker without transactions, a coordinator in an impossible state): close it."""


class ProducerFencedError(FatalProducerError):
    """Another producer with the same ``transactional.id`` called ``init_transactions()`` after this one."""

    def __init__(self, message: str = "") -> None:
        super().__init__(ErrorCode.producer_fenced, message or "a newer producer with the same transactional.id fenced this one")


class TransactionAbortableError(KafkaError):
    """The transaction must be aborted with ``abort_transaction()``; the producer may then begin another.

    ``code`` is the error that made it so (``__cause__`` holds it when it was raised elsewhere).
    """


class TransactionAbortedError(KafkaError):
    """A record that was still waiting to be sent when its transaction was aborted."""

    def __init__(self, message: str = "") -> None:
        super().__init__(ErrorCode.transaction_abortable, message or "the transaction was aborted before the record was sent")


class TransactionStateError(KafkaError):
    """A transactional method called in a state that does not allow it; the producer's state is unchanged."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.invalid_txn_state, message)
