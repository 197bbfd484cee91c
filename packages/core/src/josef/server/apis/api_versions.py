"""ApiVersions: the API keys and version ranges the listener answers, exactly, and the feature levels (v3+).

A controller listener lists the controller's APIs, a client listener the broker's, as Kafka's do.
"""

from __future__ import annotations

from typing import Any

from josef.server.dispatch import RequestContext


async def api_versions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    body = ctx.broker.dispatcher_for(ctx.listener_name).api_versions_body()
    if ctx.api_version >= 3:
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
