"""THE list of columns that hold sealed or serializer-encrypted data (issue 27).

With an encrypting serializer, nothing a user or a model supplied is stored readable;
every column that can hold such data is listed here, with its table's key columns and
how it is sealed, so ``langgraph-durable rekey`` walks them all (and a new sealed column
is one line here). ``kind``:

* ``serde``: LangGraph serializer output, a ``(type, bytes)`` pair in two columns
  (``type_column``); encrypted by ``EncryptedSerializer`` (``<type>+aes``), or an
  artifact envelope (``durable+ref``) whose small items are encrypted the same way;
* ``artifact``: ``durable_artifacts.data``, ``0x00 <cipher> 0x00 <ciphertext>`` of the
  zstd content (``ArtifactCodec.seal``), under a keyed digest (HMAC-SHA256 with
  ``Keyring.digest_key()``);
* ``text``: ``lgd:sealed:v1:`` + base64 of ``Keyring.seal(utf-8)`` (``_sealing.seal_text``);
* ``json``: ``{"lgd:sealed": base64 of Keyring.seal(json)}`` beside the keys kept in the
  clear (``_sealing.seal_json``: ``last_failure`` keeps node/type/ids, audit details
  statuses and counts);
* ``metadata``: ``checkpoints.metadata``: the keys of ``_sealing.CLEAR_METADATA`` in the
  clear, the rest under the key ``"lgd:sealed"`` (base64 of ``Keyring.seal(json)``);
* ``copy``: a JSONB copy of other sealed rows (migration backups): re-sealed by
  re-sealing the values inside with the rules above.

Without an encrypting serializer none of these columns changes format.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SealedColumn:
    table: str
    key: tuple[str, ...]
    column: str
    kind: str  # serde | artifact | text | json | metadata | copy
    type_column: str | None = None


_CP_KEY = ("thread_id", "checkpoint_ns", "checkpoint_id")

SEALED: tuple[SealedColumn, ...] = (
    # The stock tables: values through the serializer, metadata's user keys sealed.
    SealedColumn("checkpoint_blobs", ("thread_id", "checkpoint_ns", "channel", "version"), "blob", "serde", "type"),
    SealedColumn(
        "checkpoint_writes", ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"), "blob", "serde", "type"
    ),
    SealedColumn("checkpoints", _CP_KEY, "metadata", "metadata"),
    # checkpoints.checkpoint holds no value with a key (every channel value is a blob);
    # rows written before encryption was on may still hold inline values: rekey moves them.
    SealedColumn("checkpoints", _CP_KEY, "checkpoint", "copy"),
    SealedColumn("durable_artifacts", ("digest",), "data", "artifact"),
    # The idempotency ledger and the journal (journaled calls are ledger rows).
    SealedColumn("durable_ledger", ("key",), "result", "serde", "result_type"),
    SealedColumn("durable_ledger", ("key",), "args_preview", "text"),
    SealedColumn("durable_ledger", ("key",), "error", "text"),
    # Failures: exception texts and tracebacks.
    SealedColumn("durable_threads", ("thread_id",), "last_error", "text"),
    SealedColumn("durable_threads", ("thread_id",), "last_failure", "json"),
    SealedColumn("durable_quarantine", ("thread_id",), "last_error", "text"),
    # Operator actions.
    SealedColumn("durable_audit", ("id",), "detail", "json"),
    # Migration backups: copies of checkpoint rows (their metadata and values as stored).
    SealedColumn("durable_migration_log", ("id",), "old_checkpoint", "copy"),
    SealedColumn("durable_migration_log", ("id",), "old_metadata", "copy"),
    SealedColumn("durable_migration_log", ("id",), "old_writes", "copy"),
    SealedColumn("durable_migration_log", ("id",), "old_blobs", "copy"),
)
