"""Built-in sinks. Each factory returns a supplier for ``dag.new_vertex``."""

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
