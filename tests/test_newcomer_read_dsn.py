"""Newcomer review (issue 26): a ``read_dsn`` that answers but is not a standby of the
primary's database (the database name mistyped, another cluster's server). docs/
configuration.md promises a typed error in seconds for a wrong ``read_dsn``; on main the
server was accepted (with the "not a standby" warning) and the first listing died with a
raw ``UndefinedTable`` traceback in the CLI (``threads list --read-dsn ...``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import drop_database, make_database
from typer.testing import CliRunner

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver
from langgraph_durable.cli import app
from langgraph_durable.errors import SchemaNotReadyError


@pytest.fixture(scope="module")
def empty_db(admin_dsn: str) -> Iterator[str]:
    """A database on the same server without the package's tables."""
    url = make_database(admin_dsn, "nc_read_empty")
    yield url
    drop_database(admin_dsn, url)


def test_cli_read_dsn_without_the_tables_is_one_line(dsn: str, empty_db: str) -> None:
    result = CliRunner().invoke(app, ["threads", "list", "--dsn", dsn, "--read-dsn", empty_db])
    # On main: result.exception is psycopg.errors.UndefinedTable (a traceback in the CLI).
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1
    assert "read_dsn" in result.output and "standby" in result.output, result.output
    assert "Traceback" not in result.output


def test_from_conn_string_refuses_a_read_dsn_without_the_tables(dsn: str, empty_db: str) -> None:
    # On main: no error here (the read pool opens), the first reader listing fails raw.
    with pytest.raises(SchemaNotReadyError) as err:  # ReadDsnSchemaError
        with DurablePostgresSaver.from_conn_string(dsn, read_dsn=empty_db):
            pass
    assert type(err.value).__name__ == "ReadDsnSchemaError"
    assert err.value.fields["setting"] == "read_dsn" and err.value.fields["component"] == "checkpoint"
    assert "@" not in err.value.fields["server"]


async def test_async_from_conn_string_refuses_a_read_dsn_without_the_tables(dsn: str, empty_db: str) -> None:
    with pytest.raises(SchemaNotReadyError, match="read_dsn"):  # ReadDsnSchemaError
        async with AsyncDurablePostgresSaver.from_conn_string(dsn, read_dsn=empty_db):
            pass


def test_a_read_dsn_with_the_tables_still_opens(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn, read_dsn=dsn) as saver:
        assert saver.reader().read_lag.in_recovery is False
