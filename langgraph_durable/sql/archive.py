"""SQL of the archive (archive.py): every per-thread table read, fingerprinted,
deleted (with proof) and restored generically, its columns read from the catalog.

Table and column names come from the package's own table lists and the catalog, and
go through ``sql.Identifier``; values are parameters.
"""

from collections.abc import Sequence

from psycopg import sql

# Columns of the given tables: type, generated (identity, generated or serial) and
# position in the primary key.
TABLE_COLUMNS_SQL = """
SELECT c.relname AS tbl, a.attname AS col, format_type(a.atttypid, a.atttypmod) AS type,
       (a.attidentity <> '' OR a.attgenerated <> ''
        OR COALESCE(pg_get_expr(d.adbin, d.adrelid), '') LIKE 'nextval(%%') AS generated,
       array_position(i.indkey::int2[], a.attnum) AS pk
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
WHERE a.attrelid = ANY(%s::text[]::regclass[]) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.relname, a.attnum
"""


def thread_rows_sql(table: str, order: list[str]) -> sql.Composed:
    """Every row of ``table`` for the threads ``%s`` as JSON, in ``order``."""
    return sql.SQL("SELECT to_jsonb(t) AS r FROM {} t WHERE thread_id = ANY(%s) ORDER BY {}").format(
        sql.Identifier(table),
        sql.SQL(", ").join(sql.Identifier(c) for c in order) if order else sql.SQL("1"),
    )


# Columns that are a cache of other rows, not the thread's state: left out of the
# fingerprint. durable_threads.has_root (status_counts, issue 14) is cleared by a
# trigger when checkpoints are deleted, so retention's checked delete would otherwise
# see the thread row change under it (checkpoints are deleted before the thread row).
DERIVED_COLUMNS = {"durable_threads": ("has_root",)}

# After a restore's inserts (same transaction): an archived has_root = TRUE stays only
# if the thread's root checkpoint was restored with it (a dump is one snapshot, so it
# is, unless the file was edited); TRUE must never outlive a root checkpoint.
RESTORED_ROOT_CHECK_SQL = """
UPDATE durable_threads t SET has_root = NULL
WHERE t.thread_id = %s AND t.has_root
  AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '')
"""


def _row_json(table: str, alias: str) -> sql.Composable:
    row = sql.SQL("to_jsonb({})").format(sql.Identifier(alias))
    for col in DERIVED_COLUMNS.get(table, ()):
        row = sql.SQL("({} - {})").format(row, sql.Literal(col))
    return row


def thread_fingerprint_sql(tables: Sequence[str]) -> sql.Composed:
    """Per thread of ``%(ids)s``, an md5 over every row of every table (order-free); the
    ``durable_threads`` rows of ``%(created)s`` are left out."""
    parts = []
    for t in tables:
        extra = (
            sql.SQL(" AND NOT (thread_id = ANY(%(created)s))")
            if t == "durable_threads"
            else sql.SQL("")
        )
        parts.append(
            sql.SQL(
                "SELECT thread_id, md5({name} || {row}::text) AS h FROM {tbl} t "
                "WHERE thread_id = ANY(%(ids)s){extra}"
            ).format(name=sql.Literal(t), row=_row_json(t, "t"), tbl=sql.Identifier(t), extra=extra)
        )
    return sql.SQL(
        "SELECT thread_id, md5(string_agg(h, '' ORDER BY h COLLATE \"C\")) AS fp "
        "FROM ({}) x GROUP BY thread_id"
    ).format(sql.SQL(" UNION ALL ").join(parts))


def checked_delete_sql(table: str, size: str) -> sql.Composed:
    """Delete the rows of ``%(ids)s`` from ``table``, returning each one's hash (as
    ``thread_fingerprint_sql`` computes it) and ``size`` (an SQL expression over the
    table's columns, from the package's own list)."""
    h = sql.SQL("md5({name} || {row}::text)").format(name=sql.Literal(table), row=_row_json(table, "d"))
    if table == "durable_threads":
        h = sql.SQL("CASE WHEN d.thread_id = ANY(%(created)s) THEN NULL ELSE {} END").format(h)
    return sql.SQL(
        "WITH d AS (DELETE FROM {tbl} WHERE thread_id = ANY(%(ids)s) RETURNING *) "
        "SELECT d.thread_id, {h} AS h, ({size})::bigint AS size FROM d"
    ).format(tbl=sql.Identifier(table), h=h, size=sql.SQL(size))


ARTIFACT_ROWS_SQL = "SELECT to_jsonb(a) AS r FROM durable_artifacts a WHERE digest = ANY(%b) ORDER BY digest"


def thread_exists_sql(tables: Sequence[str]) -> sql.Composed:
    """The threads of ``%(ids)s`` with a row in any of ``tables``."""
    return sql.SQL(" UNION ").join(
        sql.SQL("SELECT thread_id FROM {} WHERE thread_id = ANY(%(ids)s)").format(sql.Identifier(t))
        for t in tables
    )


def insert_rows_sql(table: str, cols: list[str], *, ignore: bool = False) -> sql.Composed:
    """Insert JSON records (``%s``) into ``table``'s ``cols``."""
    names = sql.SQL(", ").join(sql.Identifier(c) for c in cols)
    return sql.SQL(
        "INSERT INTO {t} ({c}) SELECT {c} FROM jsonb_populate_recordset(NULL::{t}, %s){tail}"
    ).format(t=sql.Identifier(table), c=names, tail=sql.SQL(" ON CONFLICT DO NOTHING" if ignore else ""))
