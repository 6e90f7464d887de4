"""The Spark engine: runs slipstream DAGs on Apache Spark through PySpark."""
