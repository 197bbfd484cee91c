"""Helpers shared by the transaction coordinator's request handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError
from josef_coordinator_txn.metadata import TxnError

if TYPE_CHECKING:
    from josef.server.dispatch import RequestContext
    from josef_coordinator_txn.coordinator import TransactionCoordinator
    from josef_coordinator_txn.shard import TransactionShard

T = TypeVar("T")
#: FindCoordinator's key type of transactional ids, by which the runtime finds this coordinator.
TRANSACTION_KEY_TYPE = 1


def coordinator_of(ctx: RequestContext) -> TransactionCoordinator:
    return ctx.services.coordinators.by_key_type(TRANSACTION_KEY_TYPE)  # type: ignore[return-value]


def ms(value: Any) -> int:
    """A kio duration (timedelta) or a plain number of milliseconds, as milliseconds."""
    total_seconds = getattr(value, "total_seconds", None)
    return int(round(total_seconds() * 1000)) if total_seconds is not None else int(value)


def older_fenced(error: ErrorCode, version: int, first_version: int) -> ErrorCode:
    """PRODUCER_FENCED as INVALID_PRODUCER_EPOCH for versions before ``first_version`` (KIP-588), as Kafka does.

    Older clients do not know PRODUCER_FENCED; INVALID_PRODUCER_EPOCH makes
    them handle the fencing the same way.
    """
    return ErrorCode.invalid_producer_epoch if error == ErrorCode.producer_fenced and version < first_version else error


async def on_shard(ctx: RequestContext, transactional_id: str, operation: Callable[[TransactionShard], Awaitable[T]]
                   ) -> tuple[ErrorCode, T | None]:
    """Run ``operation`` on the shard coordinating ``transactional_id``: ``(NONE, result)`` or ``(error, None)``.

    NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS come from the runtime
    when the id lives elsewhere or its partition is loading.
    """
    try:
        shard = await coordinator_of(ctx).shard_for(transactional_id)
        return ErrorCode.none, await operation(shard)
    except (CoordinatorError, TxnError) as exc:
        return exc.code, None
