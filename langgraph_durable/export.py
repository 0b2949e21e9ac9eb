"""No lock-in: rewrite threads into the rows the stock ``PostgresSaver`` writes.

The durable saver uses the stock tables with the stock layout; the only rows the stock
saver cannot read are values stored *by reference* (type tag ``durable+ref``, see
``artifacts.py``): a channel blob or a pending write replaced by an envelope that points
into ``durable_artifacts``. ``export_stock`` inlines them: each envelope is resolved
(artifacts fetched and verified), the value decoded, and the row rewritten with
``serde.dumps_typed(value)``, which is exactly what the stock saver stores for that
value (a ``DeltaChannel`` snapshot included). Everything else is already stock:
checkpoint JSON (the durable saver inlines a subset of what the stock saver inlines,
and the stock reader merges blobs over inline values), metadata (the ``graph_version``,
``migrated_from`` and ``migration_id`` keys stay: the stock saver keeps any metadata),
pending writes below the threshold, blobs of other types. And one more rewrite (issue
26): channel versions in this package's compact form (``_chanver``) are put in the stock
form, same counters, in the checkpoints' ``channel_versions`` and ``versions_seen`` and in
the blob rows' keys (the stock ``get_next_version`` cannot continue from a compact one).

One transaction per thread, under the thread's row lock: a thread a live run holds is
reported busy and left alone; a thread whose artifacts are missing or damaged is
reported failed, nothing of it written. Running it again is harmless (a thread with no
envelope left has nothing to do). The artifacts themselves are not deleted (retention's
GC collects what no thread references any more, or ``durable_*`` tables are dropped
when uninstalling, see docs/uninstall.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, cast

from langgraph_durable import _chanver, _sealing
from langgraph_durable import audit as _audit
from langgraph_durable._io import Batch, Flow, Hook, Op, Stmt, Tx
from langgraph_durable._view import SaverView
from langgraph_durable.artifacts import REF_TYPE
from langgraph_durable.core.jsonb import jsonb
from langgraph_durable.errors import DurableError, ThreadBusyError
from langgraph_durable.sql.export import (
    COMPACT_BLOB_VERSIONS_SQL,
    EXPORT_THREADS_SQL,
    REF_BLOBS_SQL,
    REF_WRITES_SQL,
    SEALED_METADATA_SQL,
    THREAD_CHECKPOINT_COUNT_SQL,
    THREAD_VERSIONS_SQL,
    UPDATE_BLOB_SQL,
    UPDATE_BLOB_VERSION_SQL,
    UPDATE_CHECKPOINT_VERSIONS_SQL,
    UPDATE_METADATA_SQL,
    UPDATE_WRITE_SQL,
)
from langgraph_durable.sql.threads import LOCK_THREAD_LEASE_SQL


@dataclass
class ThreadExport:
    """What exporting one thread changed (or, dry run, would change)."""

    thread_id: str
    checkpoints: int = 0
    blobs: int = 0  # channel blobs inlined (envelope -> stock bytes)
    writes: int = 0  # pending writes inlined
    envelope_bytes: int = 0  # size of the envelopes replaced
    stock_bytes: int = 0  # size of the stock rows written instead
    channels: list[str] = field(default_factory=list)  # channels whose blobs changed
    metadata: int = 0  # checkpoints whose sealed run metadata was opened (issue 27)
    versions: int = 0  # checkpoint and blob rows whose compact versions became stock ones

    @property
    def changed(self) -> bool:
        return bool(self.blobs or self.writes or self.metadata or self.versions)


@dataclass
class ExportReport:
    """Outcome of ``export_stock``: per-thread changes, busy and failed threads."""

    dry_run: bool
    threads: list[ThreadExport] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.busy and not self.failed

    def totals(self) -> dict[str, int]:
        return {
            "threads": len(self.threads),
            "threads_changed": sum(1 for t in self.threads if t.changed),
            "checkpoints": sum(t.checkpoints for t in self.threads),
            "blobs": sum(t.blobs for t in self.threads),
            "writes": sum(t.writes for t in self.threads),
            "metadata": sum(t.metadata for t in self.threads),
            "envelope_bytes": sum(t.envelope_bytes for t in self.threads),
            "stock_bytes": sum(t.stock_bytes for t in self.threads),
            "versions": sum(t.versions for t in self.threads),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "totals": self.totals(),
            "threads": [asdict(t) for t in self.threads],
            "busy": self.busy,
            "failed": self.failed,
        }


@_audit.audited("export.stock", _audit.describe_export)
def op_export_thread(saver: SaverView, thread_id: str, dry_run: bool) -> Op[ThreadExport]:
    """Inline every by-reference value of one thread, in one transaction."""
    tid = str(thread_id)
    rows = yield Batch(
        [
            Stmt(LOCK_THREAD_LEASE_SQL, (tid,), fetch=True),
            Stmt(THREAD_CHECKPOINT_COUNT_SQL, (tid,), fetch=True),
            Stmt(REF_BLOBS_SQL, (tid, REF_TYPE), fetch=True, prepare=False),
            Stmt(REF_WRITES_SQL, (tid, REF_TYPE), fetch=True, prepare=False),
            Stmt(SEALED_METADATA_SQL, (tid, _sealing.SEALED_METADATA_KEY), fetch=True, prepare=False),
            Stmt(THREAD_VERSIONS_SQL, (tid,), fetch=True, prepare=False),
            Stmt(COMPACT_BLOB_VERSIONS_SQL, (tid,), fetch=True, prepare=False),
        ]
    )
    lease = rows[0][0] if rows[0] else None
    if saver.leases_enabled and lease and lease["lease_owner"] and (lease["expires_in"] or 0) > 0:
        raise ThreadBusyError(tid, lease["lease_owner"], lease["expires_in"])
    out = ThreadExport(tid, checkpoints=int(rows[1][0]["n"]))
    blobs, writes = rows[2], rows[3]
    # Sealed run metadata (issue 27): opened, as the stock saver stores metadata (in the
    # clear: the stock layout has no place for it sealed; the values stay encrypted).
    ring = _sealing.keyring_of(saver.serde)
    metadata_params = [
        (json.dumps(_sealing.open_metadata(ring, dict(r["metadata"]), thread_id=tid,
                                           checkpoint_id=r["checkpoint_id"])),
         tid, r["checkpoint_ns"], r["checkpoint_id"])
        for r in rows[4]
    ]
    out.metadata = len(metadata_params)
    version_stmts = _stock_version_stmts(tid, rows[5], rows[6])
    out.versions = sum(len(s.params) for s in version_stmts)
    if metadata_params:
        # After the envelopes' updates too (below); the two touch different columns.
        version_stmts.insert(0, Stmt(UPDATE_METADATA_SQL, metadata_params, many=True))
    if not blobs and not writes:
        if version_stmts and not dry_run:
            yield Batch(version_stmts)
        return out
    where = {"thread_id": tid, "checkpoint_ns": "", "checkpoint_id": None}
    pairs = [(REF_TYPE, bytes(r["blob"])) for r in (*blobs, *writes)]
    local = yield from saver._op_resolve(pairs, where)
    blob_params = []
    for r in blobs:
        at = {**where, "checkpoint_ns": r["checkpoint_ns"]}
        value = saver._decode(REF_TYPE, bytes(r["blob"]), at, local)
        tag, data = saver.serde.dumps_typed(value)
        blob_params.append(
            (tag, data, tid, r["checkpoint_ns"], r["channel"], r["version"], REF_TYPE)
        )
        out.envelope_bytes += len(r["blob"])
        out.stock_bytes += len(data)
        if r["channel"] not in out.channels:
            out.channels.append(r["channel"])
    write_params = []
    for r in writes:
        at = {**where, "checkpoint_ns": r["checkpoint_ns"], "checkpoint_id": r["checkpoint_id"]}
        value = saver._decode(REF_TYPE, bytes(r["blob"]), at, local)
        tag, data = saver.serde.dumps_typed(value)
        write_params.append(
            (
                tag,
                data,
                tid,
                r["checkpoint_ns"],
                r["checkpoint_id"],
                r["task_id"],
                r["idx"],
                REF_TYPE,
            )
        )
        out.envelope_bytes += len(r["blob"])
        out.stock_bytes += len(data)
    out.blobs, out.writes = len(blob_params), len(write_params)
    if dry_run:
        return out
    stmts = []
    if blob_params:
        stmts.append(Stmt(UPDATE_BLOB_SQL, blob_params, many=True))
    if write_params:
        stmts.append(Stmt(UPDATE_WRITE_SQL, write_params, many=True))
    # After the envelopes' updates, which find the blob rows by their current version.
    stmts += version_stmts
    yield Batch(stmts)
    return out


def _stock_version_stmts(tid: str, checkpoints: list[Any], blobs: list[Any]) -> list[Stmt]:
    """The updates putting a thread's compact channel versions in the stock form: the
    checkpoints that hold one (``channel_versions``, ``versions_seen``) and the blob
    rows keyed by one. Same counters, so the order LangGraph compares is kept."""
    cp_params = []
    for r in checkpoints:
        body = {"channel_versions": r["versions"], "versions_seen": r["seen"]}
        if not _chanver.has_compact(body):
            continue
        versions = r["versions"] if not isinstance(r["versions"], dict) else _chanver.stock_versions(r["versions"])
        seen = r["seen"] if not isinstance(r["seen"], dict) else _chanver.stock_seen(r["seen"])
        cp_params.append((jsonb(versions), jsonb(seen), tid, r["checkpoint_ns"], r["checkpoint_id"]))
    blob_params = [
        (_chanver.to_stock(r["version"]), tid, r["checkpoint_ns"], r["channel"], r["version"])
        for r in blobs
        if _chanver.is_compact(r["version"])
    ]
    stmts = []
    if cp_params:
        stmts.append(Stmt(UPDATE_CHECKPOINT_VERSIONS_SQL, cp_params, many=True))
    if blob_params:
        stmts.append(Stmt(UPDATE_BLOB_VERSION_SQL, blob_params, many=True))
    return stmts


def op_thread_ids(thread_ids: Sequence[str] | None) -> Op[list[str]]:
    """Threads with checkpoints (all, or those of ``thread_ids`` that exist)."""
    ids = list(thread_ids) if thread_ids is not None else None
    rows = yield Batch([Stmt(EXPORT_THREADS_SQL, {"thread_ids": ids}, fetch=True, prepare=False)])
    return [r["thread_id"] for r in rows[0]]


def _flow_export(
    saver: SaverView,
    thread_ids: Sequence[str] | None,
    dry_run: bool,
    on_progress: Callable[[str, str], Any] | None,
) -> Flow[ExportReport]:
    report = ExportReport(dry_run)
    for tid in (yield Tx(partial(op_thread_ids, thread_ids))):
        outcome = "exported"
        try:
            done = yield Tx(partial(op_export_thread, saver, tid, dry_run))
            report.threads.append(done)
            if not done.changed:
                outcome = "unchanged"
        except ThreadBusyError:
            outcome = "busy"
            report.busy.append(tid)
        except DurableError as exc:
            outcome = "failed"
            report.failed[tid] = str(exc)
        if on_progress is not None:
            yield Hook(on_progress, (tid, outcome))
    return report


def export_stock(
    saver: SaverView,
    *,
    thread_ids: Sequence[str] | None = None,
    dry_run: bool = False,
    on_progress: Callable[[str, str], Any] | None = None,
) -> ExportReport:
    """Rewrite threads (all, or ``thread_ids``) into plain stock rows, so the stock
    ``PostgresSaver`` reads them with the same ``get_state`` and history (sync saver).
    ``dry_run`` resolves and re-encodes everything but writes nothing.
    ``on_progress(thread_id, outcome)`` is called after each thread."""
    return cast(ExportReport, saver.run_flow(_flow_export(saver, thread_ids, dry_run, on_progress)))


async def aexport_stock(
    saver: SaverView,
    *,
    thread_ids: Sequence[str] | None = None,
    dry_run: bool = False,
    on_progress: Callable[[str, str], Any] | None = None,
) -> ExportReport:
    """``export_stock`` for an ``AsyncDurablePostgresSaver``."""
    return cast(
        ExportReport, await saver.arun_flow(_flow_export(saver, thread_ids, dry_run, on_progress))
    )


# --- verification: read a thread back, checkpoint by checkpoint ---------------------------


def snapshot_thread(saver: SaverView, thread_id: str) -> list[dict[str, Any]]:
    """Every checkpoint of a thread (all namespaces, newest first) as ``list`` returns
    it, through any ``BaseCheckpointSaver`` (the stock one or ours): config, checkpoint
    (values included), metadata, parent and pending writes."""
    out = []
    for t in saver.list({"configurable": {"thread_id": str(thread_id)}}):
        out.append(
            {
                "config": t.config,
                "checkpoint": t.checkpoint,
                "metadata": t.metadata,
                "parent_config": t.parent_config,
                "pending_writes": list(t.pending_writes or []),
            }
        )
    return out


def _stock_checkpoint(checkpoint: dict[str, Any]) -> dict[str, Any]:
    out = dict(checkpoint)
    if isinstance(out.get("channel_versions"), dict):
        out["channel_versions"] = _chanver.stock_versions(out["channel_versions"])
    if isinstance(out.get("versions_seen"), dict):
        out["versions_seen"] = _chanver.stock_seen(out["versions_seen"])
    return out


def compare_snapshots(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """Where two snapshots of a thread differ (empty: identical)."""
    problems: list[str] = []
    if len(before) != len(after):
        problems.append(f"{len(before)} checkpoints before, {len(after)} after")
    for a, b in zip(before, after, strict=False):
        cid = a["config"]["configurable"].get("checkpoint_id")
        for key in ("config", "metadata", "parent_config", "pending_writes"):
            if a[key] != b[key]:
                problems.append(f"checkpoint {cid}: {key} differs")
        # Compact channel versions compare as their stock form (what export writes).
        ca, cb = _stock_checkpoint(a["checkpoint"]), _stock_checkpoint(b["checkpoint"])
        for key in sorted(set(ca) | set(cb)):
            if key == "channel_values":
                va, vb = ca.get(key) or {}, cb.get(key) or {}
                for ch in sorted(set(va) | set(vb)):
                    if ch not in va or ch not in vb or va[ch] != vb[ch]:
                        problems.append(f"checkpoint {cid}: channel {ch!r} differs")
            elif ca.get(key) != cb.get(key):
                problems.append(f"checkpoint {cid}: {key} differs")
    return problems


# The tables this package adds (uninstalling: export_stock, then drop these). The stock
# tables (checkpoints, checkpoint_blobs, checkpoint_writes, checkpoint_migrations) stay.
DURABLE_TABLES = (
    "durable_artifact_refs",
    "durable_artifacts",
    "durable_audit",
    "durable_graph_versions",
    "durable_ledger",
    "durable_migration_log",
    "durable_migrations",
    "durable_quarantine",
    "durable_secrets",
    "durable_thread_counts",
    "durable_threads",
    "durable_workers",
)
DURABLE_FUNCTIONS = (
    "durable_fence(text, bigint, text)",
    "durable_foreign_lease(text)",
    "durable_checkpoint_order(text, text, text)",
    "durable_thread_counts_row()",
    "durable_thread_counts_truncate()",
    "durable_put_guard(text, bigint, text, boolean, text, text)",
    "durable_unroot(text[])",
    "durable_root_deleted()",
    "durable_root_moved()",
    "durable_root_truncated()",
    "durable_guard_fail(text, text, bigint, text, text)",
)
DURABLE_INDEXES = ("durable_checkpoints_run_idx",)  # on the stock checkpoints table
# On the stock checkpoints table too (they keep durable_threads.has_root honest): dropped
# before DURABLE_FUNCTIONS, which they use.
DURABLE_TRIGGERS = ("durable_root_del", "durable_root_upd", "durable_root_trunc")
# The natural order of thread ids (the console's list; its index goes with durable_threads).
DURABLE_COLLATIONS = ("durable_natural",)

__all__ = [
    "DURABLE_COLLATIONS",
    "DURABLE_FUNCTIONS",
    "DURABLE_INDEXES",
    "DURABLE_TABLES",
    "DURABLE_TRIGGERS",
    "compare_snapshots",
    "snapshot_thread",
    "ExportReport",
    "ThreadExport",
    "aexport_stock",
    "export_stock",
    "op_export_thread",
]
