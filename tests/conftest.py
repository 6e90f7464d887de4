"""Fixtures shared by every test directory: real servers for the connector tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from servers import PostgresServer, postgres_server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One private PostgreSQL cluster on 127.0.0.1 for the whole test session."""
    with postgres_server() as server:
        yield server
