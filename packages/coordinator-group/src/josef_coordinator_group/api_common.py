"""Helpers shared by the group coordinator's request handlers."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

import anyio
from kio.schema.errors import ErrorCode

from josef.coordinator.runtime import CoordinatorError, ShardContext
from josef_coordinator_group.group import GroupError
from josef_coordinator_group.shard import ANSWERED

if TYPE_CHECKING:
    from josef.server.dispatch import RequestContext
    from josef_coordinator_group.coordinator import GroupCoordinator
    from josef_coordinator_group.shard import GroupShard

log = logging.getLogger(__name__)
T = TypeVar("T")



def check_active(context: ShardContext) -> None:
    """Call after taking a shard's lock: the shard may have been unloaded while the request waited for it."""
    if not context.active:
        raise CoordinatorError(ErrorCode.not_coordinator, f"{context.tp} is no longer coordinated here")


def ms(value: Any) -> int:
    """A kio duration (timedelta) or a plain number of milliseconds, as milliseconds."""
    if value is None:
        return -1
    total_seconds = getattr(value, "total_seconds", None)
    if total_seconds is not None:
        return int(round(total_seconds() * 1000))
    return int(value)


async def with_shard(coordinator: GroupCoordinator, group_id: str, operation: Callable[[GroupShard], Awaitable[T]],
                     *, settled: bool = True) -> T:
    """Run ``operation`` on the shard of ``group_id`` with its lock held; answer once what it saw is committed.

    ``settled``: an operation that appended nothing is answered only once
    everything applied before it ended is committed (what it read), within
    ``offsets.commit.timeout.ms``, as Kafka's write operations without records
    are; the lock is released meanwhile. One that appended is answered by its
    own write, one that was refused (:meth:`GroupShard.refused`) at once.
    JoinGroup and SyncGroup, answered by a waiter, do not wait (Kafka
    completes their responses apart from the write).

    Failures become a :class:`CoordinatorError` (or the operation's own
    :class:`GroupError`) whose code the handler returns: NOT_COORDINATOR /
    COORDINATOR_LOAD_IN_PROGRESS when the group lives elsewhere or is
    loading, UNKNOWN_SERVER_ERROR (logged) for a bug, so one bad request
    never takes the connection down.
    """
    context, shard = await coordinator.shard_for(group_id)
    async with context.lock:
        check_active(context)
        appended = ANSWERED.set(False)
        try:
            result = await operation(shard)
            if settled and context.active and not ANSWERED.get():
                await shard.wait(context.barrier())
            return result
        except (CoordinatorError, GroupError, anyio.get_cancelled_exc_class()):
            raise
        except Exception as exc:
            log.exception("group %r: request failed", group_id)
            raise CoordinatorError(ErrorCode.unknown_server_error, f"{type(exc).__name__}: {exc}") from exc
        finally:
            ANSWERED.reset(appended)


def client_host(ctx: RequestContext) -> str:
    """The client address as Kafka reports it in DescribeGroups (``InetAddress.toString()``: ``/127.0.0.1``)."""
    return f"/{ctx.client_host}"
