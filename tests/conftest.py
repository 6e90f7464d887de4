"""Fixtures shared by every test directory: real servers for the connector tests.

Snapshot signing keys go to a private temporary key directory for the session
(inherited by subprocesses), not into the user's home."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from servers import PostgresServer, postgres_server

_KEY_DIR = tempfile.mkdtemp(prefix="slipstream-test-keys-")
os.environ["SLIPSTREAM_KEY_DIR"] = os.path.join(_KEY_DIR, "keys")


def pytest_unconfigure(config: object) -> None:
    shutil.rmtree(_KEY_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One private PostgreSQL cluster on 127.0.0.1 for the whole test session."""
    with postgres_server() as server:
        yield server
