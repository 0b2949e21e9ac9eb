"""SQL on ``durable_quarantine`` (the saver side: quarantining a thread)."""

from __future__ import annotations

# Quarantine a thread: status, lease dropped and the counter set to the failed attempts
# (the refused start is not one) in durable_threads, the operator's record in
# durable_quarantine, in one statement. Retention and recovery skip status 'quarantined'.
QUARANTINE_THREAD_SQL = """
WITH t AS (
    UPDATE durable_threads SET status = 'quarantined', lease_owner = NULL,
        lease_expires_at = NULL, attempts = %(attempts)s,
        last_error = COALESCE(%(last_error)s, last_error), updated_at = now()
    WHERE thread_id = %(thread_id)s
    RETURNING thread_id
)
INSERT INTO durable_quarantine (thread_id, checkpoint_ns, checkpoint_id, attempts,
                                last_error, graph_version, reason, quarantined_at)
VALUES (%(thread_id)s, '', %(checkpoint_id)s, %(attempts)s, %(last_error)s,
        %(graph_version)s, %(reason)s, now())
ON CONFLICT (thread_id) DO UPDATE SET
    checkpoint_id = EXCLUDED.checkpoint_id, attempts = EXCLUDED.attempts,
    last_error = EXCLUDED.last_error, graph_version = EXCLUDED.graph_version,
    reason = EXCLUDED.reason, quarantined_at = now()
"""


QUARANTINE_ROW_SQL = "SELECT * FROM durable_quarantine WHERE thread_id = %s"


# --- the quarantine operator APIs (ops/poison.py: list, show, release, rewind) ----------
# head_checkpoint_id: the thread's newest root checkpoint (ids are time-ordered uuid6).
_QUARANTINE_ROW = """
SELECT q.thread_id, q.checkpoint_id, q.attempts, q.last_error, q.graph_version, q.reason,
       q.quarantined_at,
       (SELECT c.checkpoint_id FROM checkpoints c
        WHERE c.thread_id = q.thread_id AND c.checkpoint_ns = ''
        ORDER BY c.checkpoint_id DESC LIMIT 1) AS head_checkpoint_id
"""

QUARANTINE_LIST_SQL = _QUARANTINE_ROW + """FROM durable_quarantine q JOIN durable_threads t ON t.thread_id = q.thread_id
WHERE t.status = 'quarantined'
ORDER BY q.quarantined_at DESC, q.thread_id
LIMIT %s
"""

QUARANTINE_ENTRY_SQL = _QUARANTINE_ROW + """FROM durable_quarantine q WHERE q.thread_id = %s
"""

POISON_THREAD_ROW_SQL = """
SELECT status, attempts, attempts_checkpoint_id, last_error, graph_version, lease_owner,
       EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS expires_in
FROM durable_threads WHERE thread_id = %s
"""

POISON_HISTORY_SQL = """
SELECT c.checkpoint_id, c.parent_checkpoint_id, c.metadata ->> 'step' AS step,
       c.metadata ->> 'source' AS source, c.metadata ->> %s AS graph_version,
       c.checkpoint ->> 'ts' AS ts,
       (SELECT count(*) FROM checkpoint_writes w
        WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
          AND w.checkpoint_id = c.checkpoint_id) AS writes,
       (SELECT count(*) FROM checkpoint_writes w
        WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
          AND w.checkpoint_id = c.checkpoint_id AND w.channel = %s) AS errors
FROM checkpoints c
WHERE c.thread_id = %s AND c.checkpoint_ns = ''
ORDER BY c.checkpoint_id DESC
LIMIT %s
"""

# Row lock: a run start (ACQUIRE_SQL upserts this row) waits for the operator's change.
POISON_LOCK_THREAD_SQL = """
SELECT status, lease_owner,
       EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS expires_in
FROM durable_threads WHERE thread_id = %s FOR UPDATE
"""

RELEASE_QUARANTINE_SQL = "DELETE FROM durable_quarantine WHERE thread_id = %s RETURNING thread_id"

# 'stopped': the thread has unfinished work and nothing runs it, like a crashed run, so
# a recovery worker may pick it up again; the count starts over.
RESET_QUARANTINED_THREAD_SQL = """
UPDATE durable_threads SET status = 'stopped', attempts = 0,
    attempts_checkpoint_id = COALESCE(%(checkpoint_id)s, attempts_checkpoint_id),
    last_error = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE thread_id = %(thread_id)s
"""

ROOT_HEAD_SQL = """
SELECT checkpoint_id FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = '' ORDER BY checkpoint_id DESC LIMIT 1
"""

# The fork: the chosen checkpoint copied under a new (newest) id, with the same parent
# and channel versions, so it reads the same blobs and artifacts (nothing else to copy)
# and a DeltaChannel walk from it sees what it saw from the original. Pending writes are
# not copied: every task after the chosen checkpoint runs again. run_id is dropped so a
# rollback of the old run (delete_for_runs) cannot delete the fork.
FORK_CHECKPOINT_SQL = """
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                         type, checkpoint, metadata)
SELECT thread_id, checkpoint_ns, %(new_id)s, parent_checkpoint_id, type,
       jsonb_set(jsonb_set(checkpoint, '{id}', to_jsonb(%(new_id)s::text)),
                 '{ts}', to_jsonb(%(ts)s::text)),
       (metadata - 'run_id') || %(extra)s
FROM checkpoints
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = %(to)s
RETURNING checkpoint_id
"""
