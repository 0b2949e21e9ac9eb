"""SQL of setup behind a transaction pooler and of the DDL-free schema check
(pooler.py); to be folded into sql/schema.py beside the direct setup's statements."""

from psycopg import sql

# The setup lock for one transaction (never waited for in the server; see pooler.py).
TRY_SETUP_XACT_LOCK_SQL = "SELECT pg_try_advisory_xact_lock(%s) AS ok"
CURRENT_SCHEMA_SQL = "SELECT current_schema() AS s, current_user AS u"
TABLE_EXISTS_SQL = "SELECT to_regclass(%s) IS NOT NULL AS ok"


def migration_version_sql(table: sql.Identifier) -> sql.Composed:
    """The newest migration recorded in ``table`` (checkpoint_migrations or ours)."""
    return sql.SQL("SELECT max(v) AS v FROM {}").format(table)


def record_migration_sql(table: sql.Identifier) -> sql.Composed:
    return sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(table)
