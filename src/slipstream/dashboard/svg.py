"""Draw a :class:`~slipstream.dashboard.layout.Layout` as a self-contained SVG.

Each vertex is a ``<g class="vertex" data-vertex="NAME">`` with its name and
parallelism as text and empty slots (``.m-rate``, ``.m-wm``, the ``.m-fill`` bar) that
the dashboard page fills in live; ``slipstream dot --svg`` leaves them empty.
Distributed edges are dashed; every edge carries its routing label (wrapped to lines,
placed by the layout in the gap after the source's column) and the whole label as a
tooltip.
"""

from __future__ import annotations

from html import escape

from slipstream.core.dag import DAG
from slipstream.dashboard.layout import LABEL_LINE_H, Layout, layout_dag

_STYLE = """
.vertex rect.box{fill:#f4f7fb;stroke:#35608f;stroke-width:1.5}
.vertex .name{font:600 13px sans-serif;fill:#14233a}
.vertex .par{font:11px sans-serif;fill:#5a6b80}
.vertex .m-rate,.vertex .m-wm{font:11px monospace;fill:#14233a}
.vertex rect.fillbg{fill:#dfe6ee}
.vertex rect.m-fill{fill:#3a9a5b}
.edge path{fill:none;stroke:#6b7b90;stroke-width:1.4}
.edge.distributed path{stroke-dasharray:6 4}
.edge text{font:11px sans-serif;fill:#4a5666;paint-order:stroke;stroke:#fff;stroke-width:3px}
"""


def render_svg(layout: Layout, title: str = "") -> str:
    """The SVG document text for ``layout``."""
    w, h = layout.width, layout.height
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dag" width="{w:.0f}" height="{h:.0f}" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" role="img" aria-label="{escape(title or "DAG")}">',
        f"<style>{_STYLE}</style>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" '
        'fill="#6b7b90"/></marker></defs>',
        '<rect width="100%" height="100%" fill="#ffffff"/>',
    ]
    if title:
        out.append(f'<text x="12" y="16" class="title" font-size="12">{escape(title)}</text>')
    for e in layout.edges:
        cls = "edge distributed" if e.distributed else "edge"
        pts = e.points
        d = f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            mx = (x0 + x1) / 2
            d += f" C{mx:.1f},{y0:.1f} {mx:.1f},{y1:.1f} {x1:.1f},{y1:.1f}"
        nl = len(e.label_lines)
        spans = "".join(
            f'<tspan x="{e.label_x:.1f}" y="{e.label_y - (nl - 1 - i) * LABEL_LINE_H:.1f}">{escape(line)}</tspan>'
            for i, line in enumerate(e.label_lines)
        )
        out.append(
            f'<g class="{cls}" data-source="{escape(e.source)}" data-dest="{escape(e.dest)}">'
            f"<title>{escape(e.source)} \u2192 {escape(e.dest)}: {escape(e.label)}</title>"
            f'<path d="{d}" marker-end="url(#arrow)"/>'
            f'<text text-anchor="middle">{spans}</text></g>'
        )
    for n in layout.nodes.values():
        x, y = n.x, n.y
        out.append(
            f'<g class="vertex" data-vertex="{escape(n.name)}">'
            f'<title>{escape(n.name)}</title>'
            f'<rect class="box" x="{x:.1f}" y="{y:.1f}" width="{n.w:.1f}" height="{n.h:.1f}" rx="6"/>'
            f'<text class="name" x="{x + 8:.1f}" y="{y + 17:.1f}">{escape(n.name)}</text>'
            f'<text class="par" x="{x + n.w - 8:.1f}" y="{y + 17:.1f}" '
            f'text-anchor="end">{escape(n.parallelism)}</text>'
            f'<text class="m-rate" x="{x + 8:.1f}" y="{y + 33:.1f}"></text>'
            f'<text class="m-wm" x="{x + 8:.1f}" y="{y + 46:.1f}"></text>'
            f'<rect class="fillbg" x="{x + 1:.1f}" y="{y + n.h - 5:.1f}" width="{n.w - 2:.1f}" height="4"/>'
            f'<rect class="m-fill" x="{x + 1:.1f}" y="{y + n.h - 5:.1f}" width="0" height="4" '
            f'data-full="{n.w - 2:.1f}"/></g>'
        )
    out.append("</svg>")
    return "\n".join(out)


def dag_svg(dag: DAG, parallelism: dict[str, int] | None = None, title: str = "") -> str:
    """Lay out and draw ``dag`` in one call."""
    return render_svg(layout_dag(dag, parallelism), title)
