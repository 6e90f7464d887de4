"""Built-in sinks. Each factory returns a supplier for ``dag.new_vertex``."""

from slipstream import _lazy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
# imported on first use (slipstream/_lazy.py says why)
_lazy.install(
    __name__,
    {
        "list_sink": "slipstream.sinks.basic:list_sink",
        "logger": "slipstream.sinks.basic:logger",
        "map_sink": "slipstream.sinks.basic:map_sink",
        "noop": "slipstream.sinks.basic:noop",
        "stdout": "slipstream.sinks.basic:stdout",
        "write_buffered": "slipstream.sinks.basic:write_buffered",
        "write_csv": "slipstream.sinks.files:write_csv",
        "write_files": "slipstream.sinks.files:write_files",
        "write_jsonl": "slipstream.sinks.files:write_jsonl",
        "write_parquet": "slipstream.sinks.files:write_parquet",
        "kafka": "slipstream.sinks.kafka:kafka",
        "write_socket": "slipstream.sinks.socket:write_socket",
        "sql": "slipstream.sinks.sql:sql_sink",
        "spark_dataframe": "slipstream.spark.io:spark_dataframe_sink",
    },
)

if TYPE_CHECKING:
    from slipstream.sinks.basic import (
        list_sink,
        logger,
        map_sink,
        noop,
        stdout,
        write_buffered,
    )
    from slipstream.sinks.files import write_csv, write_files, write_jsonl, write_parquet
    from slipstream.sinks.kafka import kafka
    from slipstream.sinks.socket import write_socket
    from slipstream.sinks.sql import sql_sink as sql
    from slipstream.spark.io import spark_dataframe_sink as spark_dataframe

__all__ = [
    "list_sink",
    "map_sink",
    "write_files",
    "write_csv",
    "write_jsonl",
    "write_parquet",
    "stdout",
    "logger",
    "noop",
    "write_buffered",
    "write_socket",
    "sql",
    "kafka",
    "spark_dataframe",
]
