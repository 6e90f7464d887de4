"""The Spark engine: runs slipstream DAGs on Apache Spark through PySpark.

The engine's modules live here (:mod:`~slipstream.spark.engine`,
:mod:`~slipstream.spark.compile`, :mod:`~slipstream.spark.task`, ...); the factory is
``slipstream.spark_engine`` (also ``ss.spark``, which ``slipstream/__init__.py`` binds
to the factory after importing this package, so the two never trade places). Nothing
here imports pyspark at import time.
"""
