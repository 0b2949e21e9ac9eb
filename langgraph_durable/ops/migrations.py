"""Operator APIs for graph versions: migrate stored threads in batch, list threads and
versions, read the migration log, undo a migration. Sync + ``a*`` pairs, each written
once as a flow or an op (``_io``).

The version gate itself (what a run start does with a stored version) is in
versioning.py (``flow_migrate``); this module drives it over many threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.runnables import RunnableConfig

from langgraph_durable import audit as _audit
from langgraph_durable._io import Batch, Flow, Hook, Op, Stmt, Tx, op_memo
from langgraph_durable._refs import op_closure
from langgraph_durable._view import SaverView
from langgraph_durable.artifacts import REF_TYPE
from langgraph_durable.errors import (
    ArtifactNotFoundError,
    ConfigurationError,
    DurableError,
    MigrationBackupError,
    MigrationError,
    ThreadBusyError,
)
from langgraph_durable.sql.artifacts import (
    ARTIFACT_LOCK_CLASS,
    ARTIFACT_LOCK_SHARED_SQL,
    INSERT_ARTIFACT_REF_SQL,
)
from langgraph_durable.sql.threads import LOCK_THREAD_LEASE_SQL, SET_THREAD_VERSION_SQL
from langgraph_durable.sql.versions import (
    BACKUP_ENVELOPES_SQL,
    DELETE_CHECKPOINT_WRITES_SQL,
    FIND_MIGRATION_SQL,
    HEAD_MIGRATION_SQL,
    LOCK_BACKUP_ARTIFACTS_SQL,
    LOG_SQL,
    MARK_UNDONE_SQL,
    RESTORE_BLOBS_SQL,
    RESTORE_CHECKPOINT_SQL,
    RESTORE_WRITES_SQL,
    SUMMARY_SQL,
    THREADS_SQL,
)
from langgraph_durable.versioning import (
    MIGRATION_ID_KEY,
    VERSION_KEY,
    Migration,
    MigrationRegistry,
    _check_name,
    flow_migrate,
    graph_fingerprint,
)


@dataclass
class MigrationReport:
    """Outcome of ``migrate_threads``: thread ids per outcome, errors by thread."""

    from_version: str
    to_version: str
    dry_run: bool
    steps: list[str]
    migrated: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.busy

    def as_dict(self) -> dict[str, Any]:
        return {
            "from_version": self.from_version,
            "to_version": self.to_version,
            "dry_run": self.dry_run,
            "steps": self.steps,
            "migrated": self.migrated,
            "failed": self.failed,
            "busy": self.busy,
            "skipped": self.skipped,
        }


def _flow_migrate_thread(
    saver: SaverView,
    thread_id: str,
    from_version: str,
    to_version: str,
    chain: Sequence[Migration],
    graph: Any,
    dry_run: bool,
) -> Flow[str]:
    cfg: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    saved = yield Tx(lambda: saver._op_get_tuple(cfg))
    if saved is None or (saved.metadata or {}).get(VERSION_KEY) != from_version:
        return "skipped"  # moved on (a run migrated or finished it) since the listing
    yield from flow_migrate(
        saver, saved, from_version, to_version, chain, graph=graph, origin="batch", dry_run=dry_run
    )
    return "migrated"


@_audit.audited_flow("versions.migrate", _audit.describe_migrate)
def _flow_migrate_threads(
    saver: SaverView,
    from_version: str,
    to_version: str,
    chain: Sequence[Migration],
    graph: Any,
    dry_run: bool,
    thread_ids: Sequence[str] | None,
    limit: int | None,
    on_progress: Callable[[str, str], Any] | None,
) -> Flow[MigrationReport]:
    """The batch migration, written once for both savers: each thread in its own
    transaction(s); a busy or failing thread is reported, never fatal."""
    report = MigrationReport(from_version, to_version, dry_run, [m.label for m in chain])
    rows = yield Tx(lambda: _op_threads(from_version, False, None, thread_ids, limit))
    for row in rows:
        tid = row["thread_id"]
        try:
            outcome = yield from _flow_migrate_thread(
                saver, tid, from_version, to_version, chain, graph, dry_run
            )
        except ThreadBusyError:
            outcome = "busy"
        except DurableError as exc:
            outcome = "failed"
            report.failed[tid] = str(exc)
        _record(report, tid, outcome)
        if on_progress is not None:
            yield Hook(on_progress, (tid, outcome))
    return report


def migrate_threads(
    saver: SaverView,
    from_version: str,
    to_version: str | None = None,
    *,
    graph: Any = None,
    registry: MigrationRegistry | None = None,
    dry_run: bool = False,
    thread_ids: Sequence[str] | None = None,
    limit: int | None = None,
    on_progress: Callable[[str, str], Any] | None = None,
) -> MigrationReport:
    """Migrate every thread whose latest checkpoint is ``from_version`` (sync saver).

    ``to_version`` defaults to ``graph_fingerprint(graph)``; ``registry`` to
    ``saver.migrations``. Each thread is migrated in its own transaction; a thread a
    live run holds is reported ``busy`` and left alone; a failing one is reported in
    ``failed`` with its stored rows untouched. ``dry_run`` runs the migration functions
    and the orphaned-work check without writing. ``on_progress(thread_id, outcome)``
    is called after each thread."""
    to_version, chain = _resolve(saver, from_version, to_version, graph, registry)
    return cast(
        MigrationReport,
        saver.run_flow(
            _flow_migrate_threads(
                saver, from_version, to_version, chain, graph, dry_run, thread_ids, limit, on_progress
            )
        ),
    )


async def amigrate_threads(
    saver: SaverView,
    from_version: str,
    to_version: str | None = None,
    *,
    graph: Any = None,
    registry: MigrationRegistry | None = None,
    dry_run: bool = False,
    thread_ids: Sequence[str] | None = None,
    limit: int | None = None,
    on_progress: Callable[[str, str], Any] | None = None,
) -> MigrationReport:
    """``migrate_threads`` for an ``AsyncDurablePostgresSaver``."""
    to_version, chain = _resolve(saver, from_version, to_version, graph, registry)
    return cast(
        MigrationReport,
        await saver.arun_flow(
            _flow_migrate_threads(
                saver, from_version, to_version, chain, graph, dry_run, thread_ids, limit, on_progress
            )
        ),
    )


def _resolve(
    saver: SaverView, from_version: str, to_version: str | None, graph: Any, registry: MigrationRegistry | None
) -> tuple[str, list[Migration]]:
    _check_name(from_version, "from_version")
    if to_version is None:
        if graph is None:
            raise ConfigurationError("give to_version or the new graph (its fingerprint is the version)")
        to_version = graph_fingerprint(graph)
    reg = registry if registry is not None else saver.migrations
    chain = reg.path(from_version, to_version)
    if not chain:
        raise ConfigurationError(
            f"no registered migration path from {from_version!r} to {to_version!r} "
            f"(registered: {[m.label for m in reg]})",
            from_version=from_version,
            to_version=to_version,
        )
    return to_version, chain


def _record(report: MigrationReport, tid: str, outcome: str) -> None:
    if outcome == "migrated":
        report.migrated.append(tid)
    elif outcome == "busy":
        report.busy.append(tid)
    elif outcome == "skipped":
        report.skipped.append(tid)


def _op_threads(
    version: str | None,
    any_version: bool,
    status: str | None,
    thread_ids: Sequence[str] | None,
    limit: int | None,
) -> Op[list[dict[str, Any]]]:
    params = {
        "any_version": any_version,
        "version": version,
        "status": status,
        "thread_ids": list(thread_ids) if thread_ids is not None else None,
        "limit": limit,
    }
    rows = yield Batch([Stmt(THREADS_SQL, params, fetch=True, prepare=False)])
    return [dict(r) for r in rows[0]]


def thread_ids_at(
    saver: SaverView, version: str | None, *, thread_ids: Sequence[str] | None = None, limit: int | None = None
) -> list[str]:
    """Threads whose latest checkpoint carries ``version`` (``None``: unversioned)."""
    rows = saver.run_op(lambda: _op_threads(version, False, None, thread_ids, limit))
    return [r["thread_id"] for r in rows]


def list_threads(
    saver: SaverView,
    *,
    version: str | None = None,
    any_version: bool = True,
    status: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Per-thread rows: thread_id, graph_version, status, checkpoint_id, step,
    migrated_from, last_activity (newest first)."""
    return list(saver.run_op(lambda: _op_threads(version, any_version, status, None, limit)))


def version_summary(saver: SaverView) -> list[dict[str, Any]]:
    """Threads grouped by the graph version of their latest checkpoint: count, count
    per status (``durable_threads.status``; ``unknown`` when never run by this saver)
    and last activity, most recent version first."""

    def op() -> Op[list[dict[str, Any]]]:
        rows = yield Batch([Stmt(SUMMARY_SQL, None, fetch=True, prepare=False)])
        return [dict(r) for r in rows[0]]

    return group_version_rows(saver.run_op(op))


def group_version_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows of (graph_version, status, threads, last_activity[, newest_thread]) grouped
    per version: count, count per status, unfinished, last activity (and the newest
    thread's start when the rows carry it), most recent version first."""
    groups: dict[str | None, dict[str, Any]] = {}
    for row in rows:
        g = groups.setdefault(
            row["graph_version"],
            {"graph_version": row["graph_version"], "threads": 0, "by_status": {}, "last_activity": None},
        )
        g["threads"] += row["threads"]
        g["by_status"][row["status"]] = row["threads"]
        for key in ("last_activity", "newest_thread"):
            if key in row:
                g.setdefault(key, None)
                if row[key] is not None and (g[key] is None or row[key] > g[key]):
                    g[key] = row[key]
    for g in groups.values():
        g["unfinished"] = g["threads"] - g["by_status"].get("done", 0)
    return sorted(
        groups.values(),
        key=lambda g: (g["last_activity"] is not None, g["last_activity"] or 0),
        reverse=True,
    )


def migration_log(saver: SaverView, *, thread_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Rows of ``durable_migration_log`` (newest first), without the backup payloads."""

    def op() -> Op[list[dict[str, Any]]]:
        rows = yield Batch(
            [Stmt(LOG_SQL, {"thread_id": thread_id, "limit": limit}, fetch=True, prepare=False)]
        )
        return [dict(r) for r in rows[0]]

    return list(saver.run_op(op))


def _op_verify_backup(saver: SaverView, tid: str, log: Mapping[str, Any]) -> Op[list[bytes]]:
    """Every artifact the backup's envelopes need (chunk children included) is stored
    and now locked; returns their digests. Else ``MigrationBackupError``, nothing done."""
    rows = yield Batch([Stmt(BACKUP_ENVELOPES_SQL, (log["id"], REF_TYPE), fetch=True, prepare=False)])
    pairs = [(REF_TYPE, bytes(r["blob"])) for r in rows[0]]
    if not pairs:
        return []
    where = {"thread_id": tid, "checkpoint_ns": log["checkpoint_ns"], "checkpoint_id": log["checkpoint_id"]}
    need = sorted((yield from op_closure(saver, pairs, where)))
    found = yield Batch([Stmt(LOCK_BACKUP_ARTIFACTS_SQL, (need,), fetch=True, prepare=False)])
    missing = sorted(set(need) - {bytes(r["digest"]) for r in found[0]})
    if missing:
        cause = ArtifactNotFoundError(missing[0].hex(), **where)
        raise MigrationBackupError(
            thread_id=tid,
            checkpoint_id=log["checkpoint_id"],
            migration_id=int(log["id"]),
            from_version=log["from_version"],
            to_version=log["to_version"],
            missing=[d.hex() for d in missing],
        ) from cause
    return need


@_audit.audited("versions.undo", _audit.describe_undo)
def op_undo(
    thread_id: str,
    migration_id: int | None = None,
    *,
    saver: SaverView,
    attempt: dict[str, Any] | None = None,
) -> Op[dict[str, Any]]:
    """Restore the rows a migration replaced, if the thread has not moved on since.

    The backup is verified first: every artifact its blobs and writes reference must
    still be stored, else ``MigrationBackupError`` and nothing is touched; the thread's
    reference rows are then re-added for them, so a later GC keeps what the restored
    rows use.

    ``attempt``: a dict shared by the attempts of one call; by default the driver's
    op memo (``_io.op_memo``), which survives its retries after a lost connection."""
    tid = str(thread_id)
    # The memo survives the driver's retries of this op (_io.op_memo): the first attempt
    # records the migration it undoes, so a retry after a lost COMMIT reply finds that
    # one (undone) instead of undoing the migration before it too.
    memo = attempt if attempt is not None else op_memo()
    if "id" in memo:
        migration_id = int(memo["id"])
    log = yield from _op_lock_migration(tid, migration_id, retry="id" in memo)
    result = {
        "migration_id": log["id"],
        "thread_id": tid,
        "checkpoint_id": log["checkpoint_id"],
        "restored_version": log["from_version"],
        "undone_version": log["to_version"],
    }
    if log["undone"]:  # this call's own earlier attempt committed
        return result
    memo["id"] = log["id"]
    yield from _op_check_head(tid, log)
    digests = yield from _op_verify_backup(saver, tid, log)
    yield Batch(_restore_stmts(tid, log, digests))
    return result


def _op_lock_migration(tid: str, migration_id: int | None, *, retry: bool) -> Op[Mapping[str, Any]]:
    """Lock the thread (busy if a live run holds it) and its migration log row."""
    rows = yield Batch(
        [
            # The thread's artifact lock (shared, as a put takes it), before the row lock
            # below: the order every writer takes them in.
            Stmt(ARTIFACT_LOCK_SHARED_SQL, (ARTIFACT_LOCK_CLASS, tid)),
            Stmt(LOCK_THREAD_LEASE_SQL, (tid,), fetch=True),
            Stmt(FIND_MIGRATION_SQL, (tid, retry, migration_id, migration_id), fetch=True),
        ]
    )
    rows = rows[1:]
    lease = rows[0][0] if rows[0] else None
    if lease and lease["lease_owner"] and (lease["expires_in"] or 0) > 0:
        raise ThreadBusyError(tid, lease["lease_owner"], lease["expires_in"])
    if not rows[1]:
        raise MigrationError(
            f"thread {tid!r} has no migration to undo"
            + (f" with id {migration_id}" if migration_id is not None else ""),
            thread_id=tid,
            from_version=None,
            to_version=None,
        )
    return cast("Mapping[str, Any]", rows[1][0])


def _op_check_head(tid: str, log: Mapping[str, Any]) -> Op[None]:
    """The thread's head must still be the migrated checkpoint: else undoing would
    discard the work done since."""
    head = yield Batch(
        [Stmt(HEAD_MIGRATION_SQL, (MIGRATION_ID_KEY, tid, log["checkpoint_ns"]), fetch=True)]
    )
    cur = head[0][0] if head[0] else None
    if cur is None or cur["checkpoint_id"] != log["checkpoint_id"] or cur["migration_id"] != str(log["id"]):
        raise MigrationError(
            f"thread {tid!r} has moved on since migration {log['id']} "
            f"({log['from_version']} -> {log['to_version']}): its latest checkpoint is no longer "
            "the migrated one, so undoing would discard later work; fork from the backup instead",
            thread_id=tid,
            from_version=log["from_version"],
            to_version=log["to_version"],
        )


def _restore_stmts(tid: str, log: Mapping[str, Any], digests: list[bytes]) -> list[Stmt]:
    """The backup's rows back in place, the reference rows for its artifacts, the log
    row marked undone and the thread's version moved back: one batch, one transaction."""
    where = (tid, log["checkpoint_ns"], log["checkpoint_id"])
    refs = [Stmt(INSERT_ARTIFACT_REF_SQL, (tid, digests))] if digests else []
    return [
        *refs,
        Stmt(RESTORE_CHECKPOINT_SQL, (log["id"], *where)),
        Stmt(DELETE_CHECKPOINT_WRITES_SQL, where),
        Stmt(RESTORE_WRITES_SQL, (log["id"],)),
        Stmt(RESTORE_BLOBS_SQL, (log["id"],)),
        Stmt(MARK_UNDONE_SQL, (log["id"],)),
        Stmt(SET_THREAD_VERSION_SQL, (log["from_version"], tid)),
    ]


def undo_migration(saver: SaverView, thread_id: str, migration_id: int | None = None) -> dict[str, Any]:
    """Put back the checkpoint a migration rewrote (latest migration of the thread, or
    ``migration_id``), byte for byte, provided the thread has not run since."""
    return dict(saver.run_op(lambda: op_undo(thread_id, migration_id, saver=saver)))


async def aundo_migration(
    saver: SaverView, thread_id: str, migration_id: int | None = None
) -> dict[str, Any]:
    """``undo_migration`` for an ``AsyncDurablePostgresSaver``."""
    return dict(await saver.arun_op(lambda: op_undo(thread_id, migration_id, saver=saver)))


__all__ = [
    "MigrationReport",
    "amigrate_threads",
    "aundo_migration",
    "list_threads",
    "migrate_threads",
    "migration_log",
    "thread_ids_at",
    "undo_migration",
    "version_summary",
]
