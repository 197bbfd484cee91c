"""The node's HTTP listener (``http.listeners``): ``/metrics``, ``/health/live``, ``/health/ready``.

One listener per node, on the node's own event loop (aiohttp), so what it
serves is read from the node's state as it is, with no second process to
deploy. Off unless ``http.listeners`` names an address; ``josef server
start`` without a properties file serves it on 127.0.0.1:9644.

- ``/metrics``: Prometheus' text format (:class:`josef.metrics.NodeMetrics`).
- ``/health/live``: 200 while the node's event loop answers at all.
- ``/health/ready``: 200 once the node serves: its listeners are bound, it
  has caught up with the metadata (a broker: the controller unfenced it,
  which it does only once the broker's metadata offset reached the
  registration's) and it is not shutting down; 503 otherwise. Both answer
  JSON saying why, for the humans reading a probe's failure.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import anyio
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from josef.config import ConfigError
from josef.plugins import collect

if TYPE_CHECKING:
    from josef.node.broker import Broker

log = logging.getLogger(__name__)

#: The node an aiohttp request is for.
NODE = web.AppKey("node", object)


def parse_http_listener(text: str) -> tuple[str, int]:
    """``http://HOST:PORT`` as (host, port); a clear error for anything else."""
    scheme, sep, rest = text.partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or scheme != "http" or not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"http.listeners: {text!r} is not http://HOST:PORT")
    return host.strip("[]"), int(port)


def readiness(broker: Broker) -> tuple[bool, dict[str, Any]]:
    """Whether the node serves, and the facts that decide it."""
    facts: dict[str, Any] = {"node_id": broker.node_id, "started": broker.ready.is_set(),
                             "metadata_offset": broker.image.offset}
    ready = facts["started"] and not broker.stopping
    if broker.is_controller and hasattr(broker, "quorum"):
        facts["controller_id"] = broker.quorum.controller_id
        ready = ready and broker.quorum.controller_id >= 0
    if broker.is_broker:
        facts["fenced"] = broker.lifecycle.fenced
        ready = ready and not broker.lifecycle.fenced
    facts["stopping"] = broker.stopping
    facts["ready"] = ready
    return ready, facts


async def _metrics(request: web.Request) -> web.Response:
    broker: Broker = request.app[NODE]
    body = await broker.metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _live(request: web.Request) -> web.Response:
    broker: Broker = request.app[NODE]
    return web.json_response({"node_id": broker.node_id, "live": True})


async def _ready(request: web.Request) -> web.Response:
    ready, facts = readiness(request.app[NODE])
    return web.Response(text=json.dumps(facts), status=200 if ready else 503, content_type="application/json")


def application(broker: Broker) -> web.Application:
    app = web.Application()
    app[NODE] = broker
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health/live", _live)
    app.router.add_get("/health/ready", _ready)
    routes = collect(broker.pm, "register_http_routes", "http routes").items()
    for name, factory in routes:
        app.add_subapp(f"/{name}/", factory(broker.services))
    if routes:
        home = f"/{routes[0][0]}/"
        app.router.add_get("/", lambda _: web.HTTPFound(home))
    return app


class HttpListener:
    """The node's HTTP listeners: started before the node serves Kafka (so probes see it starting), stopped last."""

    def __init__(self, broker: Broker, addresses: list[str]) -> None:
        self._broker = broker
        self._addresses = [parse_http_listener(a) for a in addresses]
        self._runner: web.AppRunner | None = None
        #: Where each listener really listens (port 0 becomes the chosen one).
        self.bound: list[tuple[str, int]] = []

    async def start(self) -> None:
        if not self._addresses:
            return
        self._runner = web.AppRunner(application(self._broker), access_log=None, handle_signals=False)
        await self._runner.setup()
        for host, port in self._addresses:
            site = web.TCPSite(self._runner, host or None, port, reuse_address=True)
            await site.start()
            server = site._server  # noqa: SLF001 (aiohttp gives the bound port nowhere else)
            self.bound.append((host, server.sockets[0].getsockname()[1]))
        log.info("HTTP listener (metrics, health) on %s", ", ".join(f"http://{h}:{p}" for h, p in self.bound))

    async def close(self) -> None:
        if self._runner is not None:
            with anyio.CancelScope(shield=True):
                await self._runner.cleanup()
            self._runner = None
