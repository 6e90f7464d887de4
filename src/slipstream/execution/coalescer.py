"""Watermark coalescing (Jet's ``WatermarkCoalescer``, docs/semantics.md §3).

One coalescer merges the watermarks of several inputs: the queues of one edge, or the
edges (ordinals) of one processor. The output only moves when every live input has
reached it; idle inputs are left out of the minimum; finished inputs count as +infinity,
but "everything finished" never produces a watermark. When every input is idle, the top
observed watermark is emitted once and then the idle mark.
"""

from __future__ import annotations

from typing import Any

from slipstream.core.items import IDLE_MESSAGE, MAX_TIMESTAMP, NO_WATERMARK

#: Returned when nothing is to be emitted.
NO_NEW_WM: Any = None


class WatermarkOrderError(Exception):
    """A non-increasing watermark on one input (message names the input)."""


class WatermarkCoalescer:
    __slots__ = (
        "wm",
        "idle",
        "done",
        "last_emitted",
        "top_observed",
        "all_idle",
        "idle_pending",
        "input_names",
    )

    def __init__(self, input_count: int, input_names: list[str] | None = None) -> None:
        self.wm = [NO_WATERMARK] * input_count
        self.idle = [False] * input_count
        self.done = [False] * input_count
        self.last_emitted = NO_WATERMARK
        self.top_observed = NO_WATERMARK
        self.all_idle = False
        self.idle_pending = False
        self.input_names = input_names or [f"input {i}" for i in range(input_count)]

    def save_state(self) -> dict[str, Any]:
        """What this coalescer has seen, to continue in a new coalescer of the same inputs
        (:meth:`restore_state`): the Spark engine carries it from one micro-batch epoch's
        tasklet to the next, so that a new epoch does not start from "no watermark" on
        inputs that are silent in it. Which inputs finished is not part of it: a new
        epoch's inputs start live. Plain data (lists, ints, bools), a copy."""
        return {
            "wm": list(self.wm),
            "idle": list(self.idle),
            "last_emitted": self.last_emitted,
            "top_observed": self.top_observed,
            "all_idle": self.all_idle,
            "idle_pending": self.idle_pending,
        }

    def restore_state(self, state: dict[str, Any]) -> bool:
        """Continue from :meth:`save_state` of a coalescer of the same inputs. Returns
        ``False`` and changes nothing if ``state`` is of another number of inputs."""
        if len(state["wm"]) != len(self.wm):
            return False
        self.wm = list(state["wm"])
        self.idle = list(state["idle"])
        self.last_emitted = state["last_emitted"]
        self.top_observed = state["top_observed"]
        self.all_idle = state["all_idle"]
        self.idle_pending = state["idle_pending"]
        return True

    def observe_event(self, i: int) -> None:
        """Data arrived on input ``i``: an idle input becomes active again."""
        if self.idle[i]:
            self.idle[i] = False
            self.all_idle = False

    def observe_wm(self, i: int, value: Any) -> Any:
        """A watermark (int timestamp) or :data:`IDLE_MESSAGE` arrived on input ``i``.
        Returns the watermark timestamp to emit, ``IDLE_MESSAGE`` or ``NO_NEW_WM``."""
        if self.done[i]:
            raise WatermarkOrderError(f"watermark {value!r} received on {self.input_names[i]} after it finished")
        if value is IDLE_MESSAGE:
            self.idle[i] = True
            return self._check()
        if value <= self.wm[i]:
            raise WatermarkOrderError(
                f"watermarks not monotonically increasing on {self.input_names[i]}: "
                f"{value} after {self.wm[i]}"
            )
        self.idle[i] = False
        self.all_idle = False
        self.wm[i] = value
        if value > self.top_observed:
            self.top_observed = value
        return self._check()

    def queue_done(self, i: int) -> Any:
        """Input ``i`` finished; it no longer holds the minimum back."""
        if self.done[i]:
            raise WatermarkOrderError(f"{self.input_names[i]} finished twice")
        self.done[i] = True
        self.idle[i] = False
        self.wm[i] = MAX_TIMESTAMP
        return self._check()

    def check_pending_idle(self) -> Any:
        """The periodic check: delivers an idle mark owed after an all-idle emission."""
        if self.idle_pending:
            self.idle_pending = False
            return IDLE_MESSAGE
        return NO_NEW_WM

    def _check(self) -> Any:
        if self.all_idle:
            return NO_NEW_WM
        lo = MAX_TIMESTAMP
        idle = self.idle
        for i, v in enumerate(self.wm):
            if not idle[i] and v < lo:
                lo = v
        if lo == MAX_TIMESTAMP:
            self.all_idle = True
            some_live = not all(self.done)
            if self.top_observed > self.last_emitted:
                self.last_emitted = self.top_observed
                self.idle_pending = some_live
                return self.top_observed
            return IDLE_MESSAGE if some_live else NO_NEW_WM
        if lo > self.last_emitted:
            self.last_emitted = lo
            return lo
        return NO_NEW_WM
