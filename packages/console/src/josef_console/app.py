"""The console's aiohttp application, mounted by the node at ``/console/`` (``register_http_routes``).

Every page is computed when it is asked for, from the node's metadata image
and requests to the brokers that know the rest (:mod:`josef_console.cluster`);
only the throughput samples are kept between requests. A request with the
``X-Josef-Fragment`` header gets the page's main section alone: what the
page's script fetches to refresh itself in place.

The node's HTTP listener authenticates requests and requires DESCRIBE on the
cluster before any handler here runs; the lists are then narrowed to what
the user may describe (topics, groups, transactional ids), as Kafka's
Metadata, ListGroups and ListTransactions answers are. Every response
carries a Content-Security-Policy that allows nothing but the node itself.
"""

from __future__ import annotations

import importlib.resources
import logging
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

import attrs
from aiohttp import web

from josef.authorizer import Action
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import UnsupportedVersionError
from josef.server.http import AUTHORIZATION_CONTEXT, PRINCIPAL
from josef.services import BrokerServices
from josef_console import actions, cluster, pages
from josef_console.cluster import EARLIEST, LATEST, ClusterReader, reason
from josef_console.configs import ACTIONS_ENABLE, REFRESH_MS, SAMPLE_MS, WINDOW_MS
from josef_console.html import FRAGMENT_HEADER, Html, document, h
from josef.metadata.quorum_status import Quorum
from josef_console.model import Unreadable
from josef_console.plugin import NAME
from josef_console.remote import RemoteSizes
from josef_console.sampler import Throughput, run_sampler

log = logging.getLogger(__name__)

ROOT = f"/{NAME}/"
#: Nothing but the node: no CDN, font, image or script from elsewhere, no inline script, no framing.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
STATIC = {"console.css": "text/css", "console.js": "text/javascript", "favicon.svg": "image/svg+xml"}


class Console:
    """One node's console: its reader, the remote-size cache and the throughput samples."""

    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self.reader = ClusterReader(services)
        self.remote = RemoteSizes(self.reader)
        self.throughput = Throughput(services.config[WINDOW_MS] / 1000, services.config[SAMPLE_MS] / 1000)
        files = importlib.resources.files("josef_console") / "static"
        self.static = {name: (files / name).read_bytes() for name in STATIC}

    def view(self) -> pages.View:
        return pages.View(ROOT, self.services.node_id, int(time.time() * 1000))

    async def sample(self) -> tuple[dict[str, int | None], set[str]]:
        return await self.reader.end_offset_sums()

    def visible(self, request: web.Request, resource_type: str, names: Iterable[str]) -> set[str]:
        """The names the user may DESCRIBE (all of them when the listener checks nobody)."""
        names = list(names)
        context = request.get(AUTHORIZATION_CONTEXT)
        if context is None or not names:
            return set(names)
        answers = self.services.authorizer.authorize(context, [Action("DESCRIBE", resource_type, n) for n in names])
        return {n for n, ok in zip(names, answers) if ok}

    @property
    def actions_enabled(self) -> bool:
        return bool(self.services.config[ACTIONS_ENABLE])

    def respond(self, request: web.Request, title: str, active: str, main: Html, aside: Html | str = "",
                status: int = 200) -> web.Response:
        headers = {"Cache-Control": "no-store", "Content-Security-Policy": CSP, "Vary": FRAGMENT_HEADER,
                   "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}
        if request.headers.get(FRAGMENT_HEADER):
            body = str(main)
        else:
            body = document(title=title, root=ROOT, active=active, node_id=self.services.node_id, main=main,
                            refresh_ms=self.services.config[REFRESH_MS], aside=aside,
                            notice=request.query.get("notice"))
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8", headers=headers)


CONSOLE = web.AppKey("console", Console)


def _console(request: web.Request) -> Console:
    return request.app[CONSOLE]


def _min_isr(services: BrokerServices) -> int:
    return int(services.config["min.insync.replicas"])


# Pages ---------------------------------------------------------------------------------------------


async def overview(request: web.Request) -> web.Response:
    console = _console(request)
    services = console.services
    image = services.image
    missing: list[Unreadable] = []
    quorum: Quorum | Unreadable | None = None
    controller: int | None = None
    try:
        quorum = await console.reader.quorum()
        controller = quorum.leader_id
    except (KeyError, UnsupportedVersionError):
        pass  # not a KRaft cluster: DescribeQuorum is not answered (KeyError: this node itself does not answer it)
    except Exception as exc:  # noqa: BLE001 - shown on the page
        quorum = Unreadable("quorum", reason(exc))
    if controller is None:
        try:
            described = await console.reader.call(console.reader.broker_to_ask(), ApiKey.DESCRIBE_CLUSTER, {
                "include_cluster_authorized_operations": False}, version=1)
            controller = int(described.controller_id)
        except Exception as exc:  # noqa: BLE001
            missing.append(Unreadable("active controller", reason(exc)))
    all_topics = cluster.topics(image, _min_isr(services))
    groups, unread = await console.reader.list_groups()
    missing += unread
    visible_groups = console.visible(request, "GROUP", {g.group_id for g in groups})
    main = pages.overview(console.view(), cluster.health(image, all_topics, controller), cluster.brokers(image),
                          quorum, cluster.features(image), image.offset, len(visible_groups), missing)
    return console.respond(request, "Overview", "", main)


async def topics(request: web.Request) -> web.Response:
    console = _console(request)
    image = console.services.image
    names = console.visible(request, "TOPIC", image.topics)
    sizes, missing = await console.reader.log_sizes()
    found = cluster.topics(image, _min_isr(console.services), sizes, names)
    aside = actions.create_topic_form(ROOT) if console.actions_enabled else ""
    return console.respond(request, "Topics", "topics", pages.topics_list(console.view(), found, console.throughput,
                                                                          missing), aside)


async def topic(request: web.Request) -> web.Response:
    console = _console(request)
    name = request.match_info["name"]
    image = console.services.image
    if name not in image.topics or not console.visible(request, "TOPIC", [name]):
        return console.respond(request, name, "topics", Html(f"<h1>No topic {h(name)}</h1>"
                                                             "<p>This cluster has no such topic (or it may not be "
                                                             "described by you).</p>"), status=404)
    sizes, missing = await console.reader.log_sizes([name])
    [found] = cluster.topics(image, _min_isr(console.services), sizes, [name])
    tps = [(name, p.partition) for p in found.partitions]
    starts, unread = await console.reader.offsets(tps, EARLIEST)
    ends, unread_ends = await console.reader.offsets(tps, LATEST)
    missing += unread + unread_ends
    configs: Any
    try:
        configs = await console.reader.topic_configs(name)
    except Exception as exc:  # noqa: BLE001 - shown on the page
        configs = Unreadable("configuration", reason(exc))
    tiered = not isinstance(configs, Unreadable) and any(
        c.name == "remote.storage.enable" and c.value == "true" for c in configs)
    remote: dict[int, int] = {}
    if tiered:
        try:
            remote = await console.remote.of(found)
        except Exception as exc:  # noqa: BLE001
            missing.append(Unreadable("remote log metadata", reason(exc)))
    found = attrs.evolve(found, partitions=tuple(
        attrs.evolve(p, start_offset=starts.get((name, p.partition)), end_offset=ends.get((name, p.partition)),
                     remote_size=remote.get(p.partition, 0) if tiered else None) for p in found.partitions))
    return console.respond(request, f"Topic {name}", "topics",
                           pages.topic_detail(console.view(), found, configs, tiered, missing))


async def groups(request: web.Request) -> web.Response:
    console = _console(request)
    listed, missing = await console.reader.list_groups()
    allowed = console.visible(request, "GROUP", {g.group_id for g in listed})
    described, more = await console.reader.describe_groups([g for g in listed if g.group_id in allowed])
    return console.respond(request, "Groups", "groups", pages.groups_list(console.view(), described, missing + more))


async def group(request: web.Request) -> web.Response:
    console = _console(request)
    group_id = request.match_info["group_id"]
    aside = actions.reset_offsets_form(ROOT, group_id) if console.actions_enabled else ""
    found = None
    missing: list[Unreadable] = []
    if console.visible(request, "GROUP", [group_id]):
        try:
            found, missing = await console.reader.group(group_id)
        except Exception as exc:  # noqa: BLE001 - shown on the page
            missing = [Unreadable(f"group {group_id}", reason(exc))]
    if found is None:
        return console.respond(request, group_id, "groups", Html(
            f"<h1>No group {h(group_id)}</h1>{pages.unreadable(missing)}"
            "<p>No coordinator knows this group (or it may not be described by you).</p>"), status=404)
    return console.respond(request, f"Group {group_id}", "groups", pages.group_detail(console.view(), found, missing),
                           aside)


async def transactions(request: web.Request) -> web.Response:
    console = _console(request)
    found, missing = await console.reader.transactions()
    allowed = console.visible(request, "TRANSACTIONAL_ID", {t.transactional_id for t in found})
    return console.respond(request, "Transactions", "transactions", pages.transactions(
        console.view(), [t for t in found if t.transactional_id in allowed], missing))


async def reassignments(request: web.Request) -> web.Response:
    console = _console(request)
    image = console.services.image
    names = console.visible(request, "TOPIC", image.topics)
    moving = cluster.reassignments(cluster.topics(image, _min_isr(console.services), names=names))
    return console.respond(request, "Reassignments", "reassignments", pages.reassignments(console.view(), moving))


async def throughput(request: web.Request) -> web.Response:
    console = _console(request)
    names = console.visible(request, "TOPIC", console.services.image.topics)
    return console.respond(request, "Throughput", "throughput", pages.throughput(
        console.view(), sorted(names), console.throughput, console.throughput.window_s, console.services.is_broker))


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    return web.Response(body=_console(request).static[name], content_type=STATIC[name],
                        headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})


# Actions ---------------------------------------------------------------------------------------------


def _check_action(request: web.Request) -> Console:
    console = _console(request)
    if not console.actions_enabled:
        raise web.HTTPForbidden(text=f"the console is read-only ({ACTIONS_ENABLE}=false)\n")
    if not actions.same_origin(request):
        raise web.HTTPForbidden(text="actions are accepted only from the console's own pages\n")
    return console


def _back(path: str, notice: str) -> web.HTTPSeeOther:
    return web.HTTPSeeOther(f"{path}?{urlencode({'notice': notice})}")


async def create_topic(request: web.Request) -> web.Response:
    console = _check_action(request)
    form = await request.post()
    name = str(form.get("name", "")).strip()
    try:
        partitions = int(str(form.get("partitions") or -1))
        replication_factor = int(str(form.get("replication_factor") or -1))
        done = await actions.create_topic(console.services, console.reader, request.get(AUTHORIZATION_CONTEXT), name,
                                          partitions, replication_factor)
    except ValueError:
        raise _back(ROOT + "topics", "partitions and replication factor must be whole numbers") from None
    except actions.Refused as exc:
        raise _back(ROOT + "topics", exc.message) from None
    log.info("console: %s by %s from %s", done, request.get(PRINCIPAL), request.remote)
    raise _back(console.view().topic_href(name), done)


async def reset_offsets(request: web.Request) -> web.Response:
    console = _check_action(request)
    group_id = request.match_info["group_id"]
    form = await request.post()
    page = console.view().group_href(group_id)
    try:
        done = await actions.reset_offsets(console.services, console.reader, request.get(AUTHORIZATION_CONTEXT),
                                           group_id, str(form.get("to", "")))
    except actions.Refused as exc:
        raise _back(page, exc.message) from None
    log.info("console: %s by %s from %s", done, request.get(PRINCIPAL), request.remote)
    raise _back(page, done)


def console_app(services: BrokerServices) -> web.Application:
    """The factory ``register_http_routes`` registers: the application, and the throughput sampler on brokers."""
    console = Console(services)
    app = web.Application()
    app[CONSOLE] = console
    app.router.add_get("/", overview)
    app.router.add_get("/topics", topics)
    app.router.add_post("/topics", create_topic)
    app.router.add_get("/topics/{name}", topic)
    app.router.add_get("/groups", groups)
    app.router.add_get("/groups/{group_id}", group)
    app.router.add_post("/groups/{group_id}/reset-offsets", reset_offsets)
    app.router.add_get("/transactions", transactions)
    app.router.add_get("/reassignments", reassignments)
    app.router.add_get("/throughput", throughput)
    app.router.add_get("/static/{name}", static)
    if services.is_broker:
        services.spawn(lambda: run_sampler(console.throughput, console.sample,
                                           lambda: services.config[SAMPLE_MS] / 1000))
    return app
