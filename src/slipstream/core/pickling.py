"""The ``cloudpickle`` module that slipstream's shared code uses.

The ``cloudpickle`` package (a dependency of slipstream) when it is installed;
otherwise the copy PySpark bundles as ``pyspark.cloudpickle``. A Spark executor whose
Python has neither slipstream nor its dependencies installed imports slipstream from the
zip the driver ships (:mod:`slipstream.spark.shipping`) and finds PySpark's copy on the
path Spark gives its Python workers, so code that runs in Spark tasks must import
cloudpickle from here, never directly. Spark-only executor code uses
``pyspark.cloudpickle`` itself.
"""

from __future__ import annotations

try:
    import cloudpickle
except ImportError:  # pragma: no cover - exercised on bare executors (tests/spark)
    from pyspark import cloudpickle  # type: ignore[no-redef]

__all__ = ["cloudpickle"]
