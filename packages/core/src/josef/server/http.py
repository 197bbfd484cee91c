"""The node's HTTP listener (``http.listeners``): ``/metrics``, ``/health/live``, ``/health/ready``, plugins' pages.

One listener per node, on the node's own event loop (aiohttp), so what it
serves is read from the node's state as it is, with no second process to
deploy. Off unless ``http.listeners`` names an address; ``josef server
start`` without a properties file serves it on 127.0.0.1:9644. An
``https://`` listener takes its TLS from ``listener.name.http.ssl.*`` over
``ssl.*``, as a Kafka listener named HTTP would.

Who may read it (``http.authentication``): everything but the health checks
(which say nothing a probe should not know) needs an authenticated principal
that the node's authorizer allows DESCRIBE on the CLUSTER, unless it is
``none``: ``basic`` checks HTTP Basic credentials against the SCRAM
credentials of the metadata log (either mechanism: the password a client
would use with SASL/SCRAM), ``mtls`` takes the principal from the client
certificate of an ``https://`` listener with the node's principal builder
(``ssl.principal.mapping.rules``). Unset, it is ``basic`` on a secured node
(a listener that is not PLAINTEXT, or an authorizer) and ``none`` otherwise;
``none`` on a secured node is refused at start-up: a secured cluster never
has an open admin surface. Plugins' handlers find the principal in
``request[PRINCIPAL]`` and an authorization context for
``services.authorizer`` in ``request[AUTHORIZATION_CONTEXT]``.

- ``/metrics``: Prometheus' text format (:class:`josef.metrics.NodeMetrics`).
- ``/health/live``: 200 while the node's event loop answers at all.
- ``/health/ready``: 200 once the node serves: its listeners are bound, it
  has caught up with the metadata (a broker: the controller unfenced it,
  which it does only once the broker's metadata offset reached the
  registration's) and it is not shutting down; 503 otherwise. Both answer
  JSON saying why, for the humans reading a probe's failure.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import anyio
import attrs
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from josef import scram
from josef.authorizer import CLUSTER_NAME, Action
from josef.config import Config, ConfigError
from josef.node.broker_config import listener_security_protocols
from josef.plugins import collect
from josef.security import ANONYMOUS, AuthenticationContext, KafkaPrincipal
from josef.server.tls import ListenerTls

if TYPE_CHECKING:
    from josef.node.broker import Broker

log = logging.getLogger(__name__)

#: The node an aiohttp request is for.
NODE = web.AppKey("node", object)
#: The listener name whose ``listener.name.<name>.ssl.*`` keys an https:// listener takes, and authorizers see.
LISTENER = "HTTP"
#: What a request needs once authenticated: Kafka's right to describe the cluster.
DESCRIBE_CLUSTER = Action("DESCRIBE", "CLUSTER", CLUSTER_NAME)
#: How long a Basic credential checked once is trusted without deriving its key again (PBKDF2 takes milliseconds).
CREDENTIAL_CACHE_S = 60.0


@attrs.frozen
class HttpListenerSpec:
    scheme: str
    host: str
    port: int


def parse_http_listener(text: str) -> HttpListenerSpec:
    """``http://HOST:PORT`` or ``https://HOST:PORT``; a clear error for anything else."""
    scheme, sep, rest = text.partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or scheme not in ("http", "https") or not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"http.listeners: {text!r} is not http://HOST:PORT or https://HOST:PORT")
    return HttpListenerSpec(scheme, host.strip("[]"), int(port))


def secured(config: Config) -> bool:
    """Whether the node guards its Kafka listeners: one that is not PLAINTEXT, or an authorizer."""
    return (any(protocol != "PLAINTEXT" for _, _, protocol in listener_security_protocols(config))
            or config["authorizer.class.name"] != "allow-all")


def authentication(config: Config) -> str:
    """``http.authentication`` as it applies: its default for the node, and never ``none`` on a secured node."""
    chosen = config["http.authentication"]
    if chosen is None:
        return "basic" if secured(config) else "none"
    if chosen == "none" and secured(config):
        raise ConfigError("http.authentication=none would open /metrics and every page of the HTTP listener to "
                          "anyone, on a node whose Kafka listeners are secured: use basic or mtls")
    if chosen == "mtls":
        specs = [parse_http_listener(a) for a in config["http.listeners"]]
        if any(s.scheme != "https" for s in specs) or config.for_listener(LISTENER, "ssl.client.auth") != "required":
            raise ConfigError("http.authentication=mtls needs https:// listeners in http.listeners and "
                              "listener.name.http.ssl.client.auth=required")
    return chosen


@attrs.frozen
class HttpRequestContext:
    """An HTTP request as an authorizer sees it (:class:`josef.authorizer.AuthorizableRequestContext`)."""

    principal: KafkaPrincipal
    client_host: str
    security_protocol: str
    listener_name: str = LISTENER
    api_key: int = -1
    api_version: int = 0
    client_id: str | None = None
    correlation_id: int = 0


#: Who made a request (after :class:`Authentication`): ``request[PRINCIPAL]``.
PRINCIPAL = web.RequestKey("principal", KafkaPrincipal)
#: The request as the node's authorizer sees it: ``services.authorizer.authorize(request[AUTHORIZATION_CONTEXT], ...)``.
AUTHORIZATION_CONTEXT = web.RequestKey("authorization_context", HttpRequestContext)


class Authentication:
    """The listener's middleware: who is asking (Basic against SCRAM, or the client certificate) and may they."""

    def __init__(self, broker: Broker, mode: str) -> None:
        self._broker = broker
        self.mode = mode
        #: Basic credentials checked lately: (user, password digest, stored key) -> when the check expires.
        self._checked: dict[tuple[str, bytes, bytes], float] = {}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
        host = request.remote or ""
        protocol = "SSL" if request.secure else "PLAINTEXT"
        if self.mode == "none" or request.path.startswith("/health/"):
            principal = ANONYMOUS
        else:
            principal = await (self._basic(request) if self.mode == "basic" else self._certificate(request, host))
            if principal is None:
                challenge = {"WWW-Authenticate": 'Basic realm="josef", charset="UTF-8"'} if self.mode == "basic" else {}
                raise web.HTTPUnauthorized(headers=challenge, text="authentication required\n")
        context = HttpRequestContext(principal, host, protocol)
        if principal is not ANONYMOUS and not self._broker.authorizer.authorize(context, [DESCRIBE_CLUSTER])[0]:
            log.info("HTTP %s %s from %s refused: %s may not DESCRIBE the cluster", request.method, request.path,
                     host, principal)
            raise web.HTTPForbidden(text=f"{principal} may not describe the cluster\n")
        request[PRINCIPAL] = principal
        request[AUTHORIZATION_CONTEXT] = context
        return await handler(request)

    async def _basic(self, request: web.Request) -> KafkaPrincipal | None:
        scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not sep:
            return None
        credentials = [(scram.BY_TYPE[mechanism], credential)
                       for (name, mechanism), credential in self._broker.image.scram_credentials.items()
                       if name == user and mechanism in scram.BY_TYPE]
        digest = hashlib.sha256(password.encode()).digest()
        now = time.monotonic()
        for algorithm, credential in credentials:
            key = (user, digest, credential.stored_key)
            if self._checked.get(key, 0.0) > now:
                return KafkaPrincipal("User", user)
            salted = await anyio.to_thread.run_sync(scram.salted_password, algorithm, password, credential.salt,
                                                    credential.iterations)
            if hmac.compare_digest(algorithm.digest(scram.client_key(algorithm, salted)), credential.stored_key):
                self._checked = {k: t for k, t in self._checked.items() if t > now}
                self._checked[key] = now + CREDENTIAL_CACHE_S
                return KafkaPrincipal("User", user)
        log.info("HTTP %s %s from %s: failed Basic authentication", request.method, request.path, request.remote)
        return None

    async def _certificate(self, request: web.Request, host: str) -> KafkaPrincipal | None:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport is not None else None
        subject = ListenerTls.peer_subject(ssl_object)
        if subject is None:
            return None
        try:
            return self._broker.principal_builder.build(AuthenticationContext("SSL", LISTENER, host,
                                                                              peer_subject=subject))
        except (LookupError, ValueError) as exc:
            log.info("HTTP request from %s refused: no principal for its certificate: %s", host, exc)
            return None


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


def application(broker: Broker, mode: str) -> web.Application:
    app = web.Application(middlewares=[Authentication(broker, mode).middleware])
    app[NODE] = broker
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health/live", _live)
    app.router.add_get("/health/ready", _ready)
    routes = collect(broker.pm, "register_http_routes", "http routes").items()
    for name, factory in routes:
        app.add_subapp(f"/{name}/", factory(broker.services))
    if routes:
        home = f"/{routes[0][0]}/"

        async def redirect(_: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(home)

        app.router.add_get("/", redirect)
    return app


class HttpListener:
    """The node's HTTP listeners: started before the node serves Kafka (so probes see it starting), stopped last."""

    def __init__(self, broker: Broker, config: Config) -> None:
        self._broker = broker
        self._addresses = [parse_http_listener(a) for a in config["http.listeners"]]
        self._authentication = authentication(config)
        self._tls: ssl.SSLContext | None = None
        if any(a.scheme == "https" for a in self._addresses):
            self._tls = ListenerTls.from_config(config, LISTENER, "SSL").context
        self._runner: web.AppRunner | None = None
        #: Where each listener really listens (port 0 becomes the chosen one).
        self.bound: list[tuple[str, int]] = []

    async def start(self) -> None:
        if not self._addresses:
            return
        self._runner = web.AppRunner(application(self._broker, self._authentication), access_log=None,
                                     handle_signals=False)
        await self._runner.setup()
        shown = []
        for spec in self._addresses:
            site = web.TCPSite(self._runner, spec.host or None, spec.port, reuse_address=True,
                               ssl_context=self._tls if spec.scheme == "https" else None)
            await site.start()
            server = site._server  # noqa: SLF001 (aiohttp gives the bound port nowhere else)
            port = server.sockets[0].getsockname()[1]
            self.bound.append((spec.host, port))
            shown.append(f"{spec.scheme}://{spec.host}:{port}")
        log.info("HTTP listener (metrics, health) on %s, authentication %s", ", ".join(shown), self._authentication)

    async def close(self) -> None:
        if self._runner is not None:
            with anyio.CancelScope(shield=True):
                await self._runner.cleanup()
            self._runner = None
