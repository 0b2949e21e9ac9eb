"""SQL on the stock checkpoint tables (``checkpoints``, ``checkpoint_blobs``,
``checkpoint_writes``) beyond the stock saver's own: guarded writes, thread deletion
and copy, ``delete_for_runs``."""

from __future__ import annotations

from psycopg import sql

from langgraph_durable.sql.schema import STOCK_THREAD_TABLES, THREAD_TABLES

# A put's checkpoint id would sort before its thread's head (the order check of _GUARD;
# durable_put_guard and durable_checkpoint_order are the older functions).
ORDER_SKEW_STATE = "LGD03"

# The guard of a write (issue 14), inline SQL evaluated once, before the row is inserted
# or locked (a one-time filter: it names only parameters). In order, as a CASE:
# 1. leased (owner given): the thread's row with this token and owner, locked FOR SHARE
#    (a takeover, release, delete or migration updates or locks the row exclusively: it
#    waits for this write's commit; a write arriving after it waits for it, then finds
#    the new token and fails); missing: LGD01, lease lost.
# 2. outside a run with leases on (foreign): a live lease of anyone: LGD02, busy.
# 3. puts (id given): refused when a checkpoint of the thread and namespace sorts after
#    this one and this one is not stored (a re-put): LGD03, the clock-skew check. Asked
#    as "is any id after mine?", a forward probe of the primary key that touches no
#    heap row when the answer is no, instead of fetching the head row.
# The predicates, lock and SQLSTATEs are durable_put_guard's (which writers of earlier
# releases still call: same lock, so a mixed fleet keeps the fence); plpgsql runs only
# to raise (durable_guard_fail). Parameters: see guard_params.
_GUARD = """CASE
    WHEN %s::text IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM durable_threads
        WHERE thread_id = %s AND lease_token = %s::bigint AND lease_owner = %s FOR SHARE)
    THEN durable_guard_fail('lost', %s, %s::bigint, NULL, NULL)
    WHEN %s::boolean AND EXISTS (
        SELECT 1 FROM durable_threads
        WHERE thread_id = %s AND lease_owner IS NOT NULL AND lease_expires_at > now())
    THEN durable_guard_fail('busy', %s, NULL, NULL, NULL)
    WHEN %s::text IS NOT NULL AND EXISTS (
        SELECT 1 FROM checkpoints
        WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id > %s)
      AND NOT EXISTS (
        SELECT 1 FROM checkpoints
        WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s)
    THEN durable_guard_fail('order', %s, NULL, %s, %s)
    ELSE true END"""


def guard_params(
    thread: str, token: int | None, owner: str | None, foreign: bool, ns: str | None, cid: str | None
) -> tuple[object, ...]:
    """_GUARD's parameters. ``owner`` None: no lease check; ``foreign``: the busy check
    (outside a run); ``cid`` None: no order check (put_writes)."""
    return (
        owner, thread, token, owner, thread, token,
        foreign, thread, thread,
        cid, thread, ns, cid, thread, ns, cid, thread, ns, cid,
    )


# A put's checkpoint upsert and the first rows of a put_writes with the guard folded in:
# a failing guard aborts the write's implicit transaction; a passing one holds the
# thread row FOR SHARE before the row's own lock (the order delete_thread and
# migrations take them in). Same columns and ON CONFLICT actions as the stock
# UPSERT_CHECKPOINTS_SQL / UPSERT_CHECKPOINT_WRITES_SQL / INSERT_CHECKPOINT_WRITES_SQL.
# Guard parameters last (guard_params).
GUARDED_UPSERT_CHECKPOINT_SQL = f"""
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
SELECT %s::text, %s::text, %s::text, %s::text, %s::jsonb, %s::jsonb
WHERE {_GUARD}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
"""
# The same for a put with no graph version known (update_state from a script): the
# checkpoint inherits its parent's version (what versioning.INHERIT_VERSION_SQL did as
# a separate statement). Extra parameters after the metadata: thread, ns, parent.
GUARDED_UPSERT_CHECKPOINT_INHERIT_SQL = f"""
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
SELECT %s::text, %s::text, %s::text, %s::text, %s::jsonb,
       %s::jsonb || COALESCE((SELECT jsonb_build_object('graph_version', p.metadata -> 'graph_version')
                              FROM checkpoints p
                              WHERE p.thread_id = %s AND p.checkpoint_ns = %s AND p.checkpoint_id = %s
                                AND p.metadata ? 'graph_version'), '{{}}'::jsonb)
WHERE {_GUARD}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
"""
GUARDED_UPSERT_WRITE_SQL = f"""
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %s::text, %s::text, %s::text, %s::text, %s::text, %s::integer, %s::text, %s::text, %s::bytea
WHERE {_GUARD}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob
"""
GUARDED_INSERT_WRITE_SQL = f"""
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %s::text, %s::text, %s::text, %s::text, %s::text, %s::integer, %s::text, %s::text, %s::bytea
WHERE {_GUARD}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
"""


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
