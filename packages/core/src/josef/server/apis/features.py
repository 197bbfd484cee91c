"""UpdateFeatures (v0-v2): finalize feature levels (KIP-584), through the controller.

As Kafka's controller does, every update is checked before any is written,
and one error answers the whole request: at v0-v1 the per-feature results
list each feature with no error on success and are empty on failure; v2 has
only the top-level error.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError
from josef.metadata.features import UpgradeType
from josef.server.dispatch import RequestContext


def _upgrade_type(version: int, update: Any) -> int:
    if version == 0:
        return UpgradeType.SAFE_DOWNGRADE if update.allow_downgrade else UpgradeType.UPGRADE
    return int(update.upgrade_type)


async def update_features(ctx: RequestContext, request: Any) -> dict[str, Any]:
    updates = [(u.feature, u.max_version_level, _upgrade_type(ctx.api_version, u)) for u in request.feature_updates]
    error, message = ErrorCode.none, None
    try:
        await ctx.broker.controller.update_features(updates, ctx.broker.features,
                                                    ctx.api_version >= 1 and request.validate_only)
    except ControllerError as exc:
        error, message = exc.code, exc.message
    results = None
    if ctx.api_version <= 1:
        results = [] if error else [{"feature": name, "error_code": ErrorCode.none, "error_message": None}
                                    for name, _, _ in updates]
    return {"throttle_time": 0, "error_code": error, "error_message": message, "results": results}
