"""The Spark engine: runs slipstream DAGs on Apache Spark through PySpark.

Importing any ``slipstream.spark.*`` submodule makes Python bind this package to the
attribute ``slipstream.spark``, replacing the ``slipstream.spark()`` factory function.
So the package module itself is callable and does what the factory does:
``ss.spark(session, **kwargs)`` works whether or not a submodule was imported.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, spark_session: Any = None, **kwargs: Any) -> Any:
        """``ss.spark(spark_session=None, **kwargs)``: a :class:`SparkEngine`."""
        from slipstream.spark.engine import SparkEngine

        return SparkEngine(spark_session, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
