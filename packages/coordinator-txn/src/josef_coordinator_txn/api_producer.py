"""InitProducerId (v0-v5), taken over from the core: transactional producers here, idempotent ones by the core.

Without a transactional id the request is the core's
(``services.core_handler(INIT_PRODUCER_ID)``: a new producer id at
epoch 0). With one it goes to the id's coordinator, which bumps the epoch
of the id (fencing the previous producer), or gives it a new producer id on
first use or once its epochs are used up. v3+ carry the producer's current
id and epoch when it resumes after an error (KIP-360); one without the other
is INVALID_REQUEST, for idempotent producers too, as in Kafka. An empty
transactional id and a timeout outside 1..``transaction.max.timeout.ms`` are
refused by any broker, before the coordinator is looked for.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.server.dispatch import RequestContext
from josef_coordinator_txn import transactions
from josef_coordinator_txn.api_common import coordinator_of, ms, older_fenced, on_shard

#: The first version that may be answered PRODUCER_FENCED (KIP-588).
PRODUCER_FENCED_VERSION = 4


def _answer(error: ErrorCode, producer_id: int = -1, epoch: int = -1) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": error, "producer_id": producer_id, "producer_epoch": epoch}


async def init_producer_id(ctx: RequestContext, request: Any) -> dict[str, Any]:
    producer_id, epoch = getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1)
    if (producer_id == -1) != (epoch == -1):
        return _answer(ErrorCode.invalid_request)
    transactional_id = request.transactional_id
    if transactional_id is None:
        return await ctx.services.core_handler(ApiKey.INIT_PRODUCER_ID)(ctx, request)
    if transactional_id == "":
        return _answer(ErrorCode.invalid_request)
    timeout_ms = ms(request.transaction_timeout)
    if not 0 < timeout_ms <= coordinator_of(ctx).settings().max_timeout_ms:
        return _answer(ErrorCode.invalid_transaction_timeout)
    expected = None if producer_id == -1 else (producer_id, epoch)
    error, result = await on_shard(ctx, transactional_id, lambda shard: transactions.init_producer_id(
        shard, transactional_id, timeout_ms, expected))
    if result is None:
        return _answer(older_fenced(error, ctx.api_version, PRODUCER_FENCED_VERSION))
    return _answer(ErrorCode.none, *result)
