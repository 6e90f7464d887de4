"""Built-in processors. Each factory returns a *supplier* for ``dag.new_vertex``.

Batch rows of the aggregation matrix: ``aggregate``/``accumulate``/``combine`` (no key)
and ``aggregate_by_key``/``accumulate_by_key``/``combine_by_key``. Streaming rows:
``aggregate_to_sliding_window``/``accumulate_by_frame``/``combine_to_sliding_window`` and
``aggregate_to_session_window``. Plus ``map``/``filter``/``flat_map``/``no_op``,
``insert_watermarks``, ``sort`` and the service calls (``map_using_service`` and
friends, ``service_factory``). docs/reference.md lists them all with examples.
"""

from slipstream import _lazy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
# imported on first use (slipstream/_lazy.py says why)
_lazy.install(
    __name__,
    {
        "accumulate": "slipstream.processors.aggregation:accumulate",
        "accumulate_by_key": "slipstream.processors.aggregation:accumulate_by_key",
        "aggregate": "slipstream.processors.aggregation:aggregate",
        "aggregate_by_key": "slipstream.processors.aggregation:aggregate_by_key",
        "combine": "slipstream.processors.aggregation:combine",
        "combine_by_key": "slipstream.processors.aggregation:combine_by_key",
        "filter": "slipstream.processors.basic:filter",
        "flat_map": "slipstream.processors.basic:flat_map",
        "map": "slipstream.processors.basic:map",
        "no_op": "slipstream.processors.basic:no_op",
        "ServiceFactory": "slipstream.processors.services:ServiceFactory",
        "filter_using_service": "slipstream.processors.services:filter_using_service",
        "filter_using_service_async": "slipstream.processors.services:filter_using_service_async",
        "flat_map_using_service": "slipstream.processors.services:flat_map_using_service",
        "flat_map_using_service_async": "slipstream.processors.services:flat_map_using_service_async",
        "map_using_service": "slipstream.processors.services:map_using_service",
        "map_using_service_async": "slipstream.processors.services:map_using_service_async",
        "service_factory": "slipstream.processors.services:service_factory",
        "aggregate_to_session_window": "slipstream.processors.sessions:aggregate_to_session_window",
        "sort": "slipstream.processors.sort:sort",
        "insert_watermarks": "slipstream.processors.watermarks:insert_watermarks",
        "accumulate_by_frame": "slipstream.processors.windows:accumulate_by_frame",
        "aggregate_to_sliding_window": "slipstream.processors.windows:aggregate_to_sliding_window",
        "combine_to_sliding_window": "slipstream.processors.windows:combine_to_sliding_window",
    },
)

if TYPE_CHECKING:
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
