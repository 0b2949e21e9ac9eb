"""SQL on the stock checkpoint tables (``checkpoints``, ``checkpoint_blobs``,
``checkpoint_writes``) beyond the stock saver's own: guarded writes, thread deletion
and copy, ``delete_for_runs``."""

from __future__ import annotations

from typing import Literal

from psycopg import sql

from langgraph_durable.sql.schema import STOCK_THREAD_TABLES, THREAD_TABLES

# A put's checkpoint id would sort before its thread's head (the order check of _GUARD;
# durable_put_guard and durable_checkpoint_order are the older functions).
ORDER_SKEW_STATE = "LGD03"
# A run's put whose parent checkpoint is not on the server (acknowledged work lost in a
# failover, see _GUARD_PARENT; durable_guard_fail's 'gone').
PARENT_GONE_STATE = "LGD04"

# The guard of a write (issue 14), inline SQL evaluated once, before the row is inserted
# or locked (a one-time filter: it names only parameters). A CASE of the checks that
# apply, in this order:
# * lease (a run's write): the thread's row, locked FOR SHARE, must hold this token and
#   owner (a takeover, release, delete or migration updates or locks the row
#   exclusively: it waits for this write's commit; a write arriving after it waits for
#   it, and the lock's recheck computes the test again on the row as committed: it
#   fails); no row, or another lease: LGD01, lease lost.
# * foreign (outside a run, leases on): anyone's live lease: LGD02, busy. The row is
#   locked FOR SHARE too, until the write commits: a run's lease acquisition (an UPDATE
#   of the row) then waits for it, so the run's load (in the acquisition's transaction,
#   after it) sees the write. Without the lock an update_state whose guard passed just
#   before a run's acquisition committed was accepted, then overwritten by that run,
#   which had loaded the head before it (tests/test_update_state_race.py).
# Both find the row by primary key and test the lease on it (in the select list, not the
# WHERE clause): as WHERE clauses, the planner took the owner index
# (durable_threads_owner_idx) or the live-lease index (durable_threads_leased_idx) when
# few leases were live, a plan a prepared statement keeps, and then walked every live
# lease (a heap row each) to find this thread's, or every lease of the owner (one per
# run start today, so that one cost nothing yet).
# * order (puts): refused when a checkpoint of the thread and namespace sorts after this
#   one and this one is not stored (a re-put): LGD03, the clock-skew check. Asked as "the
#   first stored id at or after mine": none (the usual case) or mine (a re-put) passes,
#   a later one fails (mine would have come first). One forward probe of the primary key
#   that touches no heap row when there is none. ORDER BY ... LIMIT 1, not EXISTS: for
#   EXISTS (id > mine) the planner costs only the scan to the first of the thread's
#   estimated rows, so with few threads and long histories (one chat thread of 20k
#   checkpoints) the generic plan (what a prepared put runs) was a sequential scan of
#   the whole table, for every put (1.1 ms at 20k rows, growing with the table). A sort
#   of every candidate is never cheaper than the index's first entry.
# One statement text per combination, never a check switched off by a NULL parameter:
# PostgreSQL would fold that away in custom plans, find them cheaper than the generic
# plan and plan the statement again on every execution (measured: 2x the server time
# of a put_writes). The predicates, lock and SQLSTATEs are durable_put_guard's (which
# writers of earlier releases still call: the same lock, so a mixed fleet keeps the
# fence); plpgsql runs only to raise (durable_guard_fail). Parameters: guard_params.
GuardMode = Literal["lease", "foreign", "none"]
_GUARD_LEASE = """
    WHEN (SELECT lease_token = %s::bigint AND lease_owner = %s
          FROM durable_threads WHERE thread_id = %s FOR SHARE) IS NOT TRUE
    THEN durable_guard_fail('lost', %s, %s::bigint, NULL, NULL)"""
_GUARD_FOREIGN = """
    WHEN (SELECT lease_owner IS NOT NULL AND lease_expires_at > now()
          FROM durable_threads WHERE thread_id = %s FOR SHARE)
    THEN durable_guard_fail('busy', %s, NULL, NULL, NULL)"""
_GUARD_ORDER = """
    WHEN (SELECT checkpoint_id FROM checkpoints
          WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id >= %s
          ORDER BY checkpoint_id LIMIT 1) > %s
    THEN durable_guard_fail('order', %s, NULL, %s, %s)"""


# * parent (a run's put with a parent, issue 23): the parent must be on the server. A
#   run writes on top of the checkpoint it loaded or its own last put, both stored once;
#   missing now means acknowledged work was lost (asynchronous replication, a failover:
#   the promoted standby had the lease row but not the run's last checkpoints). Without
#   this the put succeeded on top of a history the server does not have (a head whose
#   parent and blob versions are gone). One probe of the primary key, the parent's own
#   row (stored: its index entry is hot); checked after the lease (a fenced-out run is
#   LeaseLostError whatever it wrote) and before the order check. LGD04, the real head
#   in the DETAIL. Only with a lease: outside a run nothing says the parent was the
#   writer's own (a direct put with any parent config stays the stock saver's).
_GUARD_PARENT = """
    WHEN NOT EXISTS (SELECT 1 FROM checkpoints
                     WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s)
    THEN durable_guard_fail('gone', %s, NULL, %s, %s)"""


def _guard(mode: GuardMode, order: bool, parent: bool = False) -> str:
    parts = {"lease": _GUARD_LEASE, "foreign": _GUARD_FOREIGN, "none": ""}[mode]
    gone = _GUARD_PARENT if parent else ""
    return f"CASE{parts}{gone}{_GUARD_ORDER if order else ''}\n    ELSE true END"


def guard_params(
    mode: GuardMode,
    thread: str,
    token: int | None,
    owner: str | None,
    ns: str | None,
    cid: str | None,
    parent: str | None = None,
) -> tuple[object, ...]:
    """The guard's parameters, in _guard's order; ``cid`` None: no order check (writes);
    ``parent``: the parent check (GUARDED_UPSERT_CHILD_CHECKPOINT_SQL, lease mode). A
    run's put (lease mode, ``cid``: _put_sql) has the failure's two last."""
    out: tuple[object, ...] = ()
    if mode == "lease" and cid is not None:
        # A run's put (_put_sql): the probe, the checks, then the failure's.
        out = (token, owner, thread)
        if parent is not None:
            out = (*out, thread, ns, parent, thread, ns, parent)
        return (*out, thread, ns, cid, cid, thread, ns, cid, thread, token)
    if mode == "lease":
        out = (token, owner, thread, thread, token)
    elif mode == "foreign":
        out = (thread, thread)
    if parent is not None:
        out = (*out, thread, ns, parent, thread, ns, parent)
    if cid is not None:
        out = (*out, thread, ns, cid, cid, thread, ns, cid)
    return out


# A put's checkpoint upsert and the first rows of a put_writes with the guard folded in,
# by guard mode: a failing guard aborts the write's implicit transaction; a passing one
# holds the thread row FOR SHARE before the row's own lock (the order delete_thread and
# migrations take them in). Same columns and ON CONFLICT actions as the stock
# UPSERT_CHECKPOINTS_SQL / UPSERT_CHECKPOINT_WRITES_SQL / INSERT_CHECKPOINT_WRITES_SQL.
# Guard parameters last (guard_params).
_UPSERT_CHECKPOINT = """
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
SELECT %s::text, %s::text, %s::text, %s::text, %s::jsonb, %s::jsonb
WHERE {guard}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
"""
# The same for a put with no graph version known (update_state from a script): the
# checkpoint inherits its parent's version (what versioning.INHERIT_VERSION_SQL did as
# a separate statement). Extra parameters after the metadata: thread, ns, parent.
_UPSERT_CHECKPOINT_INHERIT = """
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
SELECT %s::text, %s::text, %s::text, %s::text, %s::jsonb,
       %s::jsonb || COALESCE((SELECT jsonb_build_object('graph_version', p.metadata -> 'graph_version')
                              FROM checkpoints p
                              WHERE p.thread_id = %s AND p.checkpoint_ns = %s AND p.checkpoint_id = %s
                                AND p.metadata ? 'graph_version'), '{{}}'::jsonb)
WHERE {guard}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
"""
_UPSERT_WRITE = """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %s::text, %s::text, %s::text, %s::text, %s::text, %s::integer, %s::text, %s::text, %s::bytea
WHERE {guard}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob
"""
_INSERT_WRITE = """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %s::text, %s::text, %s::text, %s::text, %s::text, %s::integer, %s::text, %s::text, %s::bytea
WHERE {guard}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
"""
_MODES: tuple[GuardMode, ...] = ("lease", "foreign", "none")
# A run's put (lease mode) also answers whether an operator asked this run to stop
# (issue 25, ops.control.request_cancel), for no round trip and no second probe of the
# thread row: the lease test and the cancel flag come from ONE probe (the guard's, FOR
# SHARE), the argument of a CASE (evaluated once; the guard stays a one-time filter, as
# _guard's). NULL: the lease is lost (LGD01, as _GUARD_LEASE); false: the parent and
# order checks, then the row; true: cancelled, the row filtered out, rowcount 0, read
# without fetching a row (core.write then stores the checkpoint with CANCELLED_PUT_SQL's
# text: the same probe, every check, no filter, in a second implicit transaction; the
# run stops at its next step boundary, core.base.get_next_version, on a stored
# checkpoint). Issue 26, measured (pg_stat_statements, a lease-held put after a
# put_writes): a RETURNING probe of the row cost ~0.04 ms a put; the probe in a FROM
# subquery (OFFSET 0), the first form of this change, 59-85 us a statement against 52-58
# without a cancel check; this form: see bench/bench_cancel_probe.py. Parameters
# (guard_params, a put in lease mode): the probe's (token, owner, thread), the checks',
# then the failure's (thread, token).
_LEASE_PUT_PROBE = """(SELECT CASE WHEN lease_token = %s::bigint AND lease_owner = %s
                 THEN cancel_token IS NOT DISTINCT FROM lease_token END
          FROM durable_threads WHERE thread_id = %s FOR SHARE)"""
_LEASE_PUT_LOST = "durable_guard_fail('lost', %s, %s::bigint, NULL, NULL)"


def _put_sql(template: str, mode: GuardMode, parent: bool = False, *, cancelled: bool = False) -> str:
    if mode != "lease":
        return template.format(guard=_guard(mode, True, parent=parent))
    checks = f"CASE{_GUARD_PARENT if parent else ''}{_GUARD_ORDER}\n    ELSE true END"
    if cancelled:  # CANCELLED_PUT_SQL: lease held (cancelled or not), every check, the row
        guard = f"CASE {_LEASE_PUT_PROBE} IS NOT NULL\n    WHEN true THEN {checks}\n    ELSE {_LEASE_PUT_LOST} END"
    else:
        guard = (f"CASE {_LEASE_PUT_PROBE}\n    WHEN false THEN {checks}\n    WHEN true THEN false"
                 f"\n    ELSE {_LEASE_PUT_LOST} END")
    return template.format(guard=guard)


GUARDED_UPSERT_CHECKPOINT_SQL = {m: _put_sql(_UPSERT_CHECKPOINT, m) for m in _MODES}
GUARDED_UPSERT_CHECKPOINT_INHERIT_SQL = {m: _put_sql(_UPSERT_CHECKPOINT_INHERIT, m) for m in _MODES}
# A run's put with a parent: the same with the parent check (_GUARD_PARENT). Its own
# statement text, never the check switched off by a NULL parameter (see above).
GUARDED_UPSERT_CHILD_CHECKPOINT_SQL: dict[GuardMode, str] = {
    "lease": _put_sql(_UPSERT_CHECKPOINT, "lease", parent=True)
}
GUARDED_UPSERT_CHILD_CHECKPOINT_INHERIT_SQL: dict[GuardMode, str] = {
    "lease": _put_sql(_UPSERT_CHECKPOINT_INHERIT, "lease", parent=True)
}
# By a run's put text: the same statement without the cancel filter, sent when the
# first one reported a cancel (rowcount 0): it stores the checkpoint, guarded.
CANCELLED_PUT_SQL: dict[str, str] = {
    _put_sql(t, "lease", parent): _put_sql(t, "lease", parent, cancelled=True)
    for t in (_UPSERT_CHECKPOINT, _UPSERT_CHECKPOINT_INHERIT) for parent in (False, True)
}
assert all(a != b for a, b in CANCELLED_PUT_SQL.items())
# put_writes is guarded only with a lease check or a foreign-lease check (leases=False:
# the stock statements).
GUARDED_UPSERT_WRITE_SQL = {m: _UPSERT_WRITE.format(guard=_guard(m, False)) for m in _MODES[:2]}
GUARDED_INSERT_WRITE_SQL = {m: _INSERT_WRITE.format(guard=_guard(m, False)) for m in _MODES[:2]}

# A put_writes of 2..GUARDED_WRITES_MAX rows as ONE statement (issue 26): the rows as a
# VALUES list, the guard once (a one-time filter, evaluated before any row is inserted or
# locked), instead of one execution per row each carrying the guard. Measured (backend
# CPU from /proc/<pid>/schedstat, client thread CPU, raw statements taking turns): 2
# writes ~15 us less server time and ~10 us less client time than the per-row guard, 4
# writes ~30 us each; the guard is then paid once, not per row. Same columns, casts and
# ON CONFLICT actions as the per-row texts. An upsert's rows must not repeat a key (DO
# UPDATE cannot affect a row twice in one command): the caller keeps the last of each
# key, the state the per-row upserts left (DO NOTHING keeps the first, as they did).
# Parameters: the rows' nine values each, in order, then guard_params. One text per row
# count (a prepared statement each, at most 2 x 2 x 7 per connection).
GUARDED_WRITES_MAX = 8
_WRITE_ROW = "(%s::text, %s::text, %s::text, %s::text, %s::text, %s::integer, %s::text, %s::text, %s::bytea)"
_WRITES_ROWS = """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT * FROM (VALUES {rows})
    AS v (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
WHERE {guard}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) {action}
"""
_UPSERT_ACTION = """DO UPDATE SET
    channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob"""


def _writes_rows(mode: GuardMode, n: int, action: str) -> str:
    guard = "true" if mode == "none" else _guard(mode, False)
    return _WRITES_ROWS.format(rows=",\n    ".join([_WRITE_ROW] * n), guard=guard, action=action)


# By mode, then row count (index n: n rows; 0 and 1 unused, the per-row texts serve one
# row). "none" (leases=False): no guard, the stock columns and actions, one statement.
GUARDED_UPSERT_WRITES_SQL: dict[GuardMode, tuple[str, ...]] = {
    m: ("", "", *(_writes_rows(m, n, _UPSERT_ACTION) for n in range(2, GUARDED_WRITES_MAX + 1)))
    for m in _MODES
}
GUARDED_INSERT_WRITES_SQL: dict[GuardMode, tuple[str, ...]] = {
    m: ("", "", *(_writes_rows(m, n, "DO NOTHING") for n in range(2, GUARDED_WRITES_MAX + 1)))
    for m in _MODES
}


DELETE_THREAD_EXTRA_SQL = tuple(
    sql.SQL("DELETE FROM {} WHERE thread_id = %s").format(sql.Identifier(t)) for t in THREAD_TABLES
)

# The same for many threads at once (prune(strategy="delete"), retain, delete_for_runs).
DELETE_THREADS_EXTRA_SQL = tuple(
    sql.SQL("DELETE FROM {} WHERE thread_id = ANY(%s)").format(sql.Identifier(t))
    for t in THREAD_TABLES
)
# Writes, blobs, then checkpoints: a write that slips in unserialized (a put outside
# any lease takes no row lock) then leaves either a whole checkpoint or stray blobs,
# never a checkpoint whose blobs were deleted under it.
DELETE_STOCK_THREADS_SQL = tuple(
    sql.SQL("DELETE FROM {} WHERE thread_id = ANY(%s)").format(sql.Identifier(t))
    for t in STOCK_THREAD_TABLES
)


COPY_THREAD_SQL = (
    """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                                type, checkpoint, metadata)
       SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
              jsonb_set(metadata, '{thread_id}', to_jsonb(%(target)s::text), false)
       FROM checkpoints WHERE thread_id = %(source)s
       ON CONFLICT DO NOTHING""",
    """INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
       SELECT %(target)s, checkpoint_ns, channel, version, type, blob
       FROM checkpoint_blobs WHERE thread_id = %(source)s
       ON CONFLICT DO NOTHING""",
    """INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,
                                      idx, channel, type, blob)
       SELECT %(target)s, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
       FROM checkpoint_writes WHERE thread_id = %(source)s
       ON CONFLICT DO NOTHING""",
    """INSERT INTO durable_artifact_refs (thread_id, digest)
       SELECT %(target)s, digest FROM durable_artifact_refs WHERE thread_id = %(source)s
       ON CONFLICT DO NOTHING""",
)

# Checkpoints (and their writes) whose metadata names one of the runs, in the threads
# delete_for_runs locked and checked.
DELETE_FOR_RUNS_SQL = (
    """DELETE FROM checkpoint_writes w USING checkpoints c
       WHERE c.metadata ->> 'run_id' = ANY(%(runs)s) AND c.thread_id = ANY(%(threads)s)
         AND w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
         AND w.checkpoint_id = c.checkpoint_id""",
    """DELETE FROM checkpoints
       WHERE metadata ->> 'run_id' = ANY(%(runs)s) AND thread_id = ANY(%(threads)s)
       RETURNING thread_id""",
)

# delete_for_runs' cleanup: the threads holding checkpoints of the runs; their lease
# rows, locked after their artifact locks (the order puts take them in), so a leased
# put in flight commits first and the next one waits, and checked: a live lease
# refuses the whole delete (ThreadBusyError, see _DurableBase._op_delete_for_runs).
# Threads without a row get one for the transaction (a run starting there waits for
# it), removed again at its end. Then the blob rows no remaining checkpoint of the
# same thread and namespace names by (channel, version). One pass over the threads'
# channel_versions (a hash anti-join), not a probe per blob.
RUN_THREADS_SQL = """
SELECT DISTINCT thread_id FROM checkpoints WHERE metadata ->> 'run_id' = ANY(%(runs)s)
ORDER BY thread_id
"""
# Threads the delete left without any checkpoint: deleted whole (every table).
EMPTY_THREADS_SQL = """
SELECT t AS thread_id FROM unnest(%(threads)s::text[]) AS t
WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = t)
ORDER BY t
"""
DELETE_UNUSED_BLOBS_SQL = """
WITH used AS MATERIALIZED (
    SELECT c.thread_id, c.checkpoint_ns, v.key AS channel, v.value AS version
    FROM checkpoints c, jsonb_each_text(c.checkpoint -> 'channel_versions') AS v
    WHERE c.thread_id = ANY(%(threads)s)
)
DELETE FROM checkpoint_blobs b
WHERE b.thread_id = ANY(%(threads)s) AND NOT EXISTS (
    SELECT 1 FROM used u
    WHERE u.thread_id = b.thread_id AND u.checkpoint_ns = b.checkpoint_ns
      AND u.channel = b.channel AND u.version = b.version)
"""

# A migration's in-place rewrite of a checkpoint (core.rewrite): same id, new content.
REWRITE_CHECKPOINT_SQL = (
    "UPDATE checkpoints SET checkpoint = %s, metadata = %s "
    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
)
# ... and of its pending writes, when the migration changed them (re-inserted after).
DELETE_CHECKPOINT_WRITES_SQL = (
    "DELETE FROM checkpoint_writes "
    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
)

# copy_thread: a target with checkpoints is refused; a retry after a lost COMMIT reply
# recognises its own copy (the target's newest checkpoint is the source's).
THREAD_HAS_CHECKPOINTS_SQL = "SELECT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %s) AS taken"
SAME_HEAD_SQL = (
    "SELECT (SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = %(source)s)"
    " IS NOT DISTINCT FROM "
    "(SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = %(target)s) AS same"
)


# --- failover branch ---
# The head of a thread's namespace (AcknowledgedWorkLostError's real head, on its path only).
CHECKPOINT_HEAD_SQL = """
SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s
ORDER BY checkpoint_id DESC LIMIT 1
"""
