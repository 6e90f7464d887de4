"""Fixtures shared by the Spark-engine tests.

Starting a SparkSession costs 7-20 s on the 2-core build machines, and a Python
process can hold only one active SparkContext, so all tests share ONE local[2]
session for the whole test run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent.parent


def _register_test_modules_by_value() -> None:
    """Ship test-module code to executors by value, not by reference.

    cloudpickle pickles module-level functions and classes by reference
    (module name + attribute). Test modules are imported by pytest under names
    such as ``spark.test_session`` that executors cannot import, which fails
    with ``ModuleNotFoundError: No module named 'spark'`` even in local[2].
    slipstream itself is installed in the venv, so it stays by reference.
    """
    from pyspark import cloudpickle

    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name == "__main__":
            continue
        try:
            inside = Path(file).resolve().is_relative_to(TESTS_DIR)
        except (OSError, ValueError):
            continue
        if inside:
            cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """A local[2] SparkSession shared by the test session (skips without Spark)."""
    from slipstream.spark.session import (
        SparkUnavailableError,
        check_spark_available,
        create_session,
    )

    try:
        check_spark_available()
    except SparkUnavailableError as exc:
        pytest.skip(str(exc))

    session = create_session(master="local[2]", app_name="slipstream-tests")
    _register_test_modules_by_value()
    try:
        yield session
    finally:
        session.stop()
