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
   as their widest label.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slipstream.core.dag import DAG, Edge, RoutingPolicy

#: Approximate width of one character of the 13 px sans-serif font the SVG uses.
CHAR_W = 7.4
NODE_H = 58.0
NODE_MIN_W = 176.0  # room for the live line "in 999.9k/s out 999.9k/s"
COL_GAP = 150.0
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


@dataclass
class Layout:
    width: float
    height: float
    nodes: dict[str, NodeBox] = field(default_factory=dict)
    edges: list[EdgePath] = field(default_factory=list)


def edge_label(e: Edge) -> str:
    """What an edge does, in words: ordinals, routing (with the key function or custom
    partitioner of a partitioned edge), priority and whether it is distributed."""
    parts = []
    if e.source_ordinal or e.dest_ordinal:
        parts.append(f"{e.source_ordinal}\u2192{e.dest_ordinal}")
    routing = e.routing.value
    if e.routing is RoutingPolicy.PARTITIONED:
        key = _callable_name(getattr(e, "key_fn", None))
        routing += f" by {key}" if key else ""
        if getattr(e, "partitioner", None) is not None:
            routing += f" ({_callable_name(e.partitioner) or 'custom'} partitioner)"
    parts.append(routing)
    if e.is_distributed:
        parts.append("distributed")
    if e.get_priority():
        parts.append(f"priority {e.get_priority()}")
    return " \u00b7 ".join(parts)


def _callable_name(fn: object) -> str:
    if fn is None:
        return ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not name:
        return type(fn).__name__
    name = str(name).rsplit("<locals>.", 1)[-1]
    return "lambda" if name.endswith("<lambda>") else name


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
        w = max(NODE_MIN_W, CHAR_W * max(len(v.name) + 2, len(par) + 14) + 20)
        nodes[v.name] = NodeBox(v.name, par, layer[v.name], w=w)

    # columns: x from the widest box of each layer; rows: centred vertically
    col_x: list[float] = []
    x = MARGIN
    for lay in range(depth):
        col_x.append(x)
        widest = max((nodes[n].w for n in rows[lay] if n in nodes), default=40.0)
        x += widest + COL_GAP
    width = x - COL_GAP + MARGIN
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
    for e, path in chains:
        sb, db = nodes[path[0]], nodes[path[-1]]
        pts = [(sb.x + sb.w, sb.cy)]
        for dummy in path[1:-1]:
            dx, dy = pos[dummy]
            pts.append((dx + 20.0, dy))
        pts.append((db.x, db.cy))
        out.edges.append(
            EdgePath(sb.name, db.name, edge_label(e), pts, e.is_distributed, e.routing.value)
        )
    return out


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
