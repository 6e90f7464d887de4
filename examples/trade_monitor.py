"""Trade monitor: count and volume per ticker over a sliding window of a live trade stream.

    python examples/trade_monitor.py                       # runs until Ctrl-C
    python examples/trade_monitor.py --duration 30 --rate 50000
    python examples/trade_monitor.py --window-ms 2000 --slide-ms 500 --duration 6
    python examples/trade_monitor.py --engine spark --duration 20   # micro-batch epochs on Spark

The job, written with the Pipeline API (``build_pipeline``):

    read_from(generator of trades).with_timestamps(trade_ts, lag)
      .group_by(ticker).window(sliding_window_def(window, slide))
      .aggregate(all_of(counting(), summing(value)))
      .write_to(printer)   # one line per window: trades, volume, top 5 tickers by volume

It compiles to the two-stage sliding window of Jet's trade-monitor benchmark, which
``build_dag`` wires by hand with the Core API (``--core`` runs that one):

    generator (trades) -> insert_watermarks (fixed lag, throttled by frame)
      -> accumulate_by_frame      (local edge, partitioned by ticker)
      -> combine_to_sliding_window (distributed edge, partitioned by ticker)
      -> printer

Trades carry the wall-clock time (ms) at which they were made, shifted back by a random
disorder of up to ``--disorder-ms``; the watermark trails the highest timestamp by
``--lag-ms`` (which must cover the disorder, or trades get dropped as late and counted
in the summary). So event time follows real time and a window ``[start, end)`` closes
``lag`` ms after ``end`` on the wall clock. The very first windows start before the
first trade and are only partly filled: a 10 s window is full from the tenth second on.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import slipstream as ss
from slipstream import DAG, Edge, JobConfig, sinks, sources
from slipstream import processors as P
from slipstream.aggregate import AggregateOperation, all_of, counting, summing
from slipstream.core.inbox import Inbox
from slipstream.watermark import with_fixed_lag
from slipstream.window import KeyedWindowResult, SlidingWindowDef, sliding_window_def

TICKERS = (
    "AAPL MSFT NVDA AMZN GOOG META TSLA AVGO ORCL ADBE CRM AMD INTC CSCO NFLX QCOM TXN IBM SAP ASML"
).split()
_BASE_PRICE = (
    190,
    420,
    880,
    180,
    165,
    500,
    175,
    1300,
    125,
    480,
    290,
    160,
    31,
    48,
    620,
    170,
    165,
    185,
    190,
    900,
)
# A few tickers trade much more than others (weight 1/rank), so the top 5 means something.
_TICKER_TABLE = [t for rank, t in enumerate(TICKERS) for _ in range(max(1, 60 // (rank + 1)))]


class Trade(NamedTuple):
    ticker: str
    price: float
    quantity: int
    timestamp_ms: int


def _mix(seq: int) -> int:
    """A cheap deterministic 64-bit hash of the sequence number (splitmix64's finaliser),
    so trade ``seq`` is the same on every run and costs no random-generator state."""
    z = (seq * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


class TradeMaker:
    """``fn(seq)`` of the generator source: trade ``seq`` stamped with the wall clock.

    A class (not a closure) so that it pickles for the Spark engine.
    """

    def __init__(self, disorder_ms: int) -> None:
        self.disorder = disorder_ms + 1

    def __call__(self, seq: int) -> Trade:
        h = _mix(seq)
        table = _TICKER_TABLE
        i = h % len(table)
        ticker = table[i]
        base = _BASE_PRICE[TICKERS.index(ticker)]
        price = round(base * (0.98 + ((h >> 16) % 4001) / 100_000), 2)
        quantity = 1 + (h >> 32) % 500
        ts = time.time_ns() // 1_000_000 - (h >> 48) % self.disorder
        return Trade(ticker, price, quantity, ts)


def trade_ts(t: Trade) -> int:
    return t.timestamp_ms


def trade_ticker(t: Trade) -> str:
    return t.ticker


def trade_value(t: Trade) -> float:
    return t.price * t.quantity


def result_key(r: KeyedWindowResult) -> Any:
    return r.key


def count_and_volume() -> AggregateOperation[Any, Any, Any]:
    """(number of trades, traded value) per ticker."""
    return all_of(counting(), summing(trade_value))


class WatermarkPolicyFactory:
    """``policy_factory`` of insert_watermarks: a fixed lag throttled to frame boundaries
    (windows change only at frame boundaries, so finer watermarks would be wasted work)."""

    def __init__(self, lag_ms: int, window_def: SlidingWindowDef) -> None:
        self.lag_ms = lag_ms
        self.window_def = window_def

    def __call__(self) -> Any:
        return with_fixed_lag(self.lag_ms).throttle_by_frame(self.window_def)


# -- output ------------------------------------------------------------------------------


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def _money(v: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= div:
            return f"{v / div:.1f}{unit}"
    return f"{v:.0f}"


def format_window(
    start: int, end: int, per_ticker: dict[str, tuple[int, float]], top: int = 5
) -> str:
    """One line: the window, its totals and the ``top`` tickers by traded value."""
    trades = sum(c for c, _ in per_ticker.values())
    volume = sum(v for _, v in per_ticker.values())
    best = sorted(per_ticker.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    tops = "  ".join(f"{t} {_money(v)}" for t, (_, v) in best)
    span = f"[{_clock(start)} - {_clock(end)})"
    return f"{span}  {trades:>8,} trades  ${_money(volume):>7}  top: {tops}"


class WindowPrinter(ss.AbstractProcessor):
    """Prints each window as one line once the watermark says it is complete.

    The combining processors emit the results of window ``E`` before forwarding a
    watermark ``>= E``, and this sink sees a watermark only after every combiner sent it,
    so on watermark ``W`` every window ``E <= W`` is complete. ``complete()`` prints what
    is left (a bounded run). Non-cooperative: printing may block on a slow terminal.
    """

    def __init__(self, out: Callable[[str], None] | None = None) -> None:
        self._out = out
        self._closed = False
        self._windows: dict[tuple[int, int], dict[str, tuple[int, float]]] = {}

    def is_cooperative(self) -> bool:
        return False

    def process(self, ordinal: int, inbox: Inbox) -> None:
        windows = self._windows
        for r in inbox:
            windows.setdefault((r.start, r.end), {})[r.key] = r.value
        inbox.clear()

    def try_process_watermark(self, watermark: ss.Watermark) -> bool:
        self._print_up_to(watermark.timestamp)
        return True

    def complete(self) -> bool:
        self._print_up_to(None)
        return True

    def _print_up_to(self, limit: int | None) -> None:
        ready = sorted(k for k in self._windows if limit is None or k[1] <= limit)
        now = time.time_ns() // 1_000_000
        for start, end in ready:
            line = format_window(start, end, self._windows.pop((start, end)))
            if limit is not None:
                line += f"  (+{now - end} ms)"
            if self._out is not None:
                self._out(line)
            elif not self._closed:
                try:
                    print(line, flush=True)
                except BrokenPipeError:  # e.g. piped into `head`: keep running quietly
                    self._closed = True
        if ready:
            self.context.increment_metric("windows_printed", len(ready))


# -- the job -----------------------------------------------------------------------------


def build_pipeline(
    rate: float,
    window_def: SlidingWindowDef,
    lag_ms: int,
    disorder_ms: int,
    max_items: int | None = None,
    sink: Any = WindowPrinter,
    trades: Any = None,
) -> ss.Pipeline:
    """The trade monitor as a pipeline; ``sink`` is the supplier of the last stage and
    ``trades`` (default: the generator) the source's."""
    if trades is None:
        trades = sources.generator(TradeMaker(disorder_ms), rate, max_items=max_items)
    p = ss.Pipeline()
    (
        # one generator: a single substream whose disorder the lag covers
        p.read_from(trades)
        .set_name("trades")
        .set_local_parallelism(1)
        .with_timestamps(trade_ts, lag_ms)
        .set_name("watermarks")
        .group_by(trade_ticker)
        .window(window_def)
        .aggregate(count_and_volume())
        .set_name("sliding-window")
        .write_to(sink)
        .set_name("print")
    )
    return p


def build_dag(
    rate: float,
    window_def: SlidingWindowDef,
    lag_ms: int,
    disorder_ms: int,
    max_items: int | None = None,
    sink: Any = WindowPrinter,
    trades: Any = None,
) -> DAG:
    """The same job hand-wired with the Core API."""
    if trades is None:
        trades = sources.generator(TradeMaker(disorder_ms), rate, max_items=max_items)
    dag = DAG()
    # One generator and one watermark inserter: a single substream whose disorder is
    # bounded by ``disorder_ms``, which the lag covers.
    trades_v = dag.new_vertex("trades", trades).local_parallelism(1)
    wms = dag.new_vertex(
        "watermarks", P.insert_watermarks(trade_ts, WatermarkPolicyFactory(lag_ms, window_def))
    ).local_parallelism(1)
    frames = dag.new_vertex(
        "accumulate-by-frame",
        P.accumulate_by_frame(
            key_fn=trade_ticker,
            timestamp_fn=trade_ts,
            window_def=window_def,
            agg_op=count_and_volume(),
        ),
    )
    windows = dag.new_vertex(
        "sliding-window",
        P.combine_to_sliding_window(window_def=window_def, agg_op=count_and_volume()),
    )
    out = dag.new_vertex("print", sink).local_parallelism(1)
    dag.edge(Edge.between(trades_v, wms))
    dag.edge(Edge.between(wms, frames).partitioned(trade_ticker))
    dag.edge(Edge.between(frames, windows).distributed().partitioned(result_key))
    dag.edge(Edge.between(windows, out))
    return dag


def watch_dag(
    rate: float = 5_000.0, window_ms: int = 10_000, slide_ms: int = 1_000
) -> ss.Pipeline:
    """The job for ``slipstream run examples/trade_monitor.py:watch_dag --dashboard 8080``
    (``-- --rate 20000`` or ``--arg rate=20000`` to change the rate): the pipeline, which
    the dashboard shows as the DAG it compiled to."""
    return build_pipeline(rate, sliding_window_def(window_ms, slide_ms), 300, 200)


def _late_dropped(metrics: dict[str, dict[str, int]]) -> int:
    return sum(m.get("late_items_dropped", 0) for m in metrics.values())


def run_local(a: argparse.Namespace, window_def: SlidingWindowDef) -> int:
    engine = ss.local()
    build = build_dag if a.core else build_pipeline
    dag = build(a.rate, window_def, a.lag_ms, a.disorder_ms)
    forever = "until Ctrl-C" if a.duration is None else f"for {a.duration:g} s"
    print(
        f"trade monitor: {a.rate:,.0f} trades/s, window {a.window_ms / 1000:g} s sliding by "
        f"{a.slide_ms / 1000:g} s, lag {a.lag_ms} ms, running {forever}",
        flush=True,
    )
    print(
        "each line: [window) trades  volume  top 5 tickers by volume  (+ms after window end);\n"
        "the first windows began before the stream did, so they are only partly filled",
        flush=True,
    )
    stop = threading.Event()
    # Ctrl-C ends the run cleanly (cancel, summary) instead of a traceback
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set()) if in_main else None
    t0 = time.monotonic()
    job = engine.new_job(dag, JobConfig(name="trade-monitor"))
    try:
        while not stop.is_set():
            remaining = None if a.duration is None else a.duration - (time.monotonic() - t0)
            if remaining is not None and remaining <= 0:
                break
            stop.wait(0.2 if remaining is None else min(0.2, remaining))
            if job.status.is_terminal:
                break
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
    return _stop_and_summarize(
        job, time.monotonic() - t0, lambda m: m.get("print", {}).get("windows_printed", 0), 10
    )


def _stop_and_summarize(
    job: Any, elapsed: float, windows_printed: Any, join_timeout: float
) -> int:
    """Cancel the (streaming) job, wait for it, print the summary; the exit code."""
    job.cancel()
    try:
        job.join(timeout=join_timeout)
    except ss.JobCancelledError:
        pass
    except ss.JobFailedError as e:
        print(f"the job failed: {e}", file=sys.stderr)
        return 1
    metrics = job.metrics
    trades = metrics.get("trades", {}).get("items_out", 0)
    print(
        f"summary: {trades:,} trades in {elapsed:.1f} s ({trades / elapsed:,.0f}/s), "
        f"{windows_printed(metrics)} windows printed, {_late_dropped(metrics)} late trades "
        "dropped",
        flush=True,
    )
    return 0


def run_spark(a: argparse.Namespace, window_def: SlidingWindowDef) -> int:
    """On Spark the job runs as micro-batch epochs of ``--epoch-ms`` (the driver-driven
    streaming mode): each epoch's closed windows reach the driver's list, and are printed
    as they arrive."""
    import tempfile

    engine = ss.spark()
    build = build_dag if a.core else build_pipeline
    dag = build(a.rate, window_def, a.lag_ms, a.disorder_ms, sink=sinks.list_sink("windows"))
    forever = "until Ctrl-C" if a.duration is None else f"for {a.duration:g} s"
    print(
        f"trade monitor on Spark: {a.rate:,.0f} trades/s in epochs of {a.epoch_ms} ms, "
        f"window {a.window_ms / 1000:g} s sliding by {a.slide_ms / 1000:g} s, running {forever}",
        flush=True,
    )
    checkpoint = tempfile.mkdtemp(prefix="slipstream-trade-monitor-")
    t0 = time.monotonic()
    job = engine.new_job(
        dag,
        JobConfig(name="trade-monitor"),
        streaming=True,
        epoch_ms=a.epoch_ms,
        checkpoint_location=checkpoint,
    )
    results = engine.get_list("windows")
    printed = 0
    shown = 0
    windows: dict[tuple[int, int], dict[str, tuple[int, float]]] = {}
    try:
        while a.duration is None or time.monotonic() - t0 < a.duration:
            time.sleep(0.2)
            for r in results[printed:]:
                windows.setdefault((r.start, r.end), {})[r.key] = r.value
            printed = len(results)
            # a window is complete once a later one has results (they arrive in order)
            for key in sorted(windows)[:-1]:
                print(format_window(*key, windows.pop(key)), flush=True)
                shown += 1
            if job.status.is_terminal:
                break
    except KeyboardInterrupt:
        pass
    code = _stop_and_summarize(job, time.monotonic() - t0, lambda _m: shown, 60)
    engine.shutdown()
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--duration", type=float, default=None, help="seconds to run (default: until Ctrl-C)"
    )
    ap.add_argument("--rate", type=float, default=20_000, help="trades per second (default 20,000)")
    ap.add_argument("--window-ms", type=int, default=10_000, help="window size (default 10,000)")
    ap.add_argument("--slide-ms", type=int, default=1_000, help="window slide (default 1,000)")
    ap.add_argument("--lag-ms", type=int, default=300, help="watermark lag (default 300)")
    ap.add_argument(
        "--disorder-ms", type=int, default=200, help="max timestamp disorder (default 200)"
    )
    ap.add_argument("--engine", choices=["local", "spark"], default="local")
    ap.add_argument("--core", action="store_true", help="run the hand-wired Core API DAG")
    ap.add_argument(
        "--epoch-ms", type=int, default=1000, help="Spark micro-batch epoch (default 1,000)"
    )
    a = ap.parse_args(argv)
    if a.rate <= 0:
        ap.error(f"--rate must be > 0, got {a.rate}")
    if a.duration is not None and a.duration <= 0:
        ap.error(f"--duration must be > 0, got {a.duration}")
    if a.lag_ms < 0 or a.disorder_ms < 0:
        ap.error("--lag-ms and --disorder-ms must be >= 0")
    try:
        window_def = sliding_window_def(a.window_ms, a.slide_ms)
    except ValueError as e:
        ap.error(f"--window-ms/--slide-ms: {e}")
    if a.engine == "spark":
        return run_spark(a, window_def)
    return run_local(a, window_def)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        # stdout was closed by the reader; exit quietly (Python's documented idiom)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
