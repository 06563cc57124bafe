"""Fixtures for the fleet tests: one real PostgreSQL server per session, one fresh database per test.

The server comes from :mod:`pg_server` (a temp directory, 127.0.0.1, a free port, run as an
unprivileged user when the tests run as root). The tests skip, saying why, only when the
PostgreSQL server programs or the ``fleet`` extra (pgqueuer, psycopg) are not installed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pg_server  # this directory is on sys.path while its conftest loads (pytest's rootdir rules)
import pytest

_db_numbers = itertools.count()


@pytest.fixture(scope="session")
def pg() -> Iterator[pg_server.PgServer]:
    """A running PostgreSQL server for the whole session."""
    pytest.importorskip("pgqueuer", reason="the fleet extra is not installed (pip install -e '.[fleet]')")
    bins = pg_server.find_binaries()
    if bins is None:
        pytest.skip("PostgreSQL server programs (initdb, pg_ctl) not found on PATH or in "
                    "/usr/lib/postgresql/*/bin")
    with pg_server.running_server(bins) as server:
        yield server


@pytest.fixture
def fleet_dsn(pg: pg_server.PgServer) -> Iterator[str]:
    """The DSN of a database created for this test alone (dropped afterwards)."""
    with pg_server.fresh_database(pg, f"fleet_{next(_db_numbers)}") as dsn:
        yield dsn


@pytest.fixture(scope="module")
def module_fleet_dsn(pg: pg_server.PgServer) -> Iterator[str]:
    """The DSN of a database shared by the tests of one module (dropped after them)."""
    with pg_server.fresh_database(pg, f"fleet_m{next(_db_numbers)}") as dsn:
        yield dsn
