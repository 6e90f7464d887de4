"""Built-in sources. Each factory returns a supplier for ``dag.new_vertex``."""

from slipstream.sources.batch import items, list_source, map_source, read_files
from slipstream.sources.streaming import generator, stream_files, stream_socket

__all__ = [
    "items",
    "list_source",
    "map_source",
    "read_files",
    "stream_socket",
    "stream_files",
    "generator",
]
