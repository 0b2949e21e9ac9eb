"""SQL of retention (langgraph_durable/retention.py): what it reads and deletes beyond
the thread tables' own statements."""

# Ledger keys given with key= outlive their thread and expire only by their TTL; the
# retention job purges the expired ones too, never a claim still in flight. The same
# rows counted (dry run) and deleted: one predicate, two statements.
# (The ledger's own purge, idempotency.PURGE_EXPIRED_SQL, is the same DELETE; it moves
# into sql/ with the ledger SQL and then one of the two goes.)
_EXPIRED_LEDGER_KEYS = """
FROM durable_ledger WHERE expires_at IS NOT NULL AND expires_at <= now()
  AND NOT (status = 'started' AND claim_expires_at IS NOT NULL AND claim_expires_at > now())
"""
COUNT_EXPIRED_LEDGER_KEYS_SQL = "SELECT count(*) AS n " + _EXPIRED_LEDGER_KEYS
PURGE_EXPIRED_LEDGER_KEYS_SQL = "DELETE " + _EXPIRED_LEDGER_KEYS + " RETURNING key"

# A thread's envelopes, with where they are (for an error naming a damaged one): its
# blobs and writes, and the blobs and writes kept by its migration backups not yet undone
# (durable_migration_log): undo_migration puts those back, so the artifacts they name
# must outlive a prune + gc (issue 11, defect 2).
THREAD_ENVELOPES_SQL = """
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
