"""Built-in sources. Each factory returns a supplier for ``dag.new_vertex``."""

from slipstream import _lazy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
# imported on first use (slipstream/_lazy.py says why)
_lazy.install(
    __name__,
    {
        "items": "slipstream.sources.batch:items",
        "list_source": "slipstream.sources.batch:list_source",
        "map_source": "slipstream.sources.batch:map_source",
        "snapshot": "slipstream.sources.batch:snapshot",
        "read_csv": "slipstream.sources.files:read_csv",
        "read_files": "slipstream.sources.files:read_files",
        "read_jsonl": "slipstream.sources.files:read_jsonl",
        "read_parquet": "slipstream.sources.files:read_parquet",
        "kafka": "slipstream.sources.kafka:kafka",
        "sql": "slipstream.sources.sql:sql_source",
        "generator": "slipstream.sources.streaming:generator",
        "stream_files": "slipstream.sources.streaming:stream_files",
        "stream_socket": "slipstream.sources.streaming:stream_socket",
        "spark_dataframe": "slipstream.spark.io:spark_dataframe_source",
        "spark_rdd": "slipstream.spark.io:spark_rdd_source",
        "spark_stream": "slipstream.spark.io:spark_stream_source",
    },
)

if TYPE_CHECKING:
    from slipstream.sources.batch import items, list_source, map_source, snapshot
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
    "snapshot",
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
