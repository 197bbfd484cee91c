"""HTML building blocks: escaping by default, tables, the page around a main section.

Plain f-strings, not a template engine: the pages are a handful of tables.
Safety comes from one rule: every value goes through :func:`h`, which
escapes anything that is not already :class:`Html` (markup this module or
:mod:`josef_console.pages` built). Names in the cluster (topics, groups,
client ids, transactional ids) are chosen by clients, so they are text, never
markup.

A page is a document whose ``<main>`` holds everything that changes; the
script (``static/console.js``) fetches the same URL again every
``console.refresh.ms`` with the header :data:`FRAGMENT_HEADER`, and the
server answers with the main section alone, which replaces the old one: the
page updates without a reload, keeping its scroll position and the forms
outside ``<main>``.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

#: The request header asking for the main section only (the script's refreshes).
FRAGMENT_HEADER = "X-Josef-Fragment"
#: The pages, in the navigation's order: (path below the console's root, title).
NAVIGATION = (("", "Overview"), ("topics", "Topics"), ("groups", "Groups"), ("transactions", "Transactions"),
              ("reassignments", "Reassignments"), ("throughput", "Throughput"))


class Html(str):
    """Markup that is safe to put in a page as it is (built here from escaped parts)."""

    __slots__ = ()


def h(value: Any) -> Html:
    """``value`` as HTML: markup kept, anything else escaped as text (None shows as "-")."""
    if isinstance(value, Html):
        return value
    if value is None:
        return Html("-")
    return Html(html.escape(str(value), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Html:
    return Html(html.escape(sep).join(h(p) for p in parts))


def link(href: str, text: Any) -> Html:
    return Html(f'<a href="{h(href)}">{h(text)}</a>')


def path_part(name: str) -> str:
    """A topic or group name as one segment of a URL path (group ids may hold ``/``, ``?``, anything)."""
    return quote(name, safe="")


def ids(nodes: Sequence[int]) -> str:
    """Broker ids as Kafka's tools print them, ``1,2,3``; "-" for none, so an empty cell is not mistaken for a gap."""
    return ",".join(str(n) for n in nodes) or "-"


def size(value: int | None) -> str:
    """Bytes for a person: ``0 B``, ``512 B``, ``1.5 KiB``, ``20.0 MiB``; "-" when unknown."""
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{value} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def duration_ms(value: int | None) -> str:
    """A duration for a person: ``850 ms``, ``1.5 s``, ``12 s``, ``3 min``, ``2 h``; "-" when unknown."""
    if value is None or value < 0:
        return "-"
    if value < 1000:
        return f"{value} ms"
    if value < 10_000:
        return f"{value / 1000:.1f} s"
    seconds = value // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def table(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]], *, table_id: str | None = None,
          row_ids: Sequence[str] | None = None, row_classes: Sequence[str] | None = None, empty: str = "none") -> Html:
    """A table whose cells carry their column's key as a class (``<td class="isr">``), so CSS can align them and
    tests can find a value by what it is rather than by position. ``columns`` are (key, heading)."""
    rows = list(rows)
    head = "".join(f'<th class="{h(key)}" scope="col">{h(title)}</th>' for key, title in columns)
    body = []
    for i, row in enumerate(rows):
        attributes = ""
        if row_ids is not None:
            attributes += f' data-key="{h(row_ids[i])}"'
        if row_classes is not None and row_classes[i]:
            attributes += f' class="{h(row_classes[i])}"'
        cells = "".join(f'<td class="{h(key)}">{h(cell)}</td>' for (key, _), cell in zip(columns, row))
        body.append(f"<tr{attributes}>{cells}</tr>")
    if not rows:
        body.append(f'<tr class="empty"><td colspan="{len(columns)}">{h(empty)}</td></tr>')
    identity = f' id="{h(table_id)}"' if table_id else ""
    return Html(f'<div class="scroll"><table{identity}><thead><tr>{head}</tr></thead>'
                f'<tbody>{"".join(body)}</tbody></table></div>')


def section(title: str, body: Any, *, section_id: str | None = None) -> Html:
    identity = f' id="{h(section_id)}"' if section_id else ""
    return Html(f"<section{identity}><h2>{h(title)}</h2>{h(body)}</section>")


def facts(pairs: Iterable[tuple[str, Any]]) -> Html:
    """A definition list of (label, value): the short summaries at the top of a page."""
    return Html('<dl class="facts">' + "".join(f"<dt>{h(k)}</dt><dd>{h(v)}</dd>" for k, v in pairs) + "</dl>")


def badge(text: str, kind: str) -> Html:
    """A state in a colour: ``ok``, ``warn`` or ``bad``."""
    return Html(f'<span class="badge {h(kind)}">{h(text)}</span>')


def document(*, title: str, root: str, active: str, node_id: int, main: Any, refresh_ms: int,
             aside: Any = "", notice: str | None = None) -> Html:
    """The whole page: head (the node's own stylesheet), navigation, notice, the main section, the forms, the script.

    Everything it loads comes from the node (``root`` + ``static/...``): no
    font, script or image from elsewhere, so the console works where the
    node is reachable and nothing else is.
    """
    current = ' aria-current="page"'
    nav = "".join(f'<a href="{h(root + path)}"{current if path == active else ""}>{h(name)}</a>'
                  for path, name in NAVIGATION)
    shown = f'<p class="notice" role="status">{h(notice)}</p>' if notice else ""
    return Html(
        "<!doctype html>"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{h(title)} · josef node {node_id}</title>"
        f'<link rel="stylesheet" href="{h(root)}static/console.css">'
        f'<link rel="icon" href="{h(root)}static/favicon.svg" type="image/svg+xml">'
        "</head>"
        f'<body data-refresh-ms="{int(refresh_ms)}">'
        f'<header><span class="brand">josef</span> <span class="node">node {node_id}</span>'
        f'<nav>{nav}</nav><span id="status" class="status" aria-live="polite"></span></header>'
        f"{shown}"
        f'<main id="main">{h(main)}</main>'
        f"{h(aside)}"
        f'<script src="{h(root)}static/console.js"></script>'
        "</body></html>")
