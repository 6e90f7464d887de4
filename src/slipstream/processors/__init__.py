"""Built-in processors. Each factory returns a *supplier* for ``dag.new_vertex``.

Batch rows of the aggregation matrix: ``aggregate``/``accumulate``/``combine`` (no key)
and ``aggregate_by_key``/``accumulate_by_key``/``combine_by_key``. Streaming rows:
``aggregate_to_sliding_window``/``accumulate_by_frame``/``combine_to_sliding_window`` and
``aggregate_to_session_window``. Plus ``map``/``filter``/``flat_map``/``no_op``,
``insert_watermarks``, ``sort`` and the service calls (``map_using_service`` and
friends, ``service_factory``). docs/reference.md lists them all with examples.
"""

from slipstream.processors.aggregation import (
    accumulate,
    accumulate_by_key,
    aggregate,
    aggregate_by_key,
    combine,
    combine_by_key,
)
from slipstream.processors.basic import filter, flat_map, map, no_op
from slipstream.processors.services import (
    ServiceFactory,
    filter_using_service,
    filter_using_service_async,
    flat_map_using_service,
    flat_map_using_service_async,
    map_using_service,
    map_using_service_async,
    service_factory,
)
from slipstream.processors.sessions import aggregate_to_session_window
from slipstream.processors.sort import sort
from slipstream.processors.watermarks import insert_watermarks
from slipstream.processors.windows import (
    accumulate_by_frame,
    aggregate_to_sliding_window,
    combine_to_sliding_window,
)

__all__ = [
    "map",
    "filter",
    "flat_map",
    "no_op",
    "aggregate",
    "accumulate",
    "combine",
    "aggregate_by_key",
    "accumulate_by_key",
    "combine_by_key",
    "insert_watermarks",
    "accumulate_by_frame",
    "combine_to_sliding_window",
    "aggregate_to_sliding_window",
    "aggregate_to_session_window",
    "sort",
    "ServiceFactory",
    "service_factory",
    "map_using_service",
    "filter_using_service",
    "flat_map_using_service",
    "map_using_service_async",
    "filter_using_service_async",
    "flat_map_using_service_async",
]
