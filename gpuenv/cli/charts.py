"""Server-drawn SVG line charts for `gpuenv dashboard` (no charting library, no script
in the image): a reading of one GPU over a window, with its scale and its last value."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from html import escape
from typing import Any

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM = 220, 96, 30, 16
# reading -> (label, unit, fixed top of the scale, or the series' own maximum)
READINGS: dict[str, tuple[str, str, float | None]] = {
    "utilization": ("utilization", "%", 100.0),
    "memory_used_mib": ("memory used", "MiB", None),
    "temperature_c": ("temperature", "°C", None),
    "power_w": ("power", "W", None),
    "sm_clock_mhz": ("SM clock", "MHz", None),
}
LIMITS = {"memory_used_mib": "memory_total_mib", "power_w": "power_limit_w"}


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


def line_chart(points: Sequence[dict[str, Any]], reading: str, since: float, until: float) -> str:
    """An SVG of `reading` between `since` and `until` (epoch seconds, labelled in UTC).
    Gaps break the line: a point without the value, or points further apart than
    three times their usual spacing (the sampler was not running); without any value
    it says "no samples yet".

    >>> svg = line_chart([{"t": 0, "utilization": 50}, {"t": 60, "utilization": 100}],
    ...                  "utilization", 0, 60)
    >>> 'points="30.0,41.0 220.0,2.0"' in svg
    True
    """
    label, unit, fixed_top = READINGS[reading]
    values = [p[reading] for p in points if p.get(reading) is not None]
    limit_key = LIMITS.get(reading)
    limits = [p[limit_key] for p in points if limit_key and p.get(limit_key) is not None]
    top = fixed_top or max([*values, *limits, 1.0]) * 1.05
    plot_w, plot_h = WIDTH - PAD_LEFT, HEIGHT - PAD_BOTTOM - 2
    span = max(until - since, 1.0)

    def xy(t: float, value: float) -> str:
        x = PAD_LEFT + (t - since) / span * plot_w
        y = 2 + plot_h - min(value, top) / top * plot_h
        return f"{x:.1f},{y:.1f}"

    times = [p["t"] for p in points]
    steps = sorted(b - a for a, b in itertools.pairwise(times))
    gap = 3 * steps[len(steps) // 2] if steps else span
    lines: list[list[str]] = [[]]
    last: float | None = None
    for point in points:
        value = point.get(reading)
        if value is None or (last is not None and point["t"] - last > gap):
            lines.append([])
        if value is not None:
            lines[-1].append(xy(point["t"], value))
        last = point["t"]
    title = f"{label} ({unit})"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'class="chart" role="img" aria-label="{escape(title)}">',
        f'<text x="2" y="10" class="scale">{_number(top)}</text>',
        f'<text x="2" y="{HEIGHT - PAD_BOTTOM}" class="scale">0</text>',
        f'<line x1="{PAD_LEFT}" y1="{HEIGHT - PAD_BOTTOM}" x2="{WIDTH}" '
        f'y2="{HEIGHT - PAD_BOTTOM}" class="axis"/>',
        f'<text x="{PAD_LEFT}" y="{HEIGHT - 4}" class="scale">{_clock(since)}</text>',
        f'<text x="{WIDTH}" y="{HEIGHT - 4}" class="scale" text-anchor="end">'
        f"{_clock(until)}</text>",
    ]
    if limits:
        y = xy(since, limits[-1]).split(",")[1]
        parts.append(f'<line x1="{PAD_LEFT}" y1="{y}" x2="{WIDTH}" y2="{y}" class="limit"/>')
    for line in lines:
        if len(line) == 1:
            x, y = line[0].split(",")
            parts.append(f'<circle cx="{x}" cy="{y}" r="1.5" class="series"/>')
        elif line:
            parts.append(f'<polyline points="{" ".join(line)}" class="series"/>')
    caption = f"{title}: {_number(values[-1])}" if values else f"{title}: no samples yet"
    parts.append(
        f'<text x="{WIDTH}" y="10" class="caption" text-anchor="end">{escape(caption)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _clock(epoch: float) -> str:
    return time.strftime("%m-%d %H:%M UTC", time.gmtime(epoch))
