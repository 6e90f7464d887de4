"""A layered ("Sugiyama") layout of a DAG, computed in pure Python.

Both the live dashboard and ``slipstream dot --svg`` draw the DAG from this one layout,
so no Graphviz binary and no browser-side script is needed. The steps are the classic
ones, kept small because job DAGs are small (tens of vertices):

1. layer = longest path from a source, so every edge points to a later layer;
2. an edge spanning several layers gets a *dummy* node in each layer it crosses, so it
   bends around the vertices in between instead of running through them;
3. within a layer, nodes are ordered by the barycentre (mean position) of their
   neighbours in the previous layer, then the next, for a few sweeps: this removes most
   edge crossings;
4. layers become columns (data flows left to right), nodes rows; columns are as wide
   as their widest box, and the gap after a column as wide as the widest edge label
   in it (labels wrap to lines of at most :data:`LABEL_LINE_MAX` characters),
   so a label never runs under a box and a DAG is no wider than its labels need.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slipstream.core.dag import DAG, Edge, RoutingPolicy
from slipstream.dashboard.names import LAMBDA_TEXT_MAX, callable_name

#: Approximate width of one character of a vertex's name (bold 13 px sans-serif; names
#: are mostly lower case and hyphens) and of its parallelism (11 px): the box fits both
#: on one line.
CHAR_W = 7.4
PAR_CHAR_W = 6.6
NODE_H = 58.0
NODE_MIN_W = 176.0  # room for the live line "in 999.9k/s out 999.9k/s"
#: Approximate width of one character of the 11 px labels on edges (DejaVu Sans, the
#: widest of the usual sans-serif fonts, so the estimate errs on the wide side).
LABEL_CHAR_W = 6.6
LABEL_LINE_H = 13.0
#: Labels wrap at this many characters a line; a longer piece is cut with an ellipsis
#: (the SVG's tooltip has the label whole). A lambda's text is at most as long.
LABEL_LINE_MAX = LAMBDA_TEXT_MAX
LABEL_PAD = 14.0  # free space either side of a label, between the columns
COL_GAP = 64.0  # the narrowest gap between columns (room for the arrow)
ROW_GAP = 34.0
MARGIN = 20.0
SWEEPS = 6


@dataclass
class NodeBox:
    """A vertex's box: top-left corner ``(x, y)``, size ``(w, h)``."""

    name: str
    parallelism: str
    layer: int
    x: float = 0.0
    y: float = 0.0
    w: float = NODE_MIN_W
    h: float = NODE_H

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2


@dataclass
class EdgePath:
    """An edge as a polyline from the source box's right side to the destination box's
    left side, through the dummy nodes of the layers it crosses."""

    source: str
    dest: str
    label: str
    points: list[tuple[float, float]]
    distributed: bool
    routing: str
    #: ``label`` wrapped into lines, drawn centred on ``label_x`` with the last line's
    #: baseline at ``label_y`` (just above the edge, in the gap after its source column)
    label_lines: list[str] = field(default_factory=list)
    label_x: float = 0.0
    label_y: float = 0.0


@dataclass
class Layout:
    width: float
    height: float
    nodes: dict[str, NodeBox] = field(default_factory=dict)
    edges: list[EdgePath] = field(default_factory=list)


def edge_label(e: Edge) -> str:
    """What an edge does, in words: ordinals, routing (with the key function or custom
    partitioner of a partitioned edge), priority and whether it is distributed."""
    return " \u00b7 ".join(" ".join(part) for part in label_parts(e))


def label_parts(e: Edge) -> list[list[str]]:
    """:func:`edge_label` as parts (joined by `` · ``), each a list of pieces that a
    wrapped label keeps on one line: ``partitioned by``, the key function's name, the
    partitioner."""
    parts = []
    if e.source_ordinal or e.dest_ordinal:
        parts.append([f"{e.source_ordinal}\u2192{e.dest_ordinal}"])
    routing = [e.routing.value]
    if e.routing is RoutingPolicy.PARTITIONED:
        key = callable_name(getattr(e, "key_fn", None))
        if key:
            routing = [f"{e.routing.value} by", key]
        if getattr(e, "partitioner", None) is not None:
            routing.append(f"({callable_name(e.partitioner) or 'custom'} partitioner)")
    parts.append(routing)
    if e.is_distributed:
        parts.append(["distributed"])
    if e.get_priority():
        parts.append([f"priority {e.get_priority()}"])
    return parts


def wrap_label(parts: list[list[str]]) -> list[str]:
    """A label (:func:`label_parts`) in lines of at most :data:`LABEL_LINE_MAX`
    characters, broken between pieces, never inside one (a key function's name stays
    whole); a piece longer than a line is cut with an ellipsis."""
    lines: list[str] = []
    for i, part in enumerate(parts):
        for j, piece in enumerate(part):
            if len(piece) > LABEL_LINE_MAX:
                piece = piece[: LABEL_LINE_MAX - 1] + "\u2026"
            sep = " \u00b7 " if j == 0 and i > 0 else " "
            if lines and len(lines[-1]) + len(sep) + len(piece) <= LABEL_LINE_MAX:
                lines[-1] += sep + piece
            else:
                lines.append(piece)
    return lines


def label_width(lines: list[str]) -> float:
    return LABEL_CHAR_W * max((len(line) for line in lines), default=0)


def layout_dag(dag: DAG, parallelism: dict[str, int] | None = None) -> Layout:
    """Place ``dag``'s vertices and route its edges. ``parallelism`` (vertex name ->
    total processors) labels the boxes; without it the declared local parallelism is
    shown (``default`` when unset)."""
    order = dag.topological_order()
    layer: dict[str, int] = {}
    for v in order:
        ins = [layer[e.source.name] for e in dag.inbound_edges(v)]
        layer[v.name] = 1 + max(ins) if ins else 0
    depth = 1 + max(layer.values(), default=-1)

    # rows per layer: real vertex names and dummy ids
    rows: list[list[str]] = [[] for _ in range(depth)]
    for v in order:
        rows[layer[v.name]].append(v.name)
    chains: list[tuple[Edge, list[str]]] = []  # edge, the node ids it passes through
    up: dict[str, list[str]] = {}  # node id -> predecessors in the previous layer
    down: dict[str, list[str]] = {}
    for i, e in enumerate(dag.edges):
        assert e.dest is not None
        s, d = e.source.name, e.dest.name
        path = [s]
        for lay in range(layer[s] + 1, layer[d]):
            dummy = f"\0{i}:{lay}"
            rows[lay].append(dummy)
            path.append(dummy)
        path.append(d)
        for a, b in zip(path, path[1:], strict=False):
            down.setdefault(a, []).append(b)
            up.setdefault(b, []).append(a)
        chains.append((e, path))

    _order_rows(rows, up, down)

    nodes: dict[str, NodeBox] = {}
    for v in order:
        if parallelism and v.name in parallelism:
            par = f"\u00d7{parallelism[v.name]}"
        else:
            lp = v.get_local_parallelism()
            par = "\u00d7default" if lp == -1 else f"\u00d7{lp} per member"
        w = max(NODE_MIN_W, CHAR_W * len(v.name) + PAR_CHAR_W * len(par) + 28)
        nodes[v.name] = NodeBox(v.name, par, layer[v.name], w=w)

    # each edge's label, wrapped; the gap after a column fits the widest label of the
    # edges that leave it (an edge is labelled on its first gap only)
    labels = [wrap_label(label_parts(e)) for e, _ in chains]
    gaps = [COL_GAP] * depth
    for (_, path), lines in zip(chains, labels, strict=True):
        lay = layer[path[0]]
        gaps[lay] = max(gaps[lay], label_width(lines) + 2 * LABEL_PAD)

    # columns: x from the widest box of each layer; rows: centred vertically
    col_x: list[float] = []
    col_w: list[float] = []
    x = MARGIN
    for lay in range(depth):
        col_x.append(x)
        col_w.append(max((nodes[n].w for n in rows[lay] if n in nodes), default=40.0))
        x += col_w[lay] + gaps[lay]
    width = x - (gaps[-1] if depth else 0.0) + MARGIN
    tallest = max((len(r) for r in rows), default=1)
    height = 2 * MARGIN + tallest * NODE_H + (tallest - 1) * ROW_GAP + 24
    pos: dict[str, tuple[float, float]] = {}  # node id -> (x, centre y)
    for lay, row in enumerate(rows):
        span = len(row) * NODE_H + (len(row) - 1) * ROW_GAP
        top = (height - span) / 2
        for k, n in enumerate(row):
            cy = top + k * (NODE_H + ROW_GAP) + NODE_H / 2
            if n in nodes:
                box = nodes[n]
                box.x, box.y = col_x[lay], cy - NODE_H / 2
                pos[n] = (box.x, cy)
            else:
                pos[n] = (col_x[lay], cy)

    out = Layout(width=width, height=height, nodes=nodes)
    stacked: dict[tuple[str, str], float] = {}  # labels already above an edge's gap
    for (e, path), lines in zip(chains, labels, strict=True):
        sb, db = nodes[path[0]], nodes[path[-1]]
        lay = layer[sb.name]
        col_right = col_x[lay] + col_w[lay]
        # out of the box's right side to its column's edge, across each gap, and through
        # the column of each dummy node (a row of its own there) to the next gap
        pts = [(sb.x + sb.w, sb.cy)]
        if col_right > pts[-1][0]:
            pts.append((col_right, sb.cy))
        gap_start = len(pts) - 1  # the first gap runs from this point to the next
        for i, dummy in enumerate(path[1:-1]):
            dx, dy = pos[dummy]
            pts.append((dx, dy))
            pts.append((dx + col_w[lay + 1 + i], dy))
        pts.append((db.x, db.cy))
        (x0, y0), (x1, y1) = pts[gap_start], pts[gap_start + 1]
        above = stacked.get((sb.name, db.name), 0.0)
        stacked[(sb.name, db.name)] = above + len(lines) * LABEL_LINE_H + 2
        out.edges.append(
            EdgePath(
                sb.name,
                db.name,
                edge_label(e),
                pts,
                e.is_distributed,
                e.routing.value,
                label_lines=lines,
                label_x=(x0 + x1) / 2,
                label_y=(y0 + y1) / 2 - 5 - above,
            )
        )
    _make_room_above(out)
    return out


def _make_room_above(out: Layout) -> None:
    """Move everything down when the topmost label would start above the picture."""
    tops = [e.label_y - len(e.label_lines) * LABEL_LINE_H for e in out.edges]
    shift = MARGIN / 2 - min(tops, default=MARGIN)
    if shift <= 0:
        return
    for n in out.nodes.values():
        n.y += shift
    for e in out.edges:
        e.points = [(x, y + shift) for x, y in e.points]
        e.label_y += shift
    out.height += shift


def _order_rows(rows: list[list[str]], up: dict[str, list[str]], down: dict[str, list[str]]) -> None:
    """Barycentre sweeps, down then up, keeping the ordering with fewest crossings."""

    def crossings() -> int:
        total = 0
        for lay in range(len(rows) - 1):
            idx = {n: i for i, n in enumerate(rows[lay + 1])}
            pairs = [(i, idx[b]) for i, a in enumerate(rows[lay]) for b in down.get(a, [])]
            total += sum(
                1
                for p in range(len(pairs))
                for q in range(p + 1, len(pairs))
                if (pairs[p][0] - pairs[q][0]) * (pairs[p][1] - pairs[q][1]) < 0
            )
        return total

    best = [list(r) for r in rows]
    best_c = crossings()
    for sweep in range(SWEEPS):
        downward = sweep % 2 == 0
        rng = range(1, len(rows)) if downward else range(len(rows) - 2, -1, -1)
        for lay in rng:
            ref = rows[lay - 1] if downward else rows[lay + 1]
            where = {n: i for i, n in enumerate(ref)}
            nbrs = up if downward else down
            keyed = []
            for i, n in enumerate(rows[lay]):
                ps = [where[p] for p in nbrs.get(n, []) if p in where]
                keyed.append((sum(ps) / len(ps) if ps else float(i), i, n))
            keyed.sort()
            rows[lay] = [n for _, _, n in keyed]
        c = crossings()
        if c < best_c:
            best, best_c = [list(r) for r in rows], c
    rows[:] = best
