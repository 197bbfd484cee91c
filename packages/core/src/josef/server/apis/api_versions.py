"""ApiVersions: the API keys and version ranges the listener answers, exactly, and the feature levels (v3+).

A controller listener lists the controller's APIs, a client listener the broker's, as Kafka's do.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from josef.security import SOFTWARE_PATTERN
from josef.server.dispatch import RequestContext

log = logging.getLogger(__name__)


async def api_versions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    body = ctx.broker.dispatcher_for(ctx.listener_name).api_versions_body()
    if ctx.api_version >= 3:
        name, version = request.client_software_name, request.client_software_version
        if not (SOFTWARE_PATTERN.fullmatch(name) and SOFTWARE_PATTERN.fullmatch(version)):
            # KIP-511: Kafka refuses names and versions outside its pattern, with no API ranges in the answer.
            return {"error_code": ErrorCode.invalid_request, "api_keys": [], "throttle_time": 0}
        session = ctx.session
        session.client_software_name, session.client_software_version = name, version
        log.debug("connection %s", session)
        image = ctx.broker.image
        # v3 clients cannot take a minimum of 0, so Kafka leaves those features out of v3 answers.
        body["supported_features"] = [
            {"name": name, "min_version": f.min_level, "max_version": f.max_level}
            for name, f in sorted(ctx.broker.features.items()) if ctx.api_version >= 4 or f.min_level > 0]
        # KRaft has no minimum finalized level: Kafka sends the level as both.
        body["finalized_features"] = [
            {"name": name, "max_version_level": level, "min_version_level": level}
            for name, level in sorted(image.features.items())]
        body["finalized_features_epoch"] = image.offset if image.features else -1
    return body
