"""suite_plugin._Databases: a database given back is emptied to the state of a fresh one
after setup(), whichever of its tables the test wrote to (only those are truncated)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo as ci

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import suite_plugin  # this folder, not a package


@pytest.fixture
def databases(admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[suite_plugin._Databases]:
    params = ci.conninfo_to_dict(admin_dsn)
    base = f"postgresql://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/"
    monkeypatch.setattr(suite_plugin, "_base", base)
    dbs = suite_plugin._Databases()
    yield dbs
    dbs.close()


def test_release_empties_written_tables_and_restarts_sequences(databases: suite_plugin._Databases) -> None:
    name = databases.acquire()
    uri = suite_plugin._base + name
    schema = """
        CREATE TABLE parent (id text PRIMARY KEY);
        CREATE TABLE child (id text REFERENCES parent, v int);
        CREATE TABLE untouched (id text);
        CREATE TABLE counted (n bigint GENERATED ALWAYS AS IDENTITY, v text);
        CREATE TABLE emptied_serial (n bigserial, v text);
        CREATE TABLE things_migrations (v int PRIMARY KEY);
        INSERT INTO things_migrations VALUES (1), (2);
    """

    def fill(conn: psycopg.Connection) -> None:
        conn.execute("INSERT INTO parent VALUES ('p'); INSERT INTO child VALUES ('p', 1)")
        conn.execute("INSERT INTO counted (v) VALUES ('a'), ('b')")
        # Written, then emptied by the test itself: its sequence has moved all the same.
        conn.execute("INSERT INTO emptied_serial (v) VALUES ('x'); DELETE FROM emptied_serial")

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(schema)
        fill(conn)
    databases.release(name)  # the first release records the catalog signature
    assert databases.free == [name]
    again = databases.acquire()
    assert again == name and databases.stats["reused"] == 1
    with psycopg.connect(uri, autocommit=True) as conn:
        for table in ("parent", "child", "untouched", "counted", "emptied_serial"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
        assert conn.execute("SELECT count(*) FROM things_migrations").fetchone() == (2,)
        fill(conn)
        # Sequences restart as in a fresh database.
        assert conn.execute("SELECT min(n) FROM counted").fetchone() == (1,)
        assert conn.execute("INSERT INTO emptied_serial (v) VALUES ('y') RETURNING n").fetchone() == (2,)
    databases.release(name)
    with psycopg.connect(uri, autocommit=True) as conn:
        for table in ("parent", "child", "counted", "emptied_serial"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
        assert conn.execute("INSERT INTO emptied_serial (v) VALUES ('z') RETURNING n").fetchone() == (1,)
        assert conn.execute("INSERT INTO counted (v) VALUES ('c') RETURNING n").fetchone() == (1,)
    assert databases.free == [name] and databases.stats["dropped_dirty"] == 0
