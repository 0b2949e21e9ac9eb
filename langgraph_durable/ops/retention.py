"""Garbage collection of artifacts and retention of checkpoints (issue #5).

Three operations, each a sans-I/O flow run by the saver's own driver (so they work on
the sync and the async saver alike, on the saver's pool and schema):

* :func:`recompute_refs` -- a thread's ``durable_artifact_refs`` rows are a superset of
  what its checkpoints use (a put adds rows, nothing removes them one by one). After
  ``prune`` or retention trimmed a thread, this recomputes them from the envelopes left
  in its blobs and writes (through chunk artifacts), so GC can free the rest.
  ``prune(strategy="keep_latest")`` calls it for you.
* :func:`gc` -- deletes artifacts that no reference row names any more, plus the
  reference rows of threads that have no checkpoint, blob or write left.
* :func:`retain` -- deletes completed threads (``durable_threads.status`` 'done')
  whose last checkpoint is older than N days, and optionally keeps only the last K
  checkpoints of the threads it keeps. Never touches a thread that is running, leased
  or quarantined; 'waiting' (interrupted, awaiting a human), 'stopped' and 'error'
  threads count as live unless ``statuses`` names them. A thread without a row (the
  stock saver's, or a ``leases=False`` saver's) and a 'done' one whose head shows
  work left are judged from the head checkpoint (``_completion``): pending
  interrupt -> 'waiting', error -> 'error', next tasks or half a step -> unfinished
  (never touched).

Why it is safe against concurrent writers:

* ``durable_artifact_refs.digest`` is a foreign key to ``durable_artifacts``: while a
  committed reference row names an artifact, its DELETE fails. GC deletes only
  artifacts without any reference row, skips rows a writer has locked (``FOR UPDATE
  SKIP LOCKED``: a put inserting a reference holds a key-share lock on the artifact),
  and a page that still races into a foreign-key error is retried with a new snapshot.
* A put that reuses an artifact GC just deleted fails with that foreign-key error and
  is retried by the saver with the data (``_DurableBase._write``).
* Whatever deletes reference rows (recompute, GC's orphan sweep, retention,
  ``delete_thread``) takes the thread's exclusive artifact lock; puts that add
  references take it shared. So a reference is never dropped while a put adds it.
* Retention locks the ``durable_threads`` row (``FOR UPDATE``) and re-checks status and
  lease in the same transaction: a run starting meanwhile waits for it (lease
  acquisition and the fence of every leased put lock that row).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any, cast

import psycopg
from langgraph.checkpoint.postgres.base import PRUNE_DELTA_THREADS_SQL

from langgraph_durable import audit as _audit
from langgraph_durable._completion import HEADS_SQL, effective_status
from langgraph_durable._io import AfterCommit, Batch, Flow, Hook, Op, Stmt, Tx, op_memo
from langgraph_durable._refs import artifact_lock, op_recompute_locked
from langgraph_durable._view import SaverView
from langgraph_durable.core.load import _canceled_as_typed
from langgraph_durable.errors import CheckpointLoadError, ConfigurationError
from langgraph_durable.sql.checkpoints import DELETE_THREADS_EXTRA_SQL
from langgraph_durable.sql.retention import (
    ARTIFACT_PAGE_SQL,
    COUNT_ARTIFACTS_SQL,
    COUNT_EXPIRED_LEDGER_KEYS_SQL,
    DELETE_ORPHAN_REFS_SQL,
    ENSURE_ROWS_SQL,
    FREED_ARTIFACTS_SQL,
    GC_DELETE_SQL,
    GC_DRY_SQL,
    LOCK_ROWS_SQL,
    ORPHAN_REFS_COUNT_SQL,
    ORPHAN_THREADS_SQL,
    PURGE_EXPIRED_LEDGER_KEYS_SQL,
    RETAIN_SURVEY_SQL,
    STOCK_TABLE_SIZES,
    THREAD_ROW_LOCK_SQL,
    THREAD_TABLE_DELETE_SQL,
    THREAD_TABLE_STAT_SQL,
    TRIM_BLOBS_SQL,
    TRIM_CHECKPOINTS_SQL,
    TRIM_DRY_SQL,
    TRIM_PARENTS_SQL,
    TRIM_WRITES_SQL,
)
from langgraph_durable.sql.threads import DELETE_THREAD_ROWS_FIRST_SQL, DELETE_THREAD_ROWS_SQL

logger = logging.getLogger("langgraph_durable")

Progress = Callable[[int, int], Any]

# Statuses retention never touches, whatever it is asked.
PROTECTED_STATUSES = frozenset({"running", "quarantined"})
KNOWN_STATUSES = frozenset({"running", "done", "waiting", "stopped", "error", "quarantined"})

_FK_RETRIES = 5

# --------------------------------------------------------------------------- references


def _flow_recompute(
    saver: SaverView, thread_ids: Sequence[str], damaged: list[CheckpointLoadError] | None
) -> Flow[int]:
    total = 0
    for tid in thread_ids:
        try:
            total += yield Tx(partial(_op_recompute_strict, saver, tid))
        except CheckpointLoadError as exc:
            # Skip it (its rows stay) and go on: one damaged thread must not stop the job.
            logger.error("recompute_refs skipped thread %s: %s", tid, exc)
            if damaged is not None:
                damaged.append(exc)
    return total


def _op_recompute_strict(saver: SaverView, thread_id: str) -> Op[int]:
    yield Batch([artifact_lock(thread_id)])
    return (yield from op_recompute_locked(saver, thread_id))


def recompute_refs(
    saver: SaverView, thread_ids: Sequence[str], *, damaged: list[CheckpointLoadError] | None = None
) -> int:
    """Recompute the reference rows of ``thread_ids`` (see the module docstring).
    Returns how many rows were dropped. ``prune`` does this by itself. A thread whose
    stored envelopes do not decode is skipped (its rows kept), logged, and its
    ``CheckpointLoadError`` appended to ``damaged`` when given."""
    return int(saver.run_flow(_flow_recompute(saver, _ids(thread_ids), damaged)))


async def arecompute_refs(
    saver: SaverView, thread_ids: Sequence[str], *, damaged: list[CheckpointLoadError] | None = None
) -> int:
    return int(await saver.arun_flow(_flow_recompute(saver, _ids(thread_ids), damaged)))


def _ids(thread_ids: Sequence[str]) -> list[str]:
    if isinstance(thread_ids, str):
        raise ConfigurationError("thread_ids must be a sequence of thread IDs, not a str")
    return [str(t) for t in thread_ids]


# --------------------------------------------------------------------------- gc


@dataclass
class GcReport:
    """What :func:`gc` removed (or, with ``dry_run``, would remove).

    ``artifacts``/``artifact_bytes``: unreferenced artifacts and their stored size
    (compressed, as ``pg_column_size`` reports it). ``orphan_refs``: reference rows of
    threads with no checkpoint, blob or write left (``orphan_threads`` threads).
    ``scanned``: artifacts examined."""

    artifacts: int = 0
    artifact_bytes: int = 0
    orphan_refs: int = 0
    orphan_threads: int = 0
    scanned: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _seconds(value: float | timedelta, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not isinstance(seconds, int | float) or seconds < 0:
        raise ConfigurationError(f"{name} must be a duration >= 0, not {value!r}", **{name: value})
    return float(seconds)


def _one(rows: list[Any]) -> dict[str, Any]:
    return dict(rows[0]) if rows else {}


@_audit.audited_flow("storage.gc", _audit.describe_gc)
def _flow_gc(
    saver: SaverView, grace: float, batch_size: int, dry_run: bool, progress: Progress | None
) -> Flow[GcReport]:
    report = GcReport(dry_run=dry_run)
    yield from _flow_orphan_refs(saver, dry_run, report)
    yield from _flow_unreferenced(grace, batch_size, dry_run, progress, report)
    return report


def _flow_orphan_refs(saver: SaverView, dry_run: bool, report: GcReport) -> Flow[None]:
    """1. Reference rows of threads that are gone (deleted by something that did not
    delete their references, e.g. the stock saver's delete_thread on this database)."""
    threads: list[str] = yield Tx(_op_orphan_threads)
    report.orphan_threads = len(threads)
    for start in range(0, len(threads), 100):
        part = threads[start : start + 100]
        if dry_run:
            report.orphan_refs += yield Tx(partial(_op_count_orphan_refs, part))
        else:
            report.orphan_refs += yield Tx(partial(_op_sweep_orphan_refs, saver, part))


def _op_orphan_threads() -> Op[list[str]]:
    rows = yield Batch([Stmt(ORPHAN_THREADS_SQL, fetch=True)])
    return [r["thread_id"] for r in rows[0]]


def _op_count_orphan_refs(part: list[str]) -> Op[int]:
    rows = yield Batch([Stmt(ORPHAN_REFS_COUNT_SQL, (part,), fetch=True)])
    return int(rows[0][0]["n"])


def _op_sweep_orphan_refs(saver: SaverView, part: list[str]) -> Op[int]:
    rows = yield Batch(
        [artifact_lock(t) for t in part] + [Stmt(DELETE_ORPHAN_REFS_SQL, (part,), fetch=True)]
    )
    for t in part:
        yield AfterCommit(partial(saver._known_refs.forget_thread, t))
    return int(rows[-1][0]["n"])


def _flow_unreferenced(
    grace: float, batch_size: int, dry_run: bool, progress: Progress | None, report: GcReport
) -> Flow[None]:
    """2. Unreferenced artifacts, a page of digests per transaction (keyset order, so
    the table is walked once however much is deleted)."""
    n_total: int = yield Tx(_op_count_artifacts)
    lo = b""
    while True:
        for attempt in range(_FK_RETRIES + 1):
            try:
                scanned, hi, got = yield Tx(partial(_op_gc_page, lo, batch_size, grace, dry_run))
                break
            except psycopg.errors.ForeignKeyViolation:
                # A put referenced one of the page's artifacts after our snapshot: the
                # whole page rolled back; a new snapshot sees the reference.
                if attempt == _FK_RETRIES:
                    raise
        if hi is None:
            break
        report.scanned += scanned
        report.artifacts += int(got.get("n") or 0)
        report.artifact_bytes += int(got.get("bytes") or 0)
        if progress is not None:
            yield Hook(progress, (report.scanned, max(n_total, report.scanned)))
        if scanned < batch_size:
            break
        lo = hi


def _op_count_artifacts() -> Op[int]:
    rows = yield Batch([Stmt(COUNT_ARTIFACTS_SQL, fetch=True)])
    return int(rows[0][0]["n"])


def _op_gc_page(
    lo: bytes, batch_size: int, grace: float, dry_run: bool
) -> Op[tuple[int, bytes | None, dict[str, Any]]]:
    # A retry after a lost COMMIT reply finds the page's artifacts deleted by
    # the committed first attempt: report what that attempt deleted (op_memo).
    memo = op_memo()
    rows = yield Batch([Stmt(ARTIFACT_PAGE_SQL, (lo, batch_size), fetch=True)])
    if not rows[0]:
        return memo.get("page", (0, None, {}))
    hi = bytes(rows[0][-1]["digest"])
    params = {"lo": lo, "hi": hi, "grace": grace}
    sql = GC_DRY_SQL if dry_run else GC_DELETE_SQL
    out = yield Batch([Stmt(sql, params, fetch=True, prepare=False)])
    got = _one(out[0])
    if "page" in memo and not int(got.get("n") or 0):
        return cast("tuple[int, bytes | None, dict[str, Any]]", memo["page"])
    memo["page"] = (len(rows[0]), hi, got)
    return len(rows[0]), hi, got


def gc(
    saver: SaverView,
    *,
    grace: float | timedelta = 600.0,
    batch_size: int = 1000,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> GcReport:
    """Delete artifacts no checkpoint, blob or write references any more.

    ``grace`` (seconds or a timedelta): artifacts younger than this are kept even when
    unreferenced. Not needed for safety (see the module docstring), it keeps GC away
    from writes in flight from older versions of this package. ``progress(done,
    total)`` is called after each page of ``batch_size`` artifacts."""
    if batch_size < 1:
        raise ConfigurationError("batch_size must be >= 1", batch_size=batch_size)
    with _canceled_as_typed("gc", None):
        return saver.run_flow(
            _flow_gc(saver, _seconds(grace, "grace"), batch_size, dry_run, progress)
        )


async def agc(
    saver: SaverView,
    *,
    grace: float | timedelta = 600.0,
    batch_size: int = 1000,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> GcReport:
    if batch_size < 1:
        raise ConfigurationError("batch_size must be >= 1", batch_size=batch_size)
    with _canceled_as_typed("gc", None):
        return await saver.arun_flow(
            _flow_gc(saver, _seconds(grace, "grace"), batch_size, dry_run, progress)
        )


# --------------------------------------------------------------------------- retention


@dataclass
class RetentionReport:
    """What :func:`retain` deleted (or, with ``dry_run``, would delete).

    ``threads_deleted``: completed threads removed whole; ``threads_trimmed``: threads
    cut to their last ``keep_last`` checkpoints. Row counts and ``bytes`` (stored size
    of the checkpoint JSON, blobs and writes, as ``pg_column_size`` reports it) cover
    both. ``artifacts``/``artifact_bytes``: artifacts only the deleted threads used,
    which the next ``gc`` frees (trimming frees more, known only after it ran).
    ``ledger_keys_expired``: ``@idempotent(key=..., ttl=...)`` keys past their TTL.
    ``skipped``: threads left alone, by reason; ``damaged``: the threads skipped because
    their stored bytes do not decode (left untouched, the job goes on)."""

    threads_deleted: int = 0
    threads_trimmed: int = 0
    checkpoints: int = 0
    blobs: int = 0
    writes: int = 0
    bytes: int = 0
    artifacts: int = 0
    artifact_bytes: int = 0
    refs_dropped: int = 0
    ledger_keys_expired: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    deleted_thread_ids: list[str] = field(default_factory=list)
    # Threads skipped because stored bytes do not decode (skipped["damaged"] counts
    # them): thread_id, checkpoint_id and the error, for the operator to inspect.
    damaged: list[dict[str, Any]] = field(default_factory=list)
    dry_run: bool = False
    # With archive=URL: threads written and verified before their delete, and the files.
    threads_archived: int = 0
    archive_bytes: int = 0
    archive_files: list[str] = field(default_factory=list)
    # Threads whose archive could not be written or verified (skipped["archive_failed"]
    # counts them; they stay in the database): thread_id, file and error.
    archive_failed: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _protected(status: str | None, leased: bool, row_status: str | None = None) -> str | None:
    """Why a thread must not be touched at all, or None. ``status`` is the effective
    one (_completion.effective_status); 'unfinished': no row (or a 'done' one) but the
    checkpoint shows work left (killed mid-run, or run without leases)."""
    if leased:
        return "leased"
    if status == "running" and row_status != "running":
        return "unfinished"
    if status in PROTECTED_STATUSES:
        return str(status)
    return None


def _op_effective(rows: list[dict[str, Any]]) -> Op[None]:
    """Set ``effective`` on each row (thread_id, status): threads without a row, or
    with 'done', are judged from their head checkpoint (issue 11, defect 4)."""
    judge = [r["thread_id"] for r in rows if r["status"] in (None, "done")]
    heads: dict[str, dict[str, Any]] = {}
    for start in range(0, len(judge), 1000):
        out = yield Batch([Stmt(HEADS_SQL, (judge[start : start + 1000],), fetch=True, prepare=False)])
        heads.update({h["thread_id"]: dict(h) for h in out[0]})
    for r in rows:
        r["effective"] = (
            effective_status(r["status"], heads.get(r["thread_id"]))
            if r["status"] in (None, "done")
            else r["status"]
        )


def _add_stats(report: RetentionReport, table: str, n: int, size: int) -> None:
    if table == "checkpoints":
        report.checkpoints += n
    elif table == "checkpoint_blobs":
        report.blobs += n
    else:
        report.writes += n
    report.bytes += size


@dataclass(frozen=True)
class _Retain:
    """One ``retain`` call's arguments, as its steps need them."""

    saver: SaverView
    older_than: float
    keep_last: int | None
    statuses: frozenset[str]
    dry_run: bool
    batch_size: int
    archive: Any = None
    aio: bool = False


@_audit.audited_flow("storage.retain", _audit.describe_retain)
def _flow_retain(
    saver: SaverView,
    older_than: float,
    keep_last: int | None,
    statuses: frozenset[str],
    dry_run: bool,
    batch_size: int,
    progress: Progress | None,
    archive: Any = None,
    aio: bool = False,
) -> Flow[RetentionReport]:
    job = _Retain(saver, older_than, keep_last, statuses, dry_run, batch_size, archive, aio)
    report = RetentionReport(dry_run=dry_run)
    threads: list[dict[str, Any]] = yield Tx(_op_survey)
    doomed, live = _classify(job, threads, report)
    total = len(doomed) + len(live)
    done = 0
    # Completed threads, whole, a batch per transaction. Ops return what they did (the
    # flow updates the report): a factory is re-run after a lost connection.
    for start in range(0, len(doomed), batch_size):
        done += yield from _flow_delete_batch(job, doomed[start : start + batch_size], report)
        if progress is not None:
            yield Hook(progress, (done, total))
    # Live threads: keep the last K checkpoints per namespace, one thread per transaction.
    for tid in live:
        yield from _flow_trim(job, tid, report)
        done += 1
        if progress is not None:
            yield Hook(progress, (done, total))
    # Ledger keys given with key= outlive their thread and expire only by their TTL:
    # the retention job purges the expired ones too (never a claim still in flight).
    report.ledger_keys_expired = yield Tx(partial(_op_purge_keys, dry_run))
    return report


def _op_survey() -> Op[list[dict[str, Any]]]:
    rows = yield Batch([Stmt(RETAIN_SURVEY_SQL, fetch=True, prepare=False)])
    found = [dict(r) for r in rows[0]]
    yield from _op_effective(found)
    return found


def _classify(
    job: _Retain, threads: list[dict[str, Any]], report: RetentionReport
) -> tuple[list[str], list[str]]:
    """The threads to delete whole (completed, old enough) and the ones to trim."""
    doomed: list[str] = []
    live: list[str] = []
    for t in threads:
        reason = _protected(t["effective"], bool(t["leased"]), t["status"])
        if reason is not None:
            report._skip(reason)
            continue
        completed = t["effective"] in job.statuses
        if completed and t["age_s"] is not None and t["age_s"] > job.older_than:
            doomed.append(t["thread_id"])
        elif job.keep_last is not None:
            live.append(t["thread_id"])
    return doomed, live


def _flow_delete_batch(job: _Retain, part: list[str], report: RetentionReport) -> Flow[int]:
    """Delete one batch of completed threads (archived first with archive=URL) and
    count it in the report. Returns how many threads the batch settled."""
    from langgraph_durable import archive as _archive

    # archive=URL: every thread of the batch is written, read back and verified
    # first (archive.py); the delete below then skips a thread whose rows changed.
    expect: dict[str, str] | None = None
    manifests: dict[str, Any] = {}
    n_failed = 0
    if job.archive is not None and not job.dry_run:
        manifests, failed = yield from _archive.op_archive_batch(job.saver, job.archive, part, job.aio)
        expect = {t: m["fingerprint"] for t, m in manifests.items()}
        for tid, exc in failed.items():
            # Kept, and the rest of the batch still goes: one thread's file must not
            # block retention of the others on every run. The error names the file.
            logger.error("retain: thread %r not archived, kept: %s", tid, exc)
            report._skip("archive_failed")
            report.archive_failed.append(
                {"thread_id": tid, "url": getattr(exc, "url", ""), "error": f"{type(exc).__name__}: {exc}"}
            )
        part = [t for t in part if t not in failed]
        n_failed = len(failed)
        if not part:
            return n_failed
    changed: list[str] = []
    ids: list[str] = []
    skipped: list[str] = []
    deleted: list[Any] | None = None
    while part:
        try:
            ids, skipped, deleted = yield Tx(partial(_op_delete, job, part, expect))
            break
        except Exception as exc:
            if expect is None or not isinstance(exc, _archive.ChangedSinceArchive):
                raise
            # Rolled back: a write landed between the check and the deletes. The
            # rest of the batch goes again; these stay (their archive is stale).
            changed += exc.threads
            part = [t for t in part if t not in exc.threads]
    skipped += ["changed_since_archive"] * len(changed)
    for reason in skipped:
        report._skip(reason)
    for (table, _), row in zip(STOCK_TABLE_SIZES, (deleted or [])[:3], strict=False):
        _add_stats(report, table, int(row["n"]), int(row["bytes"]))
    if deleted is not None:
        report.artifacts += int(deleted[3]["n"])
        report.artifact_bytes += int(deleted[3]["bytes"])
    report.threads_deleted += len(ids)
    report.deleted_thread_ids.extend(ids)
    if expect is not None:
        for archived in ids:
            report.threads_archived += 1
            report.archive_bytes += int(manifests[archived]["payload_bytes"])
            report.archive_files.append(manifests[archived]["url"])
    return len(part) + len(changed) + n_failed


def _op_delete(
    job: _Retain, part: list[str], expect: dict[str, str] | None
) -> Op[tuple[list[str], list[str], list[Any]]]:
    """One batch's transaction: (deleted ids, skip reasons, [stats of the stock tables
    ..., freed artifacts])."""
    if job.dry_run:
        out = yield Batch(
            [Stmt(THREAD_TABLE_STAT_SQL.format(table=t, size=s), (part,), fetch=True) for t, s in STOCK_TABLE_SIZES]
            + [Stmt(FREED_ARTIFACTS_SQL, {"ids": part}, fetch=True, prepare=False)]
        )
        return part, [], [r[0] for r in out]
    ids, skipped, created = yield from _op_lock_and_judge(job, part)
    if expect is not None and ids:
        from langgraph_durable import archive as _archive

        # Delete only what the archive holds: the same rows, under the locks.
        fp = yield Batch([_archive.fingerprint_stmt(ids, created)])
        now = {f["thread_id"]: f["fp"] for f in fp[0]}
        same = [t for t in ids if t in expect and now.get(t) == expect[t]]
        skipped += ["changed_since_archive"] * (len(ids) - len(same))
        ids = same
    # Rows created above for threads now kept go again: no row is not 'done'.
    kept_created = sorted(set(created) - set(ids))
    if expect is not None:
        stats = yield from _op_delete_archived(job, ids, created, kept_created, expect)
    else:
        out = yield Batch(
            [Stmt(FREED_ARTIFACTS_SQL, {"ids": ids}, fetch=True, prepare=False)]
            # The locked rows go before the checkpoints (see DELETE_THREAD_ROWS_FIRST_SQL).
            + [Stmt(DELETE_THREAD_ROWS_FIRST_SQL, (ids,))]
            + [Stmt(THREAD_TABLE_DELETE_SQL.format(table=t, size=s), (ids,), fetch=True) for t, s in STOCK_TABLE_SIZES]
            # Every per-thread table of the package (THREAD_TABLES): no
            # migration backup, ledger or quarantine row outlives the thread.
            + [Stmt(s, (ids,)) for s in DELETE_THREADS_EXTRA_SQL]
            + [Stmt(DELETE_THREAD_ROWS_SQL, (kept_created,))]
        )
        stats = [r[0] for r in out[2:5] + out[:1]]
    for t in ids:
        yield AfterCommit(partial(job.saver._known_refs.forget_thread, t))
    return ids, skipped, stats


def _op_lock_and_judge(job: _Retain, part: list[str]) -> Op[tuple[list[str], list[str], list[str]]]:
    """Lock every row (creating one for threads that have none, so a run that starts
    meanwhile waits), then decide again under the locks. Returns (ids to delete, skip
    reasons, ids whose row this created)."""
    made = yield Batch(
        [artifact_lock(t) for t in part] + [Stmt(ENSURE_ROWS_SQL, (part,), fetch=True)]
    )
    created = [r["thread_id"] for r in made[-1]]
    rows = yield Batch(
        [Stmt(LOCK_ROWS_SQL, {"ids": part, "created": created}, fetch=True, prepare=False)]
    )
    # Judge again under the locks, from the head checkpoint for threads whose
    # row was just created ("no row") or says 'done'.
    locked = [
        {**dict(r), "status": None if r["thread_id"] in created else r["status"]}
        for r in rows[0]
    ]
    yield from _op_effective(locked)
    ids: list[str] = []
    skipped: list[str] = []
    for r in locked:
        reason = _protected(r["effective"], bool(r["leased"]), r["status"])
        if r["thread_id"] in created and r["age_s"] is None:
            # No checkpoint left: deleted meanwhile (or by this batch's own
            # first attempt, committed before its reply was lost).
            skipped.append("gone")
        elif reason is not None:
            skipped.append(reason)
        elif r["effective"] not in job.statuses or r["age_s"] is None or r["age_s"] <= job.older_than:
            skipped.append("changed")
        else:
            ids.append(r["thread_id"])
    return ids, skipped, created


def _op_delete_archived(
    job: _Retain, ids: list[str], created: list[str], kept_created: list[str], expect: dict[str, str]
) -> Op[list[Any]]:
    """Deletes that prove they removed exactly the archived rows (else
    ``ChangedSinceArchive``, and the transaction rolls back)."""
    from langgraph_durable import archive as _archive

    out = yield Batch(
        [Stmt(FREED_ARTIFACTS_SQL, {"ids": ids}, fetch=True, prepare=False)]
        + _archive.delete_checked_stmts(ids, created, dict(STOCK_TABLE_SIZES))
        + [Stmt(DELETE_THREAD_ROWS_SQL, (kept_created,))]
    )
    got = _archive.check_deleted(out[1:-1], ids, expect)  # or roll back
    return [got[t] for t, _ in STOCK_TABLE_SIZES] + [out[0][0]]


def _flow_trim(job: _Retain, tid: str, report: RetentionReport) -> Flow[None]:
    """Trim one live thread to its last K checkpoints per namespace; count it."""
    try:
        outcome, stats = yield Tx(partial(_op_trim, job, tid))
    except CheckpointLoadError as exc:
        # The trim rolled back whole; the thread stays as it was and the job goes on.
        logger.error("retain skipped thread %s: %s", tid, exc)
        report.damaged.append(
            {"thread_id": tid, "checkpoint_id": exc.fields.get("checkpoint_id"), "error": str(exc)}
        )
        outcome, stats = "damaged", {}
    if outcome == "trimmed":
        report.threads_trimmed += 1
        report.checkpoints += stats["checkpoints"]
        report.writes += stats["writes"]
        report.blobs += stats["blobs"]
        report.bytes += stats["bytes"]
        report.refs_dropped += stats.get("refs", 0)
    elif outcome != "untouched":
        report._skip(outcome)


def _op_trim(job: _Retain, tid: str) -> Op[tuple[str, dict[str, int]]]:
    assert job.keep_last is not None
    params = {"tid": tid, "k": job.keep_last}
    if not job.dry_run:
        yield Batch([artifact_lock(tid)])
        rows = yield Batch([Stmt(THREAD_ROW_LOCK_SQL, (tid,), fetch=True)])
        if rows[0]:
            reason = _protected(rows[0][0]["status"], bool(rows[0][0]["leased"]))
            if reason is not None:
                return reason, {}
    delta = yield Batch(
        [Stmt(PRUNE_DELTA_THREADS_SQL, ([tid], [tid]), fetch=True, prepare=False)]
    )
    if delta[0]:
        # A DeltaChannel value is rebuilt from ancestors' writes back to its
        # last snapshot: trimming would lose it (the stock prune refuses too).
        return "delta_channel", {}
    if job.dry_run:
        out = yield Batch([Stmt(TRIM_DRY_SQL, params, fetch=True, prepare=False)])
        r = out[0][0]
        stats = {
            "checkpoints": int(r["checkpoints"]),
            "writes": int(r["writes"]),
            "blobs": int(r["blobs"]),
            "bytes": int(r["checkpoint_bytes"]) + int(r["write_bytes"]) + int(r["blob_bytes"]),
        }
        return ("trimmed" if stats["checkpoints"] else "untouched"), stats
    out = yield Batch([Stmt(TRIM_CHECKPOINTS_SQL, params, fetch=True, prepare=False)])
    gone = out[0]
    if not gone:
        return "untouched", {}
    out = yield Batch(
        [
            Stmt(
                TRIM_WRITES_SQL,
                {
                    "tid": tid,
                    "ns": [g["checkpoint_ns"] for g in gone],
                    "ids": [g["checkpoint_id"] for g in gone],
                },
                fetch=True,
                prepare=False,
            ),
            Stmt(TRIM_BLOBS_SQL, params, fetch=True, prepare=False),
            Stmt(TRIM_PARENTS_SQL, params, prepare=False),
        ]
    )
    dropped = yield from op_recompute_locked(job.saver, tid)
    return "trimmed", {
        "checkpoints": len(gone),
        "writes": int(out[0][0]["n"]),
        "blobs": int(out[1][0]["n"]),
        "bytes": sum(int(g["size"]) for g in gone)
        + int(out[0][0]["bytes"])
        + int(out[1][0]["bytes"]),
        "refs": dropped,
    }


def _op_purge_keys(dry_run: bool) -> Op[int]:
    if dry_run:
        rows = yield Batch([Stmt(COUNT_EXPIRED_LEDGER_KEYS_SQL, fetch=True)])
        return int(rows[0][0]["n"])
    rows = yield Batch([Stmt(PURGE_EXPIRED_LEDGER_KEYS_SQL, fetch=True)])
    return len(rows[0])


def _retain_args(
    older_than_days: float | timedelta, keep_last: int | None, statuses: Sequence[str], batch_size: int
) -> tuple[float, int | None, frozenset[str], int]:
    if isinstance(older_than_days, timedelta):
        older = _seconds(older_than_days, "older_than_days")
    else:
        older = _seconds(older_than_days, "older_than_days") * 86400.0
    if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
        raise ConfigurationError(
            f"keep_last must be None or an int >= 1, not {keep_last!r}", keep_last=keep_last
        )
    if isinstance(statuses, str):
        statuses = [statuses]
    chosen = frozenset(statuses)
    unknown = chosen - KNOWN_STATUSES
    if unknown:
        raise ConfigurationError(
            f"unknown thread status(es) {sorted(unknown)}; known: {sorted(KNOWN_STATUSES)}",
            statuses=sorted(chosen),
        )
    forbidden = chosen & PROTECTED_STATUSES
    if forbidden:
        raise ConfigurationError(
            f"retention never deletes {sorted(forbidden)} threads (running threads are "
            "recovered, quarantined ones released or deleted by an operator)",
            statuses=sorted(chosen),
        )
    if batch_size < 1:
        raise ConfigurationError("batch_size must be >= 1", batch_size=batch_size)
    return older, keep_last, chosen, batch_size


def retain(
    saver: SaverView,
    *,
    older_than_days: float | timedelta = 30,
    keep_last: int | None = None,
    statuses: Sequence[str] = ("done",),
    dry_run: bool = False,
    batch_size: int = 100,
    progress: Progress | None = None,
    archive: str | None = None,
    archive_limits: Any = None,
) -> RetentionReport:
    """Apply the retention policy (see the module docstring).

    ``older_than_days``: a completed thread whose last checkpoint (or last status
    change) is older than this is deleted whole (days, or a timedelta).
    ``keep_last``: trim every other untouchable-free thread to its last K checkpoints
    per namespace (DeltaChannel threads are skipped). ``statuses``: the
    ``durable_threads`` statuses that count as completed (threads without a row are
    judged from their head checkpoint); 'running' and 'quarantined' are refused.
    Artifacts are freed by :func:`gc`.

    ``archive``: a directory or fsspec URL (``s3://bucket/prefix``); each thread is
    written there (one verified file, see :mod:`langgraph_durable.archive`) before it
    is deleted, and :func:`langgraph_durable.archive.restore` loads it back. Threads
    trimmed by ``keep_last`` are not archived. A thread whose file cannot be written or
    verified (``archive_limits``: an ``ArchiveLimits``) is kept and listed in
    ``report.archive_failed``; the others are archived and deleted."""
    args = _retain_args(older_than_days, keep_last, statuses, batch_size)
    store = _store(archive, archive_limits, saver.serde)
    with _canceled_as_typed("retain", None):
        return saver.run_flow(
            _flow_retain(saver, *args[:3], dry_run, args[3], progress, store, False)
        )


async def aretain(
    saver: SaverView,
    *,
    older_than_days: float | timedelta = 30,
    keep_last: int | None = None,
    statuses: Sequence[str] = ("done",),
    dry_run: bool = False,
    batch_size: int = 100,
    progress: Progress | None = None,
    archive: str | None = None,
    archive_limits: Any = None,
) -> RetentionReport:
    args = _retain_args(older_than_days, keep_last, statuses, batch_size)
    store = _store(archive, archive_limits, saver.serde)
    with _canceled_as_typed("retain", None):
        return await saver.arun_flow(
            _flow_retain(saver, *args[:3], dry_run, args[3], progress, store, True)
        )


def _store(archive: str | None, limits: Any, serde: Any) -> Any:
    if archive is None:
        return None
    from langgraph_durable.archive import Store

    return Store(archive, limits, serde)


__all__ = [
    "GcReport",
    "RetentionReport",
    "agc",
    "aretain",
    "arecompute_refs",
    "gc",
    "recompute_refs",
    "retain",
]
