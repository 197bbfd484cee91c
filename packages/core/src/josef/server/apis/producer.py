"""InitProducerId (API 22) for idempotent producers: a fresh producer id at epoch 0.

Transactional ids belong to the transaction coordinator, which arrives with
the ``josef-coordinator-txn`` plugin; until then such requests are answered
COORDINATOR_NOT_AVAILABLE (retriable, so a client waits rather than failing
on a wrong error).

Without a transactional id Kafka (``TransactionCoordinator.handleInitProducerId``)
"blindly" returns a new producer id with epoch 0, even when a v3+ request
carries the producer's current id and epoch (KIP-360): an idempotent
producer bumps its epoch itself (the Java client does, restarting its
sequences at 0, which the partition's producer state accepts) and asks the
broker only for a new id, e.g. when its epoch is exhausted. josef does the
same, so the old id's batches are not fenced by this request.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from josef.server.dispatch import RequestContext
from josef.services import ProducerIdUnavailable

log = logging.getLogger(__name__)


def _answer(error: ErrorCode, producer_id: int = -1, epoch: int = -1) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": error, "producer_id": producer_id, "producer_epoch": epoch}


async def init_producer_id(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if request.transactional_id is not None:
        log.warning("InitProducerId for transactional id %r from client %r: transactions need the transaction "
                    "coordinator plugin (josef-coordinator-txn), which is not installed; answering "
                    "COORDINATOR_NOT_AVAILABLE", request.transactional_id, ctx.client_id)
        return _answer(ErrorCode.coordinator_not_available)
    try:
        producer_id = await ctx.services.new_producer_id()
    except ProducerIdUnavailable as exc:
        log.warning("no producer id for client %r: %s", ctx.client_id, exc.message)
        return _answer(exc.code)
    log.debug("producer id %d (epoch 0) for client %r", producer_id, ctx.client_id)
    return _answer(ErrorCode.none, producer_id, 0)
