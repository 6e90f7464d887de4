"""AbstractProcessor.save_state: snapshot state that resumes when the bucket is full."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import slipstream as ss
from slipstream.testing import verify_processor


class Dedupe(ss.AbstractProcessor):
    """The docs/guide.md example: drops items seen before."""

    def init_processor(self, context: ss.Context) -> None:
        self.seen: set[Any] = set()

    def try_process_item(self, ordinal: int, item: Any) -> bool:
        if item in self.seen:
            return True
        if not self.try_emit(item):
            return False
        self.seen.add(item)
        return True

    def save_to_snapshot(self) -> bool:
        return self.save_state(lambda: ((k, True) for k in self.seen))

    def restore_from_snapshot_entry(self, key: Any, value: Any) -> None:
        self.seen.add(key)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=15))
def test_state_with_many_entries_survives_capacity_one_and_restores(xs: list[int]) -> None:
    # snapshot capacity 1 in the harness: every second entry is refused and must resume
    verify_processor(Dedupe).input(xs).expect_output(list(dict.fromkeys(xs)))
