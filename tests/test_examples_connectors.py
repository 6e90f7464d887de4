"""The Kafka-to-PostgreSQL example runs end to end with the servers it starts itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "kafka_to_postgres.py")


@pytest.mark.slow
def test_kafka_to_postgres_example_is_exact() -> None:
    r = subprocess.run(
        [sys.executable, EXAMPLE, "--events", "5000", "--users", "50", "--snapshot-ms", "100"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "PostgreSQL: " in r.stdout and "exact" in r.stdout
    assert "each window exactly once" in r.stdout
