"""Watch running jobs: a live web page, a JSON endpoint and Prometheus metrics.

``ss.local(dashboard=8080)`` starts :class:`DashboardServer` on 127.0.0.1 and sets
``engine.dashboard_url``; ``engine.shutdown()`` stops it. The DAG picture comes from
:mod:`slipstream.dashboard.layout` (a layered layout in pure Python) drawn by
:mod:`slipstream.dashboard.svg`, the same code ``slipstream dot --svg`` uses.
"""

from __future__ import annotations

from slipstream.dashboard.layout import Layout, edge_label, layout_dag
from slipstream.dashboard.server import DashboardServer
from slipstream.dashboard.stats import Sampler
from slipstream.dashboard.svg import dag_svg, render_svg

__all__ = ["DashboardServer", "Layout", "Sampler", "dag_svg", "edge_label", "layout_dag", "render_svg"]
