"""``rekey``: re-encrypt every sealed column with the current key (issue 27).

The saver's serializer names the keys (``DurableEncryptedSerializer(current=new,
old=[old, ...])``): every column of ``sql.sealed.SEALED`` is walked in primary-key order,
one page of rows per transaction (``FOR UPDATE``, so a concurrent writer of the same row
waits), and each value not already under the current key is opened with the key that
wrote it and sealed again with the current one. The plaintext never leaves the process
and is never stored.

Resumable: a page commits whole or not at all, and a value already under the current
key is recognised (it authenticates with it) and left alone, so a rerun after a kill
(SIGKILL included) skips what the killed run finished and never encrypts anything twice.
A value no configured key opens stops the run with ``DecryptionError`` naming the thread
and the column; the pages before it stay re-encrypted (they read with the current key).
A walk that re-encrypted rows is followed by another until one finds every row under
the current key (``RekeyReport.passes``): a row copied in SQL behind the walk (a
``copy_thread`` from a thread not reached yet into one already passed) would otherwise
keep the old key after a rekey that said it was done.
The database's digest secret (``durable_secrets``) is one of the columns: once a run
has finished, every old key may leave the configuration, and artifact digests and call
fingerprints keep matching (they never depended on a key; digest27).
A completed run is recorded in ``durable_audit`` (``storage.rekey``: key id, rows walked
and re-encrypted per column).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, cast

from langgraph_durable import audit as _audit
from langgraph_durable._io import Batch, Flow, Hook, Op, Stmt, Tx, op_memo
from langgraph_durable._sealing import JSON_KEY, TEXT_PREFIX
from langgraph_durable._view import SaverView
from langgraph_durable.artifacts import REF_TYPE, recrypt_envelope, recrypt_stored_artifact
from langgraph_durable.errors import ConfigurationError, RekeyError
from langgraph_durable.keyring import Keyring, is_sealed
from langgraph_durable.sql.sealed import SEALED, SealedColumn, count_sql, page_sql, update_sql

__all__ = ["RekeyReport", "arekey", "rekey"]

Progress = Callable[[int, int], Any]


@dataclass
class RekeyReport:
    """``columns[name] = {"scanned": n, "rekeyed": m}``; ``key_id``: the current key's id."""

    key_id: str = ""
    columns: dict[str, dict[str, int]] = field(default_factory=dict)
    # Walks of every column: a walk that re-encrypted rows is followed by a checking one
    # (rows copied behind the walk meanwhile); ``scanned`` counts the first walk's rows.
    passes: int = 0

    @property
    def scanned(self) -> int:
        return sum(c["scanned"] for c in self.columns.values())

    @property
    def rekeyed(self) -> int:
        return sum(c["rekeyed"] for c in self.columns.values())

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "scanned": self.scanned, "rekeyed": self.rekeyed}


def describe_rekey(result: RekeyReport, *args: Any, **kwargs: Any) -> _audit.AuditRecord:
    return _audit.AuditRecord(detail=result.as_dict())


def _recrypt_serde(ring: Keyring, typ: str | None, data: bytes, **where: Any) -> bytes | None:
    recrypt: Callable[[bytes], bytes | None] = partial(ring.recrypt_serde, **where)
    if typ == REF_TYPE:
        return recrypt_envelope(data, recrypt)
    if typ is not None and "+" in typ:
        return recrypt(data)
    return None  # plaintext (stored before encryption): rekey changes keys only


def _recrypt_json(ring: Keyring, entries: list[dict[str, Any]], **where: Any) -> str | None:
    changed = False
    out = []
    for entry in entries:
        blob = entry.get("blob")
        if blob is not None:
            new = _recrypt_serde(ring, entry.get("type"), base64.b64decode(blob), **where)
            if new is not None:
                entry = {**entry, "blob": base64.b64encode(new).decode()}
                changed = True
        out.append(entry)
    return json.dumps(out) if changed else None


def _recrypt_sealed_b64(ring: Keyring, value: str, **where: Any) -> str | None:
    new = ring.recrypt_sealed(base64.b64decode(value), **where)
    return None if new is None else base64.b64encode(new).decode("ascii")


def _recrypt_text(ring: Keyring, value: Any, **where: Any) -> str | None:
    """``lgd:sealed:v1:<base64>`` text (``_sealing.seal_text``); other text is plaintext."""
    if not isinstance(value, str) or not value.startswith(TEXT_PREFIX):
        return None
    new = _recrypt_sealed_b64(ring, value[len(TEXT_PREFIX):], **where)
    return None if new is None else TEXT_PREFIX + new


def _recrypt_object(ring: Keyring, value: Any, **where: Any) -> str | None:
    """A JSON object whose ``"lgd:sealed"`` key holds the sealed part (``seal_json``,
    ``seal_metadata``), the rest in the clear; as JSON text for the update."""
    if not isinstance(value, dict) or not isinstance(value.get(JSON_KEY), str):
        return None
    new = _recrypt_sealed_b64(ring, value[JSON_KEY], **where)
    return None if new is None else json.dumps({**value, JSON_KEY: new})


def _recrypt_row(ring: Keyring, col: SealedColumn, row: dict[str, Any]) -> Any:
    """The row's new column value, or None when it is already under the current key."""
    data = row[col.column]
    if data is None:
        return None
    where: dict[str, Any] = {
        "thread_id": row.get(col.thread_column) if col.thread_column else None,
        "where": col.name,
        "checkpoint_id": row.get(col.checkpoint_column) if col.checkpoint_column else None,
    }
    if col.kind == "serde":
        return _recrypt_serde(ring, row[col.type_column] if col.type_column else None, bytes(data), **where)
    if col.kind == "artifact":
        return recrypt_stored_artifact(bytes(data), partial(ring.recrypt_serde, **where))
    if col.kind == "sealed":
        return ring.recrypt_sealed(bytes(data), **where) if is_sealed(bytes(data)) else None
    if col.kind == "serde_json":
        return _recrypt_json(ring, list(data), **where)
    if col.kind == "text":
        return _recrypt_text(ring, data, **where)
    if col.kind in ("json", "metadata"):
        return _recrypt_object(ring, data, **where)
    raise RekeyError(f"unknown sealed column kind {col.kind!r}", column=col.name)


def _op_count(columns: Sequence[SealedColumn]) -> Op[int]:
    tables = sorted({c.table for c in columns})
    rows = yield Batch([Stmt(count_sql(SealedColumn(t, (), "", "")), fetch=True) for t in tables])
    by_table = {t: int(r[0]["n"]) for t, r in zip(tables, rows, strict=True)}
    return sum(by_table[c.table] for c in columns)


def _op_page(
    ring: Keyring, col: SealedColumn, after: tuple[Any, ...] | None, batch_size: int
) -> Op[tuple[int, int, tuple[Any, ...] | None]]:
    """(rows scanned, rows re-encrypted, last key) of one page, in one transaction."""
    memo = op_memo()  # a retry after a lost COMMIT reply finds the page already current
    params = (*(after or ()), batch_size)
    rows = yield Batch([Stmt(page_sql(col, after is None), params, fetch=True, prepare=False)])
    page = rows[0]
    if not page:
        return 0, 0, None
    updates = []
    for row in page:
        new = _recrypt_row(ring, col, row)
        if new is not None:
            updates.append((new, *(row[k] for k in col.keys)))
    if updates:
        yield Batch([Stmt(update_sql(col), updates, many=True, prepare=False)])
    last = tuple(page[-1][k] for k in col.keys)
    if "page" in memo and not updates:
        return cast("tuple[int, int, tuple[Any, ...] | None]", memo["page"])
    memo["page"] = (len(page), len(updates), last)
    return len(page), len(updates), last


# A walk that re-encrypted rows is followed by another, until one finds every row under
# the current key: a row copied in SQL while a walk runs (copy_thread, an undo's restored
# backup, ...) from a row the walk had not reached yet into a range it had passed keeps
# the old key, and a rekey that said "done" over it would let the old key be dropped
# with that row still needing it (tests/test_encryption_paths.py). Rows that keep coming
# under an old key after that many walks mean a writer still seals with it.
MAX_PASSES = 4


@_audit.audited_flow("storage.rekey", describe_rekey)
def _flow_rekey(
    ring: Keyring, columns: Sequence[SealedColumn], batch_size: int, progress: Progress | None
) -> Flow[RekeyReport]:
    report = RekeyReport(key_id=ring.current_id)
    while True:
        report.passes += 1
        changed_in_pass = 0
        total: int = yield Tx(partial(_op_count, columns))
        done = 0
        for col in columns:
            stats = report.columns.setdefault(col.name, {"scanned": 0, "rekeyed": 0})
            after: tuple[Any, ...] | None = None
            while True:
                scanned, changed, last = yield Tx(partial(_op_page, ring, col, after, batch_size))
                if report.passes == 1:
                    stats["scanned"] += scanned
                stats["rekeyed"] += changed
                changed_in_pass += changed
                done += scanned
                if progress is not None and scanned:
                    yield Hook(progress, (min(done, max(total, done)), max(total, done)))
                if last is None or scanned < batch_size:
                    break
                after = last
        if not changed_in_pass:
            return report
        if report.passes >= MAX_PASSES:
            raise RekeyError(
                f"rows under an old key kept appearing during {report.passes} walks "
                f"({changed_in_pass} in the last): a writer still seals with an old key as "
                "its current one (every saver must list the new key first); rerun when they do"
            )


def _args(saver: SaverView, batch_size: int) -> Keyring:
    if batch_size < 1:
        raise ConfigurationError("batch_size must be >= 1", batch_size=batch_size)
    ring = Keyring.from_serde(saver.serde)
    if ring is None:
        raise RekeyError("the saver's serializer does not encrypt: configure "
                         "serde=DurableEncryptedSerializer(current=new_key, old=[old_key])")
    if not ring.keys:
        raise RekeyError("the serializer's cipher is not one whose keys the package knows "
                         "(DurableEncryptedSerializer or from_pycryptodome_aes)")
    return ring


def rekey(
    saver: SaverView,
    *,
    batch_size: int = 500,
    progress: Progress | None = None,
    columns: Sequence[SealedColumn] = SEALED,
) -> RekeyReport:
    """Re-encrypt every sealed column with the saver's current key (see the module
    docstring). ``progress(done, total)`` is called after each page."""
    ring = _args(saver, batch_size)
    return cast("RekeyReport", saver.run_flow(_flow_rekey(ring, columns, batch_size, progress)))


async def arekey(
    saver: SaverView,
    *,
    batch_size: int = 500,
    progress: Progress | None = None,
    columns: Sequence[SealedColumn] = SEALED,
) -> RekeyReport:
    ring = _args(saver, batch_size)
    return cast("RekeyReport", await saver.arun_flow(_flow_rekey(ring, columns, batch_size, progress)))
