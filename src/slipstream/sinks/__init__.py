"""Built-in sinks. Each factory returns a supplier for ``dag.new_vertex``."""

from slipstream.sinks.basic import (
    list_sink,
    logger,
    map_sink,
    noop,
    write_buffered,
    write_files,
)
from slipstream.sinks.socket import write_socket
from slipstream.spark.io import spark_dataframe_sink as spark_dataframe

__all__ = [
    "list_sink",
    "map_sink",
    "write_files",
    "logger",
    "noop",
    "write_buffered",
    "write_socket",
    "spark_dataframe",
]
