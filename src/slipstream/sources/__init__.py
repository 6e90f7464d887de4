"""Built-in sources. Each factory returns a supplier for ``dag.new_vertex``."""

from slipstream.sources.batch import items, list_source, map_source
from slipstream.sources.files import read_csv, read_files, read_jsonl, read_parquet
from slipstream.sources.kafka import kafka
from slipstream.sources.sql import sql_source as sql
from slipstream.sources.streaming import generator, stream_files, stream_socket
from slipstream.spark.io import spark_dataframe_source as spark_dataframe
from slipstream.spark.io import spark_rdd_source as spark_rdd
from slipstream.spark.io import spark_stream_source as spark_stream

__all__ = [
    "items",
    "list_source",
    "map_source",
    "read_files",
    "read_csv",
    "read_jsonl",
    "read_parquet",
    "stream_socket",
    "stream_files",
    "generator",
    "sql",
    "kafka",
    "spark_dataframe",
    "spark_rdd",
    "spark_stream",
]
