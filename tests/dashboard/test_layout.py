"""The layered layout: every edge runs left to right, boxes never overlap, long edges
bend around the vertices in between, and the SVG is well-formed and names everything."""

from __future__ import annotations

import functools
import operator
import xml.etree.ElementTree as ET

from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream import DAG, Edge
from slipstream.dashboard import dag_svg, layout_dag
from slipstream.dashboard.layout import LABEL_LINE_H, label_width


def noop() -> None:
    return None


@st.composite
def dags(draw: st.DrawFn) -> DAG:
    n = draw(st.integers(1, 9))
    dag = DAG()
    vs = [dag.new_vertex(f"v{i}-" + "x" * draw(st.integers(0, 12)), noop) for i in range(n)]
    outs = [0] * n
    ins = [0] * n
    for j in range(1, n):
        for i in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            e = Edge.from_(vs[i], outs[i]).to(vs[j], ins[j])
            if draw(st.booleans()):
                e.distributed()
            dag.edge(e)
            outs[i] += 1
            ins[j] += 1
    return dag


@settings(max_examples=60, deadline=None)
@given(dags())
def test_edges_point_right_and_boxes_do_not_overlap(dag: DAG) -> None:
    lay = layout_dag(dag)
    assert set(lay.nodes) == {v.name for v in dag.vertices}
    for e in lay.edges:
        s, d = lay.nodes[e.source], lay.nodes[e.dest]
        assert d.layer > s.layer and d.x > s.x + s.w
        xs = [p[0] for p in e.points]
        assert xs == sorted(xs)
        # a bend point never sits inside a vertex's box
        for x, y in e.points[1:-1]:
            for b in lay.nodes.values():
                assert not (b.x <= x <= b.x + b.w and b.y <= y <= b.y + b.h)
    boxes = list(lay.nodes.values())
    for i, a in enumerate(boxes):
        assert 0 <= a.x and a.x + a.w <= lay.width and 0 <= a.y and a.y + a.h <= lay.height
        for b in boxes[i + 1 :]:
            assert a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y
    root = ET.fromstring(dag_svg(dag))
    texts = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert {v.name for v in dag.vertices} <= texts


def test_barycentre_ordering_untangles_a_crossing() -> None:
    # a->c, b->d, a listed first but c after d: the sweep must put c above d
    dag = DAG()
    b = dag.new_vertex("b", noop)
    a = dag.new_vertex("a", noop)
    d = dag.new_vertex("d", noop)
    c = dag.new_vertex("c", noop)
    dag.edge(Edge.between(a, c)).edge(Edge.between(b, d))
    lay = layout_dag(dag)
    assert (lay.nodes["a"].y < lay.nodes["b"].y) == (lay.nodes["c"].y < lay.nodes["d"].y)


def test_labels_show_routing_partitioning_priority_and_distribution() -> None:
    def by_user(item: object) -> object:
        return item

    dag = DAG()
    s = dag.new_vertex("s", noop)
    t = dag.new_vertex("t", noop).local_parallelism(3)
    dag.edge(Edge.between(s, t).partitioned(by_user).distributed().priority(2))
    dag.edge(Edge.from_(s, 1).to(t, 1).broadcast())
    labels = sorted(e.label for e in layout_dag(dag).edges)
    assert labels == ["1\u21921 \u00b7 broadcast", "partitioned by by_user \u00b7 distributed \u00b7 priority 2"]
    svg = dag_svg(dag)
    assert "\u00d73 per member" in svg and 'class="edge distributed"' in svg


def test_key_functions_are_named_by_what_they_do() -> None:
    first, second = (lambda t: t[0]), (lambda t: t.symbol)  # two on a line: told apart
    long = lambda trade: (trade.symbol, trade.exchange, trade.venue, trade.currency)  # noqa: E731

    def by_venue(t: object) -> object:
        return t

    dag = DAG()
    targets = {
        "itemgetter(0)": operator.itemgetter(0),
        "attrgetter('symbol')": operator.attrgetter("symbol"),
        "methodcaller('lower')": operator.methodcaller("lower"),
        "lambda t: t[0]": first,
        "lambda t: t.symbol": second,
        f"<lambda> at test_layout.py:{long.__code__.co_firstlineno}": long,
        "by_venue": by_venue,
        "partial(by_venue)": functools.partial(by_venue),
        "str.lower": str.lower,
    }
    for i, fn in enumerate(targets.values()):
        dag.edge(Edge.between(dag.new_vertex(f"s{i}", noop), dag.new_vertex(f"t{i}", noop)).partitioned(fn))
    labels = [e.label for e in layout_dag(dag).edges]
    assert labels == [f"partitioned by {name}" for name in targets]


def test_labels_fit_between_the_columns_and_inside_the_picture() -> None:
    # the browser test's DAG: long names, a lambda key; and two parallel edges whose
    # labels stack, the upper one above the top row (the picture grows to hold it)
    dag = DAG()
    a = dag.new_vertex("read-trades-from-kafka", noop)
    b = dag.new_vertex("count-trades-per-symbol-window", noop).local_parallelism(2)
    c = dag.new_vertex("write-counts-to-postgres", noop)
    dag.edge(Edge.between(a, b).partitioned(lambda t: (t.symbol, t.exchange), operator.itemgetter(0)).distributed())
    dag.edge(Edge.from_(a, 1).to(b, 1).broadcast().priority(1))
    dag.edge(Edge.between(b, c))
    lay = layout_dag(dag)
    first = lay.edges[0]
    assert first.label_lines == [
        "partitioned by",
        "lambda t: (t.symbol, t.exchange)",
        "(itemgetter(0) partitioner)",
        "distributed",
    ]
    assert first.label == (
        "partitioned by lambda t: (t.symbol, t.exchange) (itemgetter(0) partitioner) · distributed"
    )
    for e in lay.edges:
        w = label_width(e.label_lines)
        left, right = e.label_x - w / 2, e.label_x + w / 2
        top, bottom = e.label_y - len(e.label_lines) * LABEL_LINE_H, e.label_y + 3
        assert 0 <= left and right <= lay.width and 0 <= top and bottom <= lay.height, e
        for n in lay.nodes.values():
            assert right <= n.x or n.x + n.w <= left or bottom <= n.y or n.y + n.h <= top, (e, n)
    tops = sorted(e.label_y for e in lay.edges[:2])
    assert tops[1] - tops[0] >= LABEL_LINE_H  # stacked, not on top of each other
