"""EpochSourceGate, the bound of a micro-batch epoch's source processor (fast, no
Spark): its time, and with ``max_items`` the items it emitted."""

from __future__ import annotations

from slipstream.core.outbox import Outbox
from slipstream.core.processor import AbstractProcessor, Context
from slipstream.spark.task import EpochSourceGate


class _Emitting(AbstractProcessor):
    """Emits ``per_call`` items into its buckets at every ``complete()``."""

    def __init__(self, per_call: int) -> None:
        self.per_call = per_call
        self.calls = 0

    def complete(self) -> bool:
        self.calls += 1
        for b in self.outbox.buckets:
            b.extend(range(self.per_call))
        return False


def _gate(per_call: int, max_items: int | None, ordinals: int = 2) -> tuple[EpochSourceGate, _Emitting]:
    p = _Emitting(per_call)
    p.init(Outbox(ordinals), Context("source"))
    return EpochSourceGate(p, 60_000.0, max_items), p


def test_the_epoch_ends_once_the_source_emitted_max_items() -> None:
    gate, p = _gate(4, 10)
    assert not gate.exhausted
    gate.complete()
    for b in p.outbox.buckets:
        b.clear()  # the tasklet takes the items between calls
    gate.complete()
    assert (gate.items, gate.exhausted) == (8, False)
    gate.complete()  # one call's worth over the bound at the most
    assert (gate.items, gate.exhausted) == (12, True)
    gate.complete()
    assert p.calls == 3  # a full epoch calls the source no more


def test_items_left_in_the_bucket_are_not_counted_again() -> None:
    gate, p = _gate(3, 100, ordinals=1)
    for _ in range(5):
        gate.complete()  # the bucket is never emptied here
    assert gate.items == 15


def test_without_max_items_only_time_or_completion_ends_the_epoch() -> None:
    gate, p = _gate(1000, None)
    for _ in range(5):
        gate.complete()
    assert not gate.exhausted and p.calls == 5 and gate.items == 0
