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

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any, cast

import psycopg
from langgraph.checkpoint.postgres.base import PRUNE_DELTA_THREADS_SQL

from langgraph_durable import _sql
from langgraph_durable._completion import HEADS_SQL, effective_status
from langgraph_durable._io import AfterCommit, Batch, Flow, Hook, Op, Stmt, Tx, op_memo
from langgraph_durable._values import ISO_TS_RE, canceled_error
from langgraph_durable.artifacts import REF_TYPE
from langgraph_durable.errors import CheckpointLoadError, ConfigurationError

logger = logging.getLogger("langgraph_durable")

Progress = Callable[[int, int], Any]

# Statuses retention never touches, whatever it is asked.
PROTECTED_STATUSES = frozenset({"running", "quarantined"})
KNOWN_STATUSES = frozenset({"running", "done", "waiting", "stopped", "error", "quarantined"})

_FK_RETRIES = 5

# --------------------------------------------------------------------------- SQL

# A thread's envelopes, with where they are (for an error naming a damaged one): its
# blobs and writes, and the blobs and writes kept by its migration backups not yet undone
# (durable_migration_log): undo_migration puts those back, so the artifacts they name
# must outlive a prune + gc (issue 11, defect 2).
_ENVELOPES_SQL = """
SELECT blob, checkpoint_ns, channel, version, NULL::text AS checkpoint_id
FROM checkpoint_blobs WHERE thread_id = %s AND type = %s AND blob IS NOT NULL
UNION ALL
SELECT blob, checkpoint_ns, channel, NULL, checkpoint_id
FROM checkpoint_writes WHERE thread_id = %s AND type = %s
UNION ALL
SELECT decode(e.blob, 'base64'), l.checkpoint_ns, e.channel, NULL, l.checkpoint_id
FROM durable_migration_log l,
     jsonb_to_recordset(l.old_blobs || l.old_writes) AS e(type text, blob text, channel text)
WHERE l.thread_id = %s AND l.undone_at IS NULL AND e.type = %s AND e.blob IS NOT NULL
"""
# Error path: the newest checkpoint that uses a blob's channel version.
_BLOB_CHECKPOINT_SQL = """
SELECT max(checkpoint_id) AS checkpoint_id FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint -> 'channel_versions' ->> %s = %s
"""

# Keep exactly ``keep``: drop the rest, and add rows the envelopes need but lack (a
# database written before reference rows were complete), for artifacts that exist.
_DROP_REFS_SQL = """
WITH d AS (
    DELETE FROM durable_artifact_refs
    WHERE thread_id = %s AND NOT (digest = ANY(%b::bytea[]))
    RETURNING 1
) SELECT count(*)::bigint AS n FROM d
"""
_REPAIR_REFS_SQL = """
INSERT INTO durable_artifact_refs (thread_id, digest)
SELECT %s, a.digest FROM durable_artifacts a WHERE a.digest = ANY(%b::bytea[])
ON CONFLICT DO NOTHING
"""

# (A thread whose migration backup is still undoable is not an orphan: see above.)
_ORPHAN_THREADS_SQL = """
SELECT DISTINCT r.thread_id FROM durable_artifact_refs r
WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = r.thread_id)
  AND NOT EXISTS (SELECT 1 FROM checkpoint_blobs b WHERE b.thread_id = r.thread_id)
  AND NOT EXISTS (SELECT 1 FROM checkpoint_writes w WHERE w.thread_id = r.thread_id)
  AND NOT EXISTS (SELECT 1 FROM durable_migration_log l
                  WHERE l.thread_id = r.thread_id AND l.undone_at IS NULL)
ORDER BY r.thread_id
"""
_ORPHAN_REFS_COUNT_SQL = """
SELECT count(*)::bigint AS n FROM durable_artifact_refs WHERE thread_id = ANY(%s)
"""
_DELETE_ORPHAN_REFS_SQL = """
WITH d AS (
    DELETE FROM durable_artifact_refs r
    WHERE r.thread_id = ANY(%s)
      AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = r.thread_id)
      AND NOT EXISTS (SELECT 1 FROM checkpoint_blobs b WHERE b.thread_id = r.thread_id)
      AND NOT EXISTS (SELECT 1 FROM checkpoint_writes w WHERE w.thread_id = r.thread_id)
      AND NOT EXISTS (SELECT 1 FROM durable_migration_log l
                      WHERE l.thread_id = r.thread_id AND l.undone_at IS NULL)
    RETURNING 1
) SELECT count(*)::bigint AS n FROM d
"""

_COUNT_ARTIFACTS_SQL = "SELECT count(*)::bigint AS n FROM durable_artifacts"
_ARTIFACT_PAGE_SQL = """
SELECT digest FROM durable_artifacts WHERE digest > %b ORDER BY digest LIMIT %s
"""
# An artifact is garbage when no reference row names it and it is older than the grace
# period; SKIP LOCKED passes over rows a put is referencing right now (its foreign-key
# check holds a key-share lock on them).
_GC_DRY_SQL = """
SELECT count(*)::bigint AS n, COALESCE(sum(pg_column_size(x.data)), 0)::bigint AS bytes
FROM durable_artifacts x
WHERE x.digest > %(lo)b AND x.digest <= %(hi)b
  AND x.created_at < now() - make_interval(secs => %(grace)s)
  AND NOT EXISTS (SELECT 1 FROM durable_artifact_refs r WHERE r.digest = x.digest)
"""
_GC_DELETE_SQL = """
WITH d AS (
    DELETE FROM durable_artifacts a WHERE a.digest IN (
        SELECT x.digest FROM durable_artifacts x
        WHERE x.digest > %(lo)b AND x.digest <= %(hi)b
          AND x.created_at < now() - make_interval(secs => %(grace)s)
          AND NOT EXISTS (SELECT 1 FROM durable_artifact_refs r WHERE r.digest = x.digest)
        FOR UPDATE OF x SKIP LOCKED)
    RETURNING pg_column_size(a.data) AS size
) SELECT count(*)::bigint AS n, COALESCE(sum(size), 0)::bigint AS bytes FROM d
"""

# One row per thread: its last checkpoint (any namespace; checkpoint ids are
# time-ordered uuid6), how old that is, and its durable status and lease.
_THREADS_SQL = """
WITH last AS (
    SELECT DISTINCT ON (thread_id) thread_id, checkpoint ->> 'ts' AS ts
    FROM checkpoints ORDER BY thread_id, checkpoint_id DESC
)
SELECT l.thread_id,
       EXTRACT(EPOCH FROM (now() - GREATEST(
           CASE WHEN l.ts ~ '^\\d{4}-\\d{2}-\\d{2}' THEN l.ts::timestamptz END,
           t.updated_at)))::float8 AS age_s,
       t.status,
       (t.lease_owner IS NOT NULL AND t.lease_expires_at > now()) AS leased
FROM last l LEFT JOIN durable_threads t ON t.thread_id = l.thread_id
ORDER BY l.thread_id
"""

# Lock (or create, to lock) the thread rows retention is about to delete; a run that
# starts meanwhile waits for this transaction. Re-read what decides.
_ENSURE_ROWS_SQL = """
INSERT INTO durable_threads (thread_id, status)
SELECT t, 'done' FROM unnest(%s::text[]) AS t
ON CONFLICT (thread_id) DO NOTHING
RETURNING thread_id
"""
_LOCK_ROWS_SQL = """
SELECT t.thread_id, t.status,
       (t.lease_owner IS NOT NULL AND t.lease_expires_at > now()) AS leased,
       EXTRACT(EPOCH FROM (now() - GREATEST(
           (SELECT CASE WHEN c.checkpoint ->> 'ts' ~ '^\\d{4}-\\d{2}-\\d{2}'
                        THEN (c.checkpoint ->> 'ts')::timestamptz END
            FROM checkpoints c WHERE c.thread_id = t.thread_id
            ORDER BY c.checkpoint_id DESC LIMIT 1),
           CASE WHEN NOT (t.thread_id = ANY(%(created)s)) THEN t.updated_at END)))::float8 AS age_s
FROM durable_threads t WHERE t.thread_id = ANY(%(ids)s)
ORDER BY t.thread_id
FOR UPDATE OF t
"""

# Only ISO timestamps are cast (a damaged "ts" must not fail the whole survey).
_THREADS_SQL, _LOCK_ROWS_SQL = (
    q.replace("'^\\d{4}-\\d{2}-\\d{2}'", "'" + ISO_TS_RE + "'") for q in (_THREADS_SQL, _LOCK_ROWS_SQL)
)

_STAT = "SELECT count(*)::bigint AS n, COALESCE(sum({size}), 0)::bigint AS bytes FROM {table} WHERE thread_id = ANY(%s)"
_DEL = (
    "WITH d AS (DELETE FROM {table} WHERE thread_id = ANY(%s) RETURNING {size} AS size) "
    "SELECT count(*)::bigint AS n, COALESCE(sum(size), 0)::bigint AS bytes FROM d"
)
_TABLES = (
    ("checkpoints", "pg_column_size(checkpoint) + pg_column_size(metadata)"),
    ("checkpoint_blobs", "COALESCE(pg_column_size(blob), 0)"),
    ("checkpoint_writes", "pg_column_size(blob)"),
)

# Artifacts that only the given threads reference (what GC frees after deleting them).
_FREED_ARTIFACTS_SQL = """
SELECT count(*)::bigint AS n, COALESCE(sum(pg_column_size(a.data)), 0)::bigint AS bytes
FROM durable_artifacts a
WHERE EXISTS (SELECT 1 FROM durable_artifact_refs r WHERE r.digest = a.digest AND r.thread_id = ANY(%(ids)s))
  AND NOT EXISTS (SELECT 1 FROM durable_artifact_refs r
                  WHERE r.digest = a.digest AND NOT (r.thread_id = ANY(%(ids)s)))
"""

# Trimming one thread to its last K checkpoints per namespace (rank 1 = newest).
_TRIM_DRY_SQL = """
WITH ranked AS (
    SELECT checkpoint_ns, checkpoint_id, checkpoint -> 'channel_versions' AS versions,
           row_number() OVER (PARTITION BY checkpoint_ns ORDER BY checkpoint_id DESC) AS rn
    FROM checkpoints WHERE thread_id = %(tid)s
)
SELECT
  (SELECT count(*) FROM ranked WHERE rn > %(k)s)::bigint AS checkpoints,
  (SELECT COALESCE(sum(pg_column_size(c.checkpoint) + pg_column_size(c.metadata)), 0)
     FROM checkpoints c JOIN ranked r USING (checkpoint_ns, checkpoint_id)
     WHERE c.thread_id = %(tid)s AND r.rn > %(k)s)::bigint AS checkpoint_bytes,
  (SELECT count(*) FROM checkpoint_writes w JOIN ranked r USING (checkpoint_ns, checkpoint_id)
     WHERE w.thread_id = %(tid)s AND r.rn > %(k)s)::bigint AS writes,
  (SELECT COALESCE(sum(pg_column_size(w.blob)), 0)
     FROM checkpoint_writes w JOIN ranked r USING (checkpoint_ns, checkpoint_id)
     WHERE w.thread_id = %(tid)s AND r.rn > %(k)s)::bigint AS write_bytes,
  (SELECT count(*) FROM checkpoint_blobs b WHERE b.thread_id = %(tid)s AND NOT EXISTS (
     SELECT 1 FROM ranked r WHERE r.rn <= %(k)s AND r.checkpoint_ns = b.checkpoint_ns
       AND r.versions ->> b.channel = b.version))::bigint AS blobs,
  (SELECT COALESCE(sum(pg_column_size(b.blob)), 0) FROM checkpoint_blobs b
     WHERE b.thread_id = %(tid)s AND NOT EXISTS (
     SELECT 1 FROM ranked r WHERE r.rn <= %(k)s AND r.checkpoint_ns = b.checkpoint_ns
       AND r.versions ->> b.channel = b.version))::bigint AS blob_bytes
"""
_TRIM_CHECKPOINTS_SQL = """
WITH ranked AS (
    SELECT checkpoint_ns, checkpoint_id, checkpoint -> 'channel_versions' AS versions,
           row_number() OVER (PARTITION BY checkpoint_ns ORDER BY checkpoint_id DESC) AS rn
    FROM checkpoints WHERE thread_id = %(tid)s
)
DELETE FROM checkpoints c USING ranked r
WHERE c.thread_id = %(tid)s AND c.checkpoint_ns = r.checkpoint_ns
  AND c.checkpoint_id = r.checkpoint_id AND r.rn > %(k)s
RETURNING c.checkpoint_ns, c.checkpoint_id,
          pg_column_size(c.checkpoint) + pg_column_size(c.metadata) AS size
"""
_TRIM_WRITES_SQL = """
WITH d AS (
    DELETE FROM checkpoint_writes w
    USING unnest(%(ns)s::text[], %(ids)s::text[]) AS g(checkpoint_ns, checkpoint_id)
    WHERE w.thread_id = %(tid)s AND w.checkpoint_ns = g.checkpoint_ns
      AND w.checkpoint_id = g.checkpoint_id
    RETURNING pg_column_size(w.blob) AS size
) SELECT count(*)::bigint AS n, COALESCE(sum(size), 0)::bigint AS bytes FROM d
"""
_TRIM_BLOBS_SQL = """
WITH d AS (
    DELETE FROM checkpoint_blobs b
    WHERE b.thread_id = %(tid)s AND NOT EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns
          AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)
    RETURNING COALESCE(pg_column_size(b.blob), 0) AS size
) SELECT count(*)::bigint AS n, COALESCE(sum(size), 0)::bigint AS bytes FROM d
"""
# Like the stock prune: a kept checkpoint whose parent is gone becomes a root.
_TRIM_PARENTS_SQL = """
UPDATE checkpoints c SET parent_checkpoint_id = NULL
WHERE c.thread_id = %(tid)s AND c.parent_checkpoint_id IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM checkpoints p
    WHERE p.thread_id = c.thread_id AND p.checkpoint_ns = c.checkpoint_ns
      AND p.checkpoint_id = c.parent_checkpoint_id)
"""
_THREAD_ROW_LOCK_SQL = """
SELECT status, (lease_owner IS NOT NULL AND lease_expires_at > now()) AS leased
FROM durable_threads WHERE thread_id = %s FOR UPDATE
"""


# --------------------------------------------------------------------------- references


def _lock(thread_id: str) -> Stmt:
    return Stmt(_sql.ARTIFACT_LOCK_SQL, (_sql.ARTIFACT_LOCK_CLASS, thread_id))


def _op_closure(saver: Any, pairs: list[tuple[str, bytes]], where: dict[str, Any]) -> Op[set[bytes]]:
    """Every digest the envelopes reference, chunk children included (chunk artifacts
    are fetched, verified and expanded; a chunk that is gone has no children to keep)."""
    codec = saver.codec
    local: dict[bytes, bytes] = {}
    gone: set[bytes] = set()
    while True:
        seen, need = codec.referenced(pairs, local)
        need -= gone
        if not need:
            return seen
        rows = yield Batch(
            [Stmt(_sql.FETCH_ARTIFACTS_SQL, (sorted(need),), fetch=True, prepare=False)]
        )
        found = [(r["digest"], r["data"]) for r in rows[0]]
        codec.accept(found, serde=saver.serde, local=local, **where)
        gone |= need - {bytes(d) for d, _ in found}


def _op_recompute_locked(saver: Any, thread_id: str) -> Op[int]:
    """Raises ``CheckpointLoadError`` when an envelope or chunk does not decode: what it
    references is unknown then, so no reference row may be dropped."""
    rows = yield Batch(
        [Stmt(_ENVELOPES_SQL, (thread_id, REF_TYPE) * 3, fetch=True, prepare=False)]
    )
    where = {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": None}
    pairs = []
    for r in rows[0]:
        pair = (REF_TYPE, bytes(r["blob"]))
        try:
            saver.codec.referenced([pair])
        except Exception as exc:  # damaged bytes: name the checkpoint that holds them
            cid = r["checkpoint_id"]
            if r["version"] is not None:
                at = yield Batch(
                    [
                        Stmt(
                            _BLOB_CHECKPOINT_SQL,
                            (thread_id, r["checkpoint_ns"], r["channel"], r["version"]),
                            fetch=True,
                        )
                    ]
                )
                cid = at[0][0]["checkpoint_id"] if at[0] else None
            kind = "channel" if r["version"] is not None else "pending write of channel"
            raise CheckpointLoadError(
                f"cannot decode the artifact envelope of {kind} {r['channel']!r} in checkpoint "
                f"{cid!r} of thread {thread_id!r}: {type(exc).__name__}: {exc}",
                thread_id=thread_id,
                checkpoint_ns=r["checkpoint_ns"],
                checkpoint_id=cid,
            ) from exc
        pairs.append(pair)
    keep = yield from _op_closure(saver, pairs, where)
    digests = sorted(keep)
    out = yield Batch(
        [
            Stmt(_DROP_REFS_SQL, (thread_id, digests), fetch=True, prepare=False),
            Stmt(_REPAIR_REFS_SQL, (thread_id, digests), prepare=False),
        ]
    )
    yield AfterCommit(lambda: saver._known_refs.forget_thread(thread_id))
    return int(out[0][0]["n"])


def op_recompute_refs(saver: Any, thread_id: str) -> Op[int]:
    """Recompute one thread's reference rows from its remaining blobs and writes
    (under its exclusive artifact lock). Returns the number of rows dropped. A thread
    with a damaged envelope keeps every row (logged; 0 dropped): what it references is
    unknown, and dropping a row it needs would let GC delete live data."""
    tid = str(thread_id)
    yield Batch([_lock(tid)])
    try:
        return (yield from _op_recompute_locked(saver, tid))
    except CheckpointLoadError as exc:
        logger.error("thread %s: reference rows kept as they are: %s", tid, exc)
        return 0


def _flow_recompute(
    saver: Any, thread_ids: Sequence[str], damaged: list[CheckpointLoadError] | None
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


def _op_recompute_strict(saver: Any, thread_id: str) -> Op[int]:
    yield Batch([_lock(thread_id)])
    return (yield from _op_recompute_locked(saver, thread_id))


def recompute_refs(
    saver: Any, thread_ids: Sequence[str], *, damaged: list[CheckpointLoadError] | None = None
) -> int:
    """Recompute the reference rows of ``thread_ids`` (see the module docstring).
    Returns how many rows were dropped. ``prune`` does this by itself. A thread whose
    stored envelopes do not decode is skipped (its rows kept), logged, and its
    ``CheckpointLoadError`` appended to ``damaged`` when given."""
    return int(saver.run_flow(_flow_recompute(saver, _ids(thread_ids), damaged)))


async def arecompute_refs(
    saver: Any, thread_ids: Sequence[str], *, damaged: list[CheckpointLoadError] | None = None
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


@contextlib.contextmanager
def _canceled_as_typed(operation: str) -> Iterator[None]:
    """A statement the database canceled (statement_timeout, lock_timeout: 57014,
    55P03) as ``StatementCanceledError``, like the saver's own operations."""
    try:
        yield
    except psycopg.Error as exc:
        err = canceled_error(exc, operation, None, None)
        if err is None:
            raise
        raise err from exc


def _flow_gc(
    saver: Any, grace: float, batch_size: int, dry_run: bool, progress: Progress | None
) -> Flow[GcReport]:
    report = GcReport(dry_run=dry_run)

    # 1. Reference rows of threads that are gone (deleted by something that did not
    # delete their references, e.g. the stock saver's delete_thread on this database).
    def orphans() -> Op[list[str]]:
        rows = yield Batch([Stmt(_ORPHAN_THREADS_SQL, fetch=True)])
        return [r["thread_id"] for r in rows[0]]

    threads: list[str] = yield Tx(orphans)
    report.orphan_threads = len(threads)
    for start in range(0, len(threads), 100):
        part = threads[start : start + 100]
        if dry_run:

            def count(part: list[str] = part) -> Op[int]:
                rows = yield Batch([Stmt(_ORPHAN_REFS_COUNT_SQL, (part,), fetch=True)])
                return int(rows[0][0]["n"])

            report.orphan_refs += yield Tx(count)
        else:

            def sweep(part: list[str] = part) -> Op[int]:
                rows = yield Batch(
                    [_lock(t) for t in part] + [Stmt(_DELETE_ORPHAN_REFS_SQL, (part,), fetch=True)]
                )
                for t in part:
                    yield AfterCommit(partial(saver._known_refs.forget_thread, t))
                return int(rows[-1][0]["n"])

            report.orphan_refs += yield Tx(sweep)

    # 2. Unreferenced artifacts, a page of digests per transaction (keyset order, so
    # the table is walked once however much is deleted).
    def total() -> Op[int]:
        rows = yield Batch([Stmt(_COUNT_ARTIFACTS_SQL, fetch=True)])
        return int(rows[0][0]["n"])

    n_total: int = yield Tx(total)
    lo = b""
    while True:

        def page(lo: bytes = lo) -> Op[tuple[int, bytes | None, dict[str, Any]]]:
            # A retry after a lost COMMIT reply finds the page's artifacts deleted by
            # the committed first attempt: report what that attempt deleted (op_memo).
            memo = op_memo()
            rows = yield Batch([Stmt(_ARTIFACT_PAGE_SQL, (lo, batch_size), fetch=True)])
            if not rows[0]:
                return memo.get("page", (0, None, {}))
            hi = bytes(rows[0][-1]["digest"])
            params = {"lo": lo, "hi": hi, "grace": grace}
            sql = _GC_DRY_SQL if dry_run else _GC_DELETE_SQL
            out = yield Batch([Stmt(sql, params, fetch=True, prepare=False)])
            got = _one(out[0])
            if "page" in memo and not int(got.get("n") or 0):
                return cast("tuple[int, bytes | None, dict[str, Any]]", memo["page"])
            memo["page"] = (len(rows[0]), hi, got)
            return len(rows[0]), hi, got

        for attempt in range(_FK_RETRIES + 1):
            try:
                scanned, hi, got = yield Tx(page)
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
    return report


def gc(
    saver: Any,
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
    with _canceled_as_typed("gc"):
        return saver.run_flow(
            _flow_gc(saver, _seconds(grace, "grace"), batch_size, dry_run, progress)
        )


async def agc(
    saver: Any,
    *,
    grace: float | timedelta = 600.0,
    batch_size: int = 1000,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> GcReport:
    if batch_size < 1:
        raise ConfigurationError("batch_size must be >= 1", batch_size=batch_size)
    with _canceled_as_typed("gc"):
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


def _flow_retain(
    saver: Any,
    older_than: float,
    keep_last: int | None,
    statuses: frozenset[str],
    dry_run: bool,
    batch_size: int,
    progress: Progress | None,
    archive: Any = None,
    aio: bool = False,
) -> Flow[RetentionReport]:
    report = RetentionReport(dry_run=dry_run)
    if archive is not None:
        from langgraph_durable import archive as _archive

    def survey() -> Op[list[dict[str, Any]]]:
        rows = yield Batch([Stmt(_THREADS_SQL, fetch=True, prepare=False)])
        found = [dict(r) for r in rows[0]]
        yield from _op_effective(found)
        return found

    threads: list[dict[str, Any]] = yield Tx(survey)
    doomed: list[str] = []
    live: list[str] = []
    for t in threads:
        reason = _protected(t["effective"], bool(t["leased"]), t["status"])
        if reason is not None:
            report._skip(reason)
            continue
        completed = t["effective"] in statuses
        if completed and t["age_s"] is not None and t["age_s"] > older_than:
            doomed.append(t["thread_id"])
        elif keep_last is not None:
            live.append(t["thread_id"])
    total = len(doomed) + len(live)
    done = 0

    # Completed threads, whole, a batch per transaction. Ops return what they did (the
    # flow updates the report): a factory is re-run after a lost connection.
    for start in range(0, len(doomed), batch_size):
        part = doomed[start : start + batch_size]

        # archive=URL: every thread of the batch is written, read back and verified
        # first (archive.py); the delete below then skips a thread whose rows changed.
        expect: dict[str, str] | None = None
        if archive is not None and not dry_run:
            manifests = yield from _archive.op_archive_batch(saver, archive, part, aio)
            expect = {t: m["fingerprint"] for t, m in manifests.items()}

        def delete(
            part: list[str], expect: dict[str, str] | None
        ) -> Op[tuple[list[str], list[str], list[Any]]]:
            if dry_run:
                out = yield Batch(
                    [Stmt(_STAT.format(table=t, size=s), (part,), fetch=True) for t, s in _TABLES]
                    + [Stmt(_FREED_ARTIFACTS_SQL, {"ids": part}, fetch=True, prepare=False)]
                )
                return part, [], [r[0] for r in out]
            # Lock every row (creating one for threads that have none, so a run that
            # starts meanwhile waits), then decide again under the locks.
            made = yield Batch(
                [_lock(t) for t in part] + [Stmt(_ENSURE_ROWS_SQL, (part,), fetch=True)]
            )
            created = [r["thread_id"] for r in made[-1]]
            rows = yield Batch(
                [Stmt(_LOCK_ROWS_SQL, {"ids": part, "created": created}, fetch=True, prepare=False)]
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
                elif r["effective"] not in statuses or r["age_s"] is None or r["age_s"] <= older_than:
                    skipped.append("changed")
                else:
                    ids.append(r["thread_id"])
            if expect is not None and ids:
                # Delete only what the archive holds: the same rows, under the locks.
                fp = yield Batch([_archive.fingerprint_stmt(ids, created)])
                now = {f["thread_id"]: f["fp"] for f in fp[0]}
                same = [t for t in ids if t in expect and now.get(t) == expect[t]]
                skipped += ["changed_since_archive"] * (len(ids) - len(same))
                ids = same
            # Rows created above for threads now kept go again: no row is not 'done'.
            kept_created = sorted(set(created) - set(ids))
            if expect is not None:
                # Deletes that prove they removed exactly the archived rows.
                out = yield Batch(
                    [Stmt(_FREED_ARTIFACTS_SQL, {"ids": ids}, fetch=True, prepare=False)]
                    + _archive.delete_checked_stmts(ids, created, dict(_TABLES))
                    + [Stmt("DELETE FROM durable_threads WHERE thread_id = ANY(%s)", (kept_created,))]
                )
                got = _archive.check_deleted(out[1:-1], ids, expect)  # or roll back
                for t in ids:
                    yield AfterCommit(partial(saver._known_refs.forget_thread, t))
                return ids, skipped, [got[t] for t, _ in _TABLES] + [out[0][0]]
            out = yield Batch(
                [Stmt(_FREED_ARTIFACTS_SQL, {"ids": ids}, fetch=True, prepare=False)]
                + [Stmt(_DEL.format(table=t, size=s), (ids,), fetch=True) for t, s in _TABLES]
                # Every per-thread table of the package (_sql.THREAD_TABLES): no
                # migration backup, ledger or quarantine row outlives the thread.
                + [Stmt(s, (ids,)) for s in _sql.DELETE_THREADS_EXTRA_SQL]
                + [Stmt("DELETE FROM durable_threads WHERE thread_id = ANY(%s)", (kept_created,))]
            )
            for t in ids:
                yield AfterCommit(partial(saver._known_refs.forget_thread, t))
            return ids, skipped, [r[0] for r in out[1:4] + out[:1]]

        changed: list[str] = []
        ids: list[str] = []
        skipped: list[str] = []
        deleted: list[Any] | None = None
        while part:
            try:
                ids, skipped, deleted = yield Tx(partial(delete, part, expect))
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
        for (table, _), row in zip(_TABLES, (deleted or [])[:3], strict=False):
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
        done += len(part) + len(changed)
        if progress is not None:
            yield Hook(progress, (done, total))

    # Live threads: keep the last K checkpoints per namespace, one thread per transaction.
    for tid in live:

        def trim(tid: str = tid) -> Op[tuple[str, dict[str, int]]]:
            assert keep_last is not None
            params = {"tid": tid, "k": keep_last}
            if not dry_run:
                yield Batch([_lock(tid)])
                rows = yield Batch([Stmt(_THREAD_ROW_LOCK_SQL, (tid,), fetch=True)])
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
            if dry_run:
                out = yield Batch([Stmt(_TRIM_DRY_SQL, params, fetch=True, prepare=False)])
                r = out[0][0]
                stats = {
                    "checkpoints": int(r["checkpoints"]),
                    "writes": int(r["writes"]),
                    "blobs": int(r["blobs"]),
                    "bytes": int(r["checkpoint_bytes"]) + int(r["write_bytes"]) + int(r["blob_bytes"]),
                }
                return ("trimmed" if stats["checkpoints"] else "untouched"), stats
            out = yield Batch([Stmt(_TRIM_CHECKPOINTS_SQL, params, fetch=True, prepare=False)])
            gone = out[0]
            if not gone:
                return "untouched", {}
            out = yield Batch(
                [
                    Stmt(
                        _TRIM_WRITES_SQL,
                        {
                            "tid": tid,
                            "ns": [g["checkpoint_ns"] for g in gone],
                            "ids": [g["checkpoint_id"] for g in gone],
                        },
                        fetch=True,
                        prepare=False,
                    ),
                    Stmt(_TRIM_BLOBS_SQL, params, fetch=True, prepare=False),
                    Stmt(_TRIM_PARENTS_SQL, params, prepare=False),
                ]
            )
            dropped = yield from _op_recompute_locked(saver, tid)
            return "trimmed", {
                "checkpoints": len(gone),
                "writes": int(out[0][0]["n"]),
                "blobs": int(out[1][0]["n"]),
                "bytes": sum(int(g["size"]) for g in gone)
                + int(out[0][0]["bytes"])
                + int(out[1][0]["bytes"]),
                "refs": dropped,
            }

        try:
            outcome, stats = yield Tx(trim)
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
        done += 1
        if progress is not None:
            yield Hook(progress, (done, total))
    # Ledger keys given with key= outlive their thread and expire only by their TTL:
    # the retention job purges the expired ones too (never a claim still in flight).
    from langgraph_durable.idempotency import PURGE_EXPIRED_SQL

    def purge_keys() -> Op[int]:
        if dry_run:
            sql = PURGE_EXPIRED_SQL.replace("DELETE FROM", "SELECT count(*) AS n FROM", 1)
            rows = yield Batch([Stmt(sql, fetch=True)])
            return int(rows[0][0]["n"])
        rows = yield Batch([Stmt(PURGE_EXPIRED_SQL + " RETURNING key", fetch=True)])
        return len(rows[0])

    report.ledger_keys_expired = yield Tx(purge_keys)
    return report


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
    saver: Any,
    *,
    older_than_days: float | timedelta = 30,
    keep_last: int | None = None,
    statuses: Sequence[str] = ("done",),
    dry_run: bool = False,
    batch_size: int = 100,
    progress: Progress | None = None,
    archive: str | None = None,
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
    trimmed by ``keep_last`` are not archived."""
    args = _retain_args(older_than_days, keep_last, statuses, batch_size)
    store = _store(archive)
    with _canceled_as_typed("retain"):
        return saver.run_flow(
            _flow_retain(saver, *args[:3], dry_run, args[3], progress, store, False)
        )


async def aretain(
    saver: Any,
    *,
    older_than_days: float | timedelta = 30,
    keep_last: int | None = None,
    statuses: Sequence[str] = ("done",),
    dry_run: bool = False,
    batch_size: int = 100,
    progress: Progress | None = None,
    archive: str | None = None,
) -> RetentionReport:
    args = _retain_args(older_than_days, keep_last, statuses, batch_size)
    store = _store(archive)
    with _canceled_as_typed("retain"):
        return await saver.arun_flow(
            _flow_retain(saver, *args[:3], dry_run, args[3], progress, store, True)
        )


def _store(archive: str | None) -> Any:
    if archive is None:
        return None
    from langgraph_durable.archive import Store

    return Store(archive)


__all__ = [
    "GcReport",
    "RetentionReport",
    "agc",
    "aretain",
    "arecompute_refs",
    "gc",
    "op_recompute_refs",
    "recompute_refs",
    "retain",
]
