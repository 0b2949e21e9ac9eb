"""Charts as inline SVG, rendered on the server (no JavaScript chart library)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from markupsafe import Markup

_W, _H, _PAD_L, _PAD_B, _PAD_T = 520, 160, 56, 22, 10


def _fmt(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def line_chart(
    points: Sequence[tuple[float, float]],
    *,
    title: str,
    unit: str = "",
    fmt: Callable[[float], str] = _fmt,
    x_label: Callable[[float], str] | None = None,
) -> Markup:
    """A line chart of ``(x, y)`` points (x ascending), with min/max labels. Fewer than
    two points: a short note instead of a line."""
    label = escape(title)
    if len(points) < 2:
        body = (
            f'<text x="{_W / 2:.0f}" y="{_H / 2:.0f}" text-anchor="middle" class="muted">'
            "collecting samples…</text>"
        )
        return Markup(
            f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{label}">'
            f"<title>{label}</title>{body}</svg>"
        )
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = 0.0, max(max(ys), 1e-9)
    iw, ih = _W - _PAD_L - 8, _H - _PAD_B - _PAD_T

    def px(x: float) -> float:
        return _PAD_L + (x - x0) / ((x1 - x0) or 1) * iw

    def py(y: float) -> float:
        return _PAD_T + ih - (y - y0) / ((y1 - y0) or 1) * ih

    path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    area = f"{px(x0):.1f},{py(0):.1f} {path} {px(x1):.1f},{py(0):.1f}"
    xl = x_label or (lambda v: "")
    parts = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{label}">',
        f"<title>{label}</title>",
        f'<line x1="{_PAD_L}" y1="{py(0):.1f}" x2="{_W - 8}" y2="{py(0):.1f}" class="axis"/>',
        f'<line x1="{_PAD_L}" y1="{_PAD_T}" x2="{_PAD_L}" y2="{py(0):.1f}" class="axis"/>',
        f'<text x="{_PAD_L - 4}" y="{py(y1) + 4:.1f}" text-anchor="end">{escape(fmt(y1))}{escape(unit)}</text>',
        f'<text x="{_PAD_L - 4}" y="{py(0) + 4:.1f}" text-anchor="end">0</text>',
        f'<text x="{_PAD_L}" y="{_H - 4}">{escape(xl(x0))}</text>',
        f'<text x="{_W - 8}" y="{_H - 4}" text-anchor="end">{escape(xl(x1))}</text>',
        f'<polygon points="{area}" class="area"/>',
        f'<polyline points="{path}" class="line"/>',
        "</svg>",
    ]
    return Markup("".join(parts))


def bar_chart(items: Sequence[tuple[str, float, str | None]], *, title: str) -> Markup:
    """Horizontal bars: ``(label, value, href)``; the value printed after each bar."""
    label = escape(title)
    if not items:
        return Markup(f'<p class="muted">{label}: nothing to show</p>')
    row = 22
    h = row * len(items) + 6
    vmax = max(v for _, v, _ in items) or 1
    left, right = 120, 60
    iw = _W - left - right
    parts = [f'<svg class="chart bars" viewBox="0 0 {_W} {h}" role="img" aria-label="{label}">']
    parts.append(f"<title>{label}</title>")
    for i, (name, value, href) in enumerate(items):
        y = 3 + i * row
        w = max(1.0, value / vmax * iw) if value else 0.0
        text = f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{escape(name)}</text>'
        if href:
            text = f'<a href="{escape(href)}">{text}</a>'
        parts.append(text)
        parts.append(
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 8}" class="bar bar-{escape(name)}"/>'
        )
        parts.append(f'<text x="{left + w + 6:.1f}" y="{y + 15}">{value:g}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
