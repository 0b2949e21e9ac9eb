"""THE list of columns that hold sealed or serializer-encrypted data (issue 27).

With an encrypting serializer, nothing a user or a model supplied is stored readable;
every column that can hold such data is listed here, with its table's key columns and
how it is sealed, so ``langgraph-durable rekey`` walks them all (a new sealed column is
one line here). The dataclass is rekey27's shape (``keys``, ``thread_column``,
``checkpoint_column``); seal27 adds the package's own columns. ``kind``:

* ``serde``: a serializer's ``(type, bytes)`` (``type_column`` names the type): LangGraph's
  ``<type>+aes`` form, or the package's artifact envelope (``durable+ref``) whose inline
  items carry that form;
* ``artifact``: an artifact's stored form (``ArtifactCodec.seal``: zstd, then the cipher),
  under a keyed digest (HMAC-SHA256 with the database's digest secret, sql/secrets.py);
* ``serde_json``: a JSONB array of ``{"type", "blob" (base64)}`` objects (the migration
  log's backups of blob and write rows);
* ``text``: TEXT, ``lgd:sealed:v1:`` + base64 of ``Keyring.seal(utf-8)``
  (``_sealing.seal_text``); other values are plaintext written before encryption;
* ``json``: JSONB, an object whose key ``"lgd:sealed"`` holds base64 of
  ``Keyring.seal(json)`` of the sealed part, beside the keys kept in the clear
  (``_sealing.seal_json``: ``last_failure`` keeps node/type/ids, audit details statuses
  and counts): re-seal that one key;
* ``sealed``: BYTEA in ``Keyring.seal``'s form (``durable_secrets.sealed``: the database's
  digest secret);
* ``metadata``: JSONB run metadata (``checkpoints.metadata`` and its backups): the same
  ``"lgd:sealed"`` key holding the user keys (``_sealing.seal_metadata``), the keys of
  ``_sealing.CLEAR_METADATA`` in the clear.

Without an encrypting serializer none of these columns changes format. Values that are
not encrypted (written before encryption was configured) are left as they are by rekey:
it changes keys, it does not encrypt plaintext. The statements below walk a column.
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
    kind: str  # serde | artifact | serde_json | text | json | metadata | sealed
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
    # --- seal27: the package's own columns (issue 27) ---
    # Run metadata's user keys (checkpoints.checkpoint holds no value with a key: every
    # channel value is a blob; rows written before encryption keep theirs inline).
    SealedColumn("checkpoints", ("thread_id", "checkpoint_ns", "checkpoint_id"), "metadata", "metadata",
                 checkpoint_column="checkpoint_id"),
    SealedColumn("durable_migration_log", ("id",), "old_metadata", "metadata",
                 checkpoint_column="checkpoint_id"),
    # @idempotent arguments and cached failures (journal records are ledger rows too).
    SealedColumn("durable_ledger", ("key",), "args_preview", "text"),
    SealedColumn("durable_ledger", ("key",), "error", "text"),
    # Failures: exception texts and tracebacks.
    SealedColumn("durable_threads", ("thread_id",), "last_error", "text"),
    SealedColumn("durable_threads", ("thread_id",), "last_failure", "json"),
    SealedColumn("durable_quarantine", ("thread_id",), "last_error", "text", checkpoint_column="checkpoint_id"),
    # Operator actions.
    SealedColumn("durable_audit", ("id",), "detail", "json"),
    # --- digest27 ---
    # Queued interrupt answers (issue 25: serde output, its type in answer_type).
    SealedColumn("durable_threads", ("thread_id",), "answer_blob", "serde", type_column="answer_type"),
    # The database's digest secret (sql/secrets.py), in Keyring.seal's form.
    SealedColumn("durable_secrets", ("name",), "sealed", "sealed", thread_column=None),
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
    if col.kind in ("serde_json", "json", "metadata"):
        value = sql.SQL("%s::jsonb")  # type: ignore[assignment]
    return sql.SQL("UPDATE {} SET {} = {} WHERE {}").format(
        sql.Identifier(col.table), sql.Identifier(col.column), value,
        sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in col.keys),
    )


def count_sql(col: SealedColumn) -> sql.Composed:
    """Rows to walk (an estimate is enough for progress: exact, the tables are walked anyway)."""
    return sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(col.table))
