"""The dashboard's charts, drawn by the server as inline SVG (no script, no library,
nothing fetched from elsewhere): a line chart of a rate over time, a sparkline, a
horizontal bar with threshold lines (disk use), and bars of lag per queue.

Each returns ``markupsafe.Markup`` ready for a template; every text in it is escaped.
"""

from __future__ import annotations

import time

from markupsafe import Markup, escape


def _number(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def line_chart(points: list[tuple[float, float | None]], title: str, unit: str,
               width: int = 340, height: int = 120) -> Markup:
    """``points`` (time s, value or None: a gap) as a line; the axis from 0 to the
    largest value, the last value in the title."""
    pad_l, pad_b, pad_t = 44, 16, 18
    w, h = width - pad_l - 4, height - pad_b - pad_t
    known = [v for _, v in points if v is not None]
    top = max(known, default=0) or 1.0
    last = f"{_number(known[-1])} {unit}" if known else "no data yet"
    parts = [f'<svg class="chart" width="{width}" height="{height}" role="img" '
             f'aria-label="{escape(title)}">',
             f'<text x="{pad_l}" y="12" class="title">{escape(title)}: {escape(last)}</text>',
             f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" '
             'class="axis"/>',
             f'<text x="{pad_l - 4}" y="{pad_t + 8}" class="tick" text-anchor="end">'
             f'{escape(_number(top))}</text>',
             f'<text x="{pad_l - 4}" y="{pad_t + h}" class="tick" text-anchor="end">0</text>']
    if len(points) >= 2:
        t0, t1 = points[0][0], points[-1][0]
        span = max(t1 - t0, 1e-3)
        for run in _runs(points):
            xy = [(pad_l + (t - t0) / span * w, pad_t + h - v / top * h) for t, v in run]
            if len(xy) == 1:
                parts.append(f'<circle cx="{xy[0][0]:.1f}" cy="{xy[0][1]:.1f}" r="2" '
                             'class="dot"/>')
            else:
                parts.append('<polyline points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
                             + '" class="line"/>')
        parts.append(f'<text x="{pad_l}" y="{height - 3}" class="tick">'
                     f'{escape(time.strftime("%H:%M", time.localtime(t0)))}</text>')
        parts.append(f'<text x="{pad_l + w}" y="{height - 3}" class="tick" text-anchor="end">'
                     f'{escape(time.strftime("%H:%M:%S", time.localtime(t1)))}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _runs(points):
    """The stretches of ``points`` without a gap (None); a lone point is its own
    stretch (drawn as a dot)."""
    run: list = []
    for t, v in points:
        if v is None:
            if run:
                yield run
            run = []
        else:
            run.append((t, v))
    if run:
        yield run


def sparkline(values: list[float | None], width: int = 120, height: int = 24) -> Markup:
    """A small line of ``values`` (None: 0), scaled to its own largest value."""
    known = [v or 0.0 for v in values]
    if len(known) < 2:
        return Markup(f'<svg class="spark" width="{width}" height="{height}"></svg>')
    top = max(known) or 1.0
    step = width / (len(known) - 1)
    xy = " ".join(f"{i * step:.1f},{height - 1 - v / top * (height - 2):.1f}"
                  for i, v in enumerate(known))
    return Markup(f'<svg class="spark" width="{width}" height="{height}">'
                  f'<polyline points="{xy}" class="line"/></svg>')


def disk_bar(used_ratio: float, lines: list[tuple[str, float]], width: int = 360,
             height: int = 44) -> Markup:
    """Disk use as a bar of ``width``, with a mark at each of ``lines`` (name, percent);
    the bar is coloured by the highest line it passed."""
    used = max(0.0, min(used_ratio * 100, 100.0))
    passed = [name for name, pct in lines if used >= pct]
    level = ("ok", "warn", "high", "full")[len(passed)]
    parts = [f'<svg class="chart" width="{width}" height="{height}" role="img" '
             f'aria-label="disk used {used:.1f}%">',
             f'<rect x="0" y="14" width="{width}" height="16" class="track"/>',
             f'<rect x="0" y="14" width="{used / 100 * width:.1f}" height="16" '
             f'class="fill {level}"/>']
    for i, (name, pct) in enumerate(lines):      # labels below and above in turn
        x = pct / 100 * width
        y = height - 2 if i % 2 == 0 else 10
        parts.append(f'<line x1="{x:.1f}" y1="12" x2="{x:.1f}" y2="34" class="mark"/>'
                     f'<text x="{x:.1f}" y="{y}" class="tick" text-anchor="middle">'
                     f'<title>{escape(name)}</title>{pct:.0f}%</text>')
    parts.append(f'<text x="0" y="10" class="tick">{used:.1f}% used</text></svg>')
    return Markup("".join(parts))


def lag_bars(queues: list[dict], width: int = 360) -> Markup:
    """One bar per queue: its lag (None: never committed) against the largest lag."""
    row = 18
    top = max((q["lag"] or 0 for q in queues), default=0) or 1
    height = row * len(queues) + 4
    parts = [f'<svg class="chart" width="{width}" height="{height}" role="img" '
             f'aria-label="lag per queue">']
    for i, q in enumerate(queues):
        y = i * row + 2
        lag = q["lag"]
        bar = 0 if lag is None else lag / top * (width - 110)
        parts.append(f'<text x="0" y="{y + 12}" class="tick">queue {q["queue"]}</text>'
                     f'<rect x="60" y="{y + 2}" width="{bar:.1f}" height="12" '
                     f'class="fill {"warn" if lag else "ok"}"/>'
                     f'<text x="{64 + bar:.1f}" y="{y + 12}" class="tick">'
                     f'{"-" if lag is None else lag}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
