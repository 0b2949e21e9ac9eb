"""Least privilege: the exact GRANTs each role needs.

Three roles (docs/production.md, "Roles"):

* the **owner** owns the schema and runs ``setup()`` / ``langgraph-durable setup``
  (DDL: CREATE TABLE, CREATE INDEX, CREATE FUNCTION);
* the **application** role (graphs, ``@idempotent``, workers, retention/GC) gets DML
  on the data tables, SELECT on the two migration-version tables (the saver verifies
  them with ``run_migrations=False``), the one sequence and EXECUTE on the two
  functions; it cannot change the schema;
* a **read-only** role (dashboards, the CLI's read commands) gets SELECT only.

``grant_statements`` derives the table list from the migrations themselves, so a new
table in a later release is granted too (the test runs a whole graph, a worker, the
ledger and retention as the application role to prove the list complete).
"""

from __future__ import annotations

import re

from langgraph.checkpoint.postgres.base import BasePostgresSaver

from langgraph_durable.errors import InvalidIdentifierError
from langgraph_durable.sql.schema import MIGRATIONS, validate_schema

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
VERSION_TABLES = ("checkpoint_migrations", "durable_migrations")
# Functions the saver calls (fencing of leased writes); their signatures as created.
FUNCTIONS = (
    "durable_fence(text, bigint, text)",
    "durable_foreign_lease(text)",
    "durable_checkpoint_order(text, text, text)",
    "durable_put_guard(text, bigint, text, boolean, text, text)",
    "durable_guard_fail(text, text, bigint, text, text)",
)


def _migration_sql() -> str:
    return "\n".join([*BasePostgresSaver.MIGRATIONS, *MIGRATIONS])


def tables() -> list[str]:
    """Every table ``setup()`` creates (stock and durable), in a stable order."""
    # Also the tables a DO block creates (durable_thread_counts, filled by triggers on
    # durable_threads: the application role's writes insert into it).
    names = re.findall(r"CREATE TABLE (?:IF NOT EXISTS\s+)?(\w+)", _migration_sql(), re.IGNORECASE)
    return sorted(set(names))


def sequences() -> list[str]:
    """Sequences behind BIGSERIAL/SERIAL columns (``<table>_<column>_seq``)."""
    out = []
    for m in re.finditer(
        r"CREATE TABLE IF NOT EXISTS\s+(\w+)\s*\((.*?)\n\s*\)", _migration_sql(), re.IGNORECASE | re.DOTALL
    ):
        for col in re.finditer(r"(\w+)\s+(?:BIG|SMALL)?SERIAL\b", m.group(2), re.IGNORECASE):
            out.append(f"{m.group(1)}_{col.group(1)}_seq")
    return sorted(set(out))


def _quote(name: str, kind: str) -> str:
    if not _IDENT.match(name):
        raise InvalidIdentifierError(name, kind)
    return '"' + name + '"'


def grant_statements(role: str, *, schema: str | None = None, readonly: bool = False) -> list[str]:
    """The GRANTs for ``role`` on the tables of ``schema`` (default ``public``)."""
    r = _quote(role, "role")
    s = _quote(validate_schema(schema) or "public", "schema")
    data = [t for t in tables() if t not in VERSION_TABLES]
    q = ", ".join(f"{s}.{_quote(t, 'table')}" for t in data)
    versions = ", ".join(f"{s}.{_quote(t, 'table')}" for t in VERSION_TABLES)
    out = [f"GRANT USAGE ON SCHEMA {s} TO {r};"]
    if readonly:
        out.append(f"GRANT SELECT ON TABLE {q}, {versions} TO {r};")
        return out
    out.append(f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {q} TO {r};")
    out.append(f"GRANT SELECT ON TABLE {versions} TO {r};")
    seqs = sequences()
    if seqs:
        out.append(
            "GRANT USAGE, SELECT ON SEQUENCE "
            + ", ".join(f"{s}.{_quote(q_, 'sequence')}" for q_ in seqs)
            + f" TO {r};"
        )
    out.append(
        "GRANT EXECUTE ON FUNCTION " + ", ".join(f"{s}.{f}" for f in FUNCTIONS) + f" TO {r};"
    )
    return out


__all__ = ["FUNCTIONS", "VERSION_TABLES", "grant_statements", "sequences", "tables"]
