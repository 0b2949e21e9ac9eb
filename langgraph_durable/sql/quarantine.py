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
