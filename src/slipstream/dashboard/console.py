"""Live progress in a terminal (`slipstream run`): a table per vertex that a person reads.

On a terminal the table refreshes in place (``rich``), with a progress bar and ETA for
bounded sources that know their size (files, lists); otherwise a plain line is printed
every ``interval`` seconds, so logs stay readable. The numbers come from the same
:class:`~slipstream.dashboard.stats.Sampler` as the dashboard's.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from slipstream.dashboard.stats import Sampler


def fmt_count(x: float) -> str:
    """``999``, ``12.8k``, ``3.4M``: three significant digits are what a person reads."""
    a = abs(x)
    if a >= 1e9:
        return f"{x / 1e9:.1f}G"
    if a >= 1e6:
        return f"{x / 1e6:.1f}M"
    if a >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}" if a >= 10 or float(x).is_integer() else f"{x:.1f}"


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f}ms" if abs(ms) < 1000 else f"{ms / 1000:.1f}s"


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def fmt_bytes(kb: int) -> str:
    """A resident set given in KiB: ``812KB``, ``45.0MB``, ``1.2GB``."""
    b = kb * 1024.0
    if b >= 1024**3:
        return f"{b / 1024**3:.1f}GB"
    if b >= 1024**2:
        return f"{b / 1024**2:.1f}MB"
    return f"{b / 1024:.0f}KB"


def fmt_share(share: float | None) -> str:
    """CPU seconds per second as a share of one core (``190%``: nearly two cores)."""
    return "-" if share is None else f"{share * 100:.0f}%"


def usage_cells(r: dict[str, Any]) -> list[str]:
    """A member's (or all members') items in and out, CPU time and share, RSS and peak."""
    return [
        fmt_count(r["items_in"]),
        fmt_count(r["items_out"]),
        f"{r['cpu_ms'] / 1000:.1f}s",
        fmt_share(r.get("cpu_share")),
        fmt_bytes(r["rss_kb"]),
        fmt_bytes(r["peak_rss_kb"]),
    ]


def member_cells(doc: dict[str, Any]) -> list[list[str]]:
    """A job whose members run in processes (``doc["members"]``, what the dashboard's
    Members table shows): per member and for all of them, ``[member, pid, state, items
    in, items out, CPU time, CPU now, RSS, peak RSS]``; ``[]`` for any other job."""
    rows = doc.get("members") or []
    total = doc.get("members_total")
    out = []
    for r in rows:
        out.append(
            [
                f"member {r['member']}",
                "-" if r.get("pid") is None else str(r["pid"]),
                r.get("state") or "",
                *usage_cells(r),
            ]
        )
    if rows and total:
        out.append(
            [
                "total",
                "",
                f"{total['members']} processes",
                *usage_cells(total),
            ]
        )
    return out


_MEMBER_COLUMNS = ["member", "pid", "state", "items in", "items out", "CPU", "CPU now", "RSS", "peak RSS"]


def _edges_note(vertex: dict[str, Any]) -> str:
    """``" (sum of 2 edges)"`` for a vertex with several outbound edges: ``items_out``
    counts an item once per edge it is sent on, so a source feeding two branches shows
    twice as many items out as it read."""
    n = vertex.get("out_edges", 0)
    return f" (sum of {n} edges)" if n > 1 else ""


class _Eta:
    """ETA of a bounded source from the rate of its progress since the first reading."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[float, int]] = {}

    def __call__(self, vertex: str, done: int, total: int, now: float) -> float | None:
        t0, d0 = self._first.setdefault(vertex, (now, done))
        if done >= total:
            return 0.0
        if now - t0 < 0.5 or done <= d0:
            return None
        return (total - done) / ((done - d0) / (now - t0))


class Progress:
    """Call :meth:`update` periodically and :meth:`close` at the end."""

    def __init__(self, job: Any, stream: TextIO | None = None, interval: float | None = None) -> None:
        self.job = job
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if interval is not None else (0.5 if self.tty else 5.0)
        self.sampler = Sampler(min_interval=0.0)
        self._eta = _Eta()
        self._last_print = 0.0
        self._live: Any = None
        if self.tty:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream)
            self._live = Live(console=console, auto_refresh=False, transient=False)
            self._live.start()

    def update(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last_print < self.interval:
            return
        self._last_print = now
        doc = self.sampler.describe(self.job)
        if self._live is not None:
            self._live.update(self.table(doc), refresh=True)
        else:
            print(self.line(doc), file=self.stream, flush=True)

    def close(self) -> None:
        self.update(final=True)
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- rendering -----------------------------------------------------------------------
    def line(self, doc: dict[str, Any]) -> str:
        """A plain block for logs: a header line, then one aligned line per vertex::

            [running 12s] trades, snapshot #3 (2s ago)
              trades      out 12.8k  3.0k/s
              windows     in 12.8k  3.0k/s  out 80  20/s  wm lag 1.2s  late 3
              parse       in 12.8k  3.0k/s  out 12.7k  3.0k/s  skipped 17

        A vertex with several outbound edges says so after its ``out`` figures, which
        count each item once per edge (``out 25.6k 6.0k/s (sum of 2 edges)``). A job
        whose members run in processes adds a line per member and their total::

              member 0  pid 4242  running  in 6.4k  out 6.4k  cpu 1.2s 95%  rss 45.0MB peak 50.1MB
              total     2 processes        in 12.8k out 12.8k cpu 2.4s 190% rss 90.0MB peak 100.2MB
        """
        head = f"[{doc['status']} {doc['elapsed_s'] or 0:.0f}s] {doc['name']}"
        if doc.get("snapshot"):
            s = doc["snapshot"]
            head += f", snapshot #{s['id']} ({s['age_s']:.0f}s ago)"
        if doc.get("error"):
            head += f", error: {doc['error']}"
        for w in doc.get("warnings") or ():
            head += f", warning: {w}"
        if doc.get("stages"):
            head += ", Spark stages " + ", ".join(
                f"#{x['id']} {x['tasks_done']}/{x['tasks_total']}" for x in doc["stages"][-3:]
            )
        width = max((len(v["name"]) for v in doc["vertices"]), default=0)
        lines = [head]
        for v in doc["vertices"]:
            p = f"  {v['name']:<{width}}"
            if v["items_in"] or v["in_rate"]:
                p += f"  in {fmt_count(v['items_in']):>6} {fmt_count(v['in_rate']):>6}/s"
            if v["items_out"] or v["out_rate"]:
                p += f"  out {fmt_count(v['items_out']):>6} {fmt_count(v['out_rate']):>6}/s"
                p += _edges_note(v)
            if v["watermark_lag_ms"] is not None:
                p += f"  wm lag {fmt_ms(v['watermark_lag_ms'])}"
            if v["late_items_dropped"]:
                p += f"  late {fmt_count(v['late_items_dropped'])}"
            if v.get("items_skipped"):
                p += f"  skipped {fmt_count(v['items_skipped'])}"
            if v["queue_fill"]:
                p += f"  queue {v['queue_fill'] * 100:.0f}%"
            if "progress" in v:
                done, total = v["progress"]["done"], v["progress"]["total"]
                eta = self._eta(v["name"], done, total, time.monotonic())
                pct = 100.0 * done / total if total else 100.0
                p += f"  {pct:.0f}% ETA {fmt_eta(eta)}"
            lines.append(p.rstrip())
        cells = member_cells(doc)
        if cells:
            widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
            for c in cells:
                who = f"{c[1]:>{widths[1]}}" if c[1] else " " * widths[1]
                lines.append(
                    f"  {c[0]:<{widths[0]}}  {'pid' if c[1] else '   '} {who}  "
                    f"{c[2]:<{widths[2]}}  in {c[3]:>{widths[3]}}  out {c[4]:>{widths[4]}}  "
                    f"cpu {c[5]:>{widths[5]}} {c[6]:>{widths[6]}}  "
                    f"rss {c[7]:>{widths[7]}} peak {c[8]:>{widths[8]}}"
                )
        return "\n".join(lines)

    def table(self, doc: dict[str, Any]) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        title = f"{doc['name']}: {doc['status']}, {doc['elapsed_s'] or 0:.0f} s"
        if doc.get("snapshot"):
            s = doc["snapshot"]
            title += f", snapshot #{s['id']} {s['age_s']:.0f} s ago"
        if doc.get("stages"):
            title += ", Spark stages " + ", ".join(
                f"#{x['id']} {x['tasks_done']}/{x['tasks_total']}" for x in doc["stages"][-3:]
            )
        t = Table(title=title, title_justify="left", box=None, pad_edge=False)
        cols = ["vertex", "procs", "in/s", "out/s", "total out", "wm lag", "queue", "late"]
        skipping = any(v.get("items_skipped") for v in doc["vertices"])
        if skipping:  # on_item_error set items aside
            cols.append("skipped")
        for col in cols:
            t.add_column(col, justify="left" if col == "vertex" else "right")
        bars = []
        for v in doc["vertices"]:
            fill = v["queue_fill"]
            t.add_row(
                v["name"],
                str(v["parallelism"] or "-"),
                fmt_count(v["in_rate"]),
                fmt_count(v["out_rate"]),
                fmt_count(v["items_out"]) + _edges_note(v),
                fmt_ms(v["watermark_lag_ms"]),
                "-" if fill is None else f"{fill * 100:.0f}%",
                fmt_count(v["late_items_dropped"]),
                *([fmt_count(v.get("items_skipped", 0))] if skipping else []),
            )
            if "progress" in v:
                done, total = v["progress"]["done"], v["progress"]["total"]
                eta = self._eta(v["name"], done, total, time.monotonic())
                bar = Table.grid(padding=(0, 1))
                pct = 100.0 * done / total if total else 100.0
                bar.add_row(
                    v["name"],
                    ProgressBar(total=max(total, 1), completed=min(done, total), width=40),
                    f"{pct:3.0f}%",
                    f"ETA {fmt_eta(eta)}",
                )
                bars.append(bar)
        cells = member_cells(doc)
        if cells:  # members in processes: a row per member and the total
            mt = Table(title="members", title_justify="left", box=None, pad_edge=False)
            for col in _MEMBER_COLUMNS:
                mt.add_column(col, justify="left" if col in ("member", "state") else "right")
            for c in cells:
                mt.add_row(*c)
            return Group(t, *bars, mt)
        return Group(t, *bars)
