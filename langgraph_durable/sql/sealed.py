"""Every column that holds encrypted bytes, in ONE list, and the statements that walk it.

``langgraph-durable rekey`` (``ops/rekey.py``) re-encrypts each column of ``SEALED``
with the current key, a keyset page of rows per transaction. A store that seals a new
column registers it here (issue 27's contract between the stores and the keys).

``kind`` says what the column holds:

* ``serde``: a serializer's ``(type, bytes)`` (``type_column`` names the type): LangGraph's
  ``<type>+aes`` form, or the package's artifact envelope (``durable+ref``) whose inline
  items carry that form;
* ``artifact``: an artifact's stored form (``ArtifactCodec.seal``: zstd, then the cipher);
* ``sealed``: ``Keyring.seal``'s form (``LGK``...), raw bytes (BYTEA);
* ``serde_json``: a JSONB array of ``{"type", "blob" (base64)}`` objects (the migration
  log's backups of blob and write rows).

Rows whose bytes are not encrypted (written before encryption was configured) are left
as they are: rekey changes keys, it does not encrypt plaintext.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

__all__ = ["SEALED", "SealedColumn", "page_sql", "update_sql"]


@dataclass(frozen=True)
class SealedColumn:
    table: str
    keys: tuple[str, ...]  # the primary key, the walk's order
    column: str
    kind: str  # serde | artifact | sealed | serde_json
    type_column: str | None = None
    thread_column: str | None = "thread_id"
    checkpoint_column: str | None = None

    @property
    def name(self) -> str:
        return f"{self.table}.{self.column}"


SEALED: tuple[SealedColumn, ...] = (
    SealedColumn("checkpoint_blobs", ("thread_id", "checkpoint_ns", "channel", "version"),
                 "blob", "serde", type_column="type"),
    SealedColumn("checkpoint_writes", ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"),
                 "blob", "serde", type_column="type", checkpoint_column="checkpoint_id"),
    SealedColumn("durable_artifacts", ("digest",), "data", "artifact", thread_column=None),
    # @idempotent results and the journal's recorded answers (journal.py writes its
    # records as ledger rows).
    SealedColumn("durable_ledger", ("key",), "result", "serde", type_column="result_type"),
    SealedColumn("durable_migration_log", ("id",), "old_blobs", "serde_json",
                 checkpoint_column="checkpoint_id"),
    SealedColumn("durable_migration_log", ("id",), "old_writes", "serde_json",
                 checkpoint_column="checkpoint_id"),
)


def _columns(col: SealedColumn) -> list[sql.Composable]:
    names = list(col.keys)
    for extra in (col.type_column, col.thread_column, col.checkpoint_column, col.column):
        if extra is not None and extra not in names:
            names.append(extra)
    return [sql.Identifier(n) for n in names]


def page_sql(col: SealedColumn, first: bool) -> sql.Composed:
    """One keyset page, locked: ``first`` starts at the beginning, otherwise after the
    row whose keys are passed (``%s`` per key, then the page size)."""
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in col.keys)
    after = sql.SQL("") if first else sql.SQL("WHERE ({}) > ({}) ").format(
        keys, sql.SQL(", ").join(sql.Placeholder() * len(col.keys))
    )
    return sql.SQL("SELECT {} FROM {} {}ORDER BY {} LIMIT %s FOR UPDATE").format(
        sql.SQL(", ").join(_columns(col)), sql.Identifier(col.table), after, keys
    )


def update_sql(col: SealedColumn) -> sql.Composed:
    """Set the column of one row (its new value, then its keys)."""
    value = sql.Placeholder()
    if col.kind == "serde_json":
        value = sql.SQL("%s::jsonb")  # type: ignore[assignment]
    return sql.SQL("UPDATE {} SET {} = {} WHERE {}").format(
        sql.Identifier(col.table), sql.Identifier(col.column), value,
        sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in col.keys),
    )


def count_sql(col: SealedColumn) -> sql.Composed:
    """Rows to walk (an estimate is enough for progress: exact, the tables are walked anyway)."""
    return sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(col.table))
