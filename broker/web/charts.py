"""Charts as inline SVG, made in Python: the semester burn-down with its forecast, node time bars.

No script and no external file: the page works offline and prints. Every
text in a chart goes through ``esc``. Money arrives as integer micro-units
and is only scaled to pixels here (a drawing, never a sum).
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from html import escape
from typing import Any

from broker.amount import format_money

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
BUSY, IDLE, RELEASED = "#2ca02c", "#ff7f0e", "#c7c7c7"


def esc(value: Any) -> str:
    """``value`` as HTML text: tags, quotes and ampersands escaped; an enum as its stored value."""
    if isinstance(value, Enum):
        value = value.value
    return escape(str(value), quote=True)


def _when(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def burndown_svg(data: dict[str, Any], width: int = 760, height: int = 320) -> str:
    """The ``burndown`` operation's answer as one SVG: money left per group over the semester.

    A solid line with a dot per ledger point, a dashed line for the forecast,
    a vertical line at now. Empty (a sentence) when no group has a budget.
    """
    series = data.get("series") or []
    if not series:
        return '<p class="empty">No budget for a group you can see in this semester.</p>'
    left, right, top, bottom = 80, 150, 16, 36
    start, end = _when(data["starts_at"]), _when(data["ends_at"])
    span = max(1.0, (end - start).total_seconds())
    top_micros = max(1, max(int(s["amount_micros"]) for s in series))
    low_micros = min(0, min(int(v) for s in series for _, v in [*s["points"], *s["forecast"]]))
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(at: str) -> float:
        t = (_when(at) - start).total_seconds() / span
        return round(left + plot_w * min(1.0, max(0.0, t)), 1)

    def y(micros: int) -> float:
        return round(top + plot_h * (top_micros - micros) / (top_micros - low_micros), 1)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart burndown" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="budget burn-down, semester {esc(data["semester"])}">']
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>')
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        micros = int(low_micros + (top_micros - low_micros) * frac)
        yy = y(micros)
        out.append(f'<line x1="{left}" y1="{yy}" x2="{left + plot_w}" y2="{yy}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 6}" y="{yy + 4}" text-anchor="end" font-size="11">{esc(format_money(micros))}</text>')
    if low_micros < 0:
        out.append(f'<line x1="{left}" y1="{y(0)}" x2="{left + plot_w}" y2="{y(0)}" stroke="#888"/>')
    out.append(f'<text x="{left}" y="{height - 12}" font-size="11">{esc(data["starts_at"][:10])}</text>')
    out.append(f'<text x="{left + plot_w}" y="{height - 12}" font-size="11" text-anchor="end">'
               f'{esc(data["ends_at"][:10])}</text>')
    now = data.get("now")
    if now and start <= _when(now) <= end:
        out.append(f'<line class="now" x1="{x(now)}" y1="{top}" x2="{x(now)}" y2="{top + plot_h}" stroke="#999" '
                   f'stroke-dasharray="2,3"/><text x="{x(now)}" y="{height - 24}" font-size="11" '
                   f'text-anchor="middle">now</text>')
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        group = esc(s["group"])
        pts = " ".join(f"{x(at)},{y(int(v))}" for at, v in s["points"])
        out.append(f'<g class="series" data-group="{group}">')
        out.append(f'<polyline class="spent" fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
        for at, v in s["points"]:
            out.append(f'<circle class="point" cx="{x(at)}" cy="{y(int(v))}" r="3" fill="{color}">'
                       f'<title>{group} {esc(at)}: {esc(format_money(int(v)))} left</title></circle>')
        if s["forecast"]:
            fpts = " ".join(f"{x(at)},{y(int(v))}" for at, v in s["forecast"])
            out.append(f'<polyline class="forecast" fill="none" stroke="{color}" stroke-width="2" '
                       f'stroke-dasharray="6,4" points="{fpts}"/>')
        ly = top + 14 + 18 * i
        out.append(f'<rect x="{width - right + 12}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{width - right + 26}" y="{ly}" font-size="12">{group}</text></g>')
    out.append("</svg>")
    return "".join(out)


def node_bars_svg(rows: list[dict[str, Any]], width: int = 760) -> str:
    """One stacked bar per node: busy, idle and released seconds of the window (rows from ``nodes.node_time``)."""
    if not rows:
        return '<p class="empty">No node sessions in this window.</p>'
    left, right, bar_h, gap, top = 110, 20, 16, 8, 24
    height = top + len(rows) * (bar_h + gap) + 10
    plot_w = width - left - right
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart nodes" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="node time: busy, idle, released">']
    for i, (label, color) in enumerate((("busy", BUSY), ("idle", IDLE), ("released", RELEASED))):
        out.append(f'<rect x="{left + 90 * i}" y="4" width="10" height="10" fill="{color}"/>'
                   f'<text x="{left + 90 * i + 14}" y="13" font-size="12">{label}</text>')
    for i, r in enumerate(rows):
        total = max(1, int(r["busy_s"]) + int(r["idle_s"]) + int(r["released_s"]))
        yy = top + i * (bar_h + gap)
        out.append(f'<text x="{left - 6}" y="{yy + 12}" text-anchor="end" font-size="12">{esc(r["node"])}</text>')
        xx = float(left)
        for key, color in (("busy_s", BUSY), ("idle_s", IDLE), ("released_s", RELEASED)):
            w = round(plot_w * int(r[key]) / total, 1)
            if w > 0:
                out.append(f'<rect class="{key[:-2]}" x="{round(xx, 1)}" y="{yy}" width="{w}" height="{bar_h}" '
                           f'fill="{color}"><title>{esc(r["node"])} {key[:-2]}: {int(r[key])} s</title></rect>')
            xx += w
    out.append("</svg>")
    return "".join(out)
