"""Small inline SVG charts: a rate over the last minutes, drawn in the page itself.

No chart library and no image request: a chart is a few hundred bytes of
SVG in the HTML, styled with presentation attributes only (no ``style``
attribute), so the console's Content-Security-Policy needs no
``unsafe-inline`` for it, and it is redrawn with the rest of the page's main
section when that refreshes.
"""

from __future__ import annotations

from collections.abc import Sequence

from josef_console.html import Html, h

WIDTH, HEIGHT = 160, 32
#: Room kept under the line so that a flat zero stays visible above the bottom edge.
PAD = 2.0


def points(values: Sequence[float], width: float = WIDTH, height: float = HEIGHT, slots: int = 0
           ) -> list[tuple[float, float]]:
    """The polyline's points, scaled from 0 (bottom) to the values' maximum (top).

    The values are the last of ``slots`` evenly spaced places across ``width``
    (the samples a full window holds), so a chart of the last five minutes
    fills from the right as samples come; without ``slots`` they span the
    whole width. One value is drawn as a flat line; none as no points. A
    maximum of 0 (nothing happened) is a line along the bottom.
    """
    if not values:
        return []
    if len(values) == 1:
        values = [values[0], values[0]]
    slots = max(slots, len(values))
    top = max(max(values), 0.0)
    span = height - 2 * PAD
    step = width / (slots - 1)
    first = slots - len(values)
    return [(round((first + i) * step, 1), round(height - PAD - (span * max(v, 0.0) / top if top > 0 else 0.0), 1))
            for i, v in enumerate(values)]


def sparkline(values: Sequence[float], label: str, unit: str = "/s", width: int = WIDTH, height: int = HEIGHT,
              slots: int = 0) -> Html:
    """An SVG sparkline of ``values`` (oldest first, the last of ``slots`` places) with an accessible label and a
    tooltip naming the last and the peak value."""
    drawn = points(values, width, height, slots)
    if values:
        summary = f"{label}: {format_rate(values[-1])}{unit} now, peak {format_rate(max(values))}{unit}"
    else:
        summary = f"{label}: no samples yet"
    body = ""
    if drawn:
        line = " ".join(f"{x},{y}" for x, y in drawn)
        area = f"{drawn[0][0]},{height} {line} {width},{height}"
        body = (f'<polygon points="{area}" fill="#2a7ab9" fill-opacity="0.15" stroke="none"/>'
                f'<polyline points="{line}" fill="none" stroke="#2a7ab9" stroke-width="1.5" '
                f'stroke-linejoin="round"/>')
    return Html(f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
                f'aria-label="{h(summary)}"><title>{h(summary)}</title>'
                f'<line x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}" stroke="#bbb" stroke-width="1"/>'
                f"{body}</svg>")


def format_rate(value: float) -> str:
    """A rate short enough for a table cell: ``0``, ``3.5``, ``120``, ``4.2k``, ``1.3M``."""
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    if value >= 100:
        return f"{value:.0f}"
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text
