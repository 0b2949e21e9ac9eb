"""SQL of the audit trail (audit.py writes and lists durable_audit rows)."""

# The table: sql.schema.MIGRATIONS (its last entries, issue 17).
AUDIT_INSERT_SQL = """
INSERT INTO durable_audit (event_id, actor, via, action, thread_id, before_id, after_id, detail)
VALUES (%(event_id)s, %(actor)s, %(via)s, %(action)s, %(thread_id)s, %(before_id)s,
        %(after_id)s, %(detail)s::jsonb)
ON CONFLICT (event_id) DO NOTHING
"""

AUDIT_LIST_SQL = """
SELECT id, event_id, at, actor, via, action, thread_id, before_id, after_id, detail
FROM durable_audit
WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
  AND (%(action)s::text IS NULL OR action = %(action)s)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s
"""
