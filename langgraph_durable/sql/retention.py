"""SQL of retention (langgraph_durable/ops/retention.py): what it reads and deletes beyond
the thread tables' own statements."""

from langgraph_durable._values import ISO_TS_RE
from langgraph_durable.sql.ledger import EXPIRED_LEDGER_KEYS, LEDGER_PURGE_EXPIRED_SQL

# Ledger keys given with key= outlive their thread and expire only by their TTL; the
# retention job purges the expired ones too, never a claim still in flight. The same
# rows counted (dry run) and deleted: the ledger's one predicate, two statements.
COUNT_EXPIRED_LEDGER_KEYS_SQL = "SELECT count(*) AS n " + EXPIRED_LEDGER_KEYS
PURGE_EXPIRED_LEDGER_KEYS_SQL = LEDGER_PURGE_EXPIRED_SQL + " RETURNING key"

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

# --- retain, gc, reference rows ------------------------------------------------------

# Error path: the newest checkpoint that uses a blob's channel version.
BLOB_CHECKPOINT_SQL = """
SELECT max(checkpoint_id) AS checkpoint_id FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint -> 'channel_versions' ->> %s = %s
"""

# Keep exactly ``keep``: drop the rest, and add rows the envelopes need but lack (a
# database written before reference rows were complete), for artifacts that exist.
DROP_REFS_SQL = """
WITH d AS (
    DELETE FROM durable_artifact_refs
    WHERE thread_id = %s AND NOT (digest = ANY(%b::bytea[]))
    RETURNING 1
) SELECT count(*)::bigint AS n FROM d
"""
REPAIR_REFS_SQL = """
INSERT INTO durable_artifact_refs (thread_id, digest)
SELECT %s, a.digest FROM durable_artifacts a WHERE a.digest = ANY(%b::bytea[])
ON CONFLICT DO NOTHING
"""

# (A thread whose migration backup is still undoable is not an orphan: see above.)
ORPHAN_THREADS_SQL = """
SELECT DISTINCT r.thread_id FROM durable_artifact_refs r
WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = r.thread_id)
  AND NOT EXISTS (SELECT 1 FROM checkpoint_blobs b WHERE b.thread_id = r.thread_id)
  AND NOT EXISTS (SELECT 1 FROM checkpoint_writes w WHERE w.thread_id = r.thread_id)
  AND NOT EXISTS (SELECT 1 FROM durable_migration_log l
                  WHERE l.thread_id = r.thread_id AND l.undone_at IS NULL)
ORDER BY r.thread_id
"""
ORPHAN_REFS_COUNT_SQL = """
SELECT count(*)::bigint AS n FROM durable_artifact_refs WHERE thread_id = ANY(%s)
"""
DELETE_ORPHAN_REFS_SQL = """
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

COUNT_ARTIFACTS_SQL = "SELECT count(*)::bigint AS n FROM durable_artifacts"
ARTIFACT_PAGE_SQL = """
SELECT digest FROM durable_artifacts WHERE digest > %b ORDER BY digest LIMIT %s
"""
# An artifact is garbage when no reference row names it and it is older than the grace
# period; SKIP LOCKED passes over rows a put is referencing right now (its foreign-key
# check holds a key-share lock on them).
GC_DRY_SQL = """
SELECT count(*)::bigint AS n, COALESCE(sum(pg_column_size(x.data)), 0)::bigint AS bytes
FROM durable_artifacts x
WHERE x.digest > %(lo)b AND x.digest <= %(hi)b
  AND x.created_at < now() - make_interval(secs => %(grace)s)
  AND NOT EXISTS (SELECT 1 FROM durable_artifact_refs r WHERE r.digest = x.digest)
"""
GC_DELETE_SQL = """
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
RETAIN_SURVEY_SQL = """
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
ENSURE_ROWS_SQL = """
INSERT INTO durable_threads (thread_id, status)
SELECT t, 'done' FROM unnest(%s::text[]) AS t
ON CONFLICT (thread_id) DO NOTHING
RETURNING thread_id
"""
LOCK_ROWS_SQL = """
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
RETAIN_SURVEY_SQL, LOCK_ROWS_SQL = (
    q.replace("'^\\d{4}-\\d{2}-\\d{2}'", "'" + ISO_TS_RE + "'") for q in (RETAIN_SURVEY_SQL, LOCK_ROWS_SQL)
)

THREAD_TABLE_STAT_SQL = "SELECT count(*)::bigint AS n, COALESCE(sum({size}), 0)::bigint AS bytes FROM {table} WHERE thread_id = ANY(%s)"
THREAD_TABLE_DELETE_SQL = (
    "WITH d AS (DELETE FROM {table} WHERE thread_id = ANY(%s) RETURNING {size} AS size) "
    "SELECT count(*)::bigint AS n, COALESCE(sum(size), 0)::bigint AS bytes FROM d"
)
STOCK_TABLE_SIZES = (
    ("checkpoints", "pg_column_size(checkpoint) + pg_column_size(metadata)"),
    ("checkpoint_blobs", "COALESCE(pg_column_size(blob), 0)"),
    ("checkpoint_writes", "pg_column_size(blob)"),
)

# Artifacts that only the given threads reference (what GC frees after deleting them).
FREED_ARTIFACTS_SQL = """
SELECT count(*)::bigint AS n, COALESCE(sum(pg_column_size(a.data)), 0)::bigint AS bytes
FROM durable_artifacts a
WHERE EXISTS (SELECT 1 FROM durable_artifact_refs r WHERE r.digest = a.digest AND r.thread_id = ANY(%(ids)s))
  AND NOT EXISTS (SELECT 1 FROM durable_artifact_refs r
                  WHERE r.digest = a.digest AND NOT (r.thread_id = ANY(%(ids)s)))
"""

# Trimming one thread to its last K checkpoints per namespace (rank 1 = newest).
TRIM_DRY_SQL = """
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
TRIM_CHECKPOINTS_SQL = """
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
TRIM_WRITES_SQL = """
WITH d AS (
    DELETE FROM checkpoint_writes w
    USING unnest(%(ns)s::text[], %(ids)s::text[]) AS g(checkpoint_ns, checkpoint_id)
    WHERE w.thread_id = %(tid)s AND w.checkpoint_ns = g.checkpoint_ns
      AND w.checkpoint_id = g.checkpoint_id
    RETURNING pg_column_size(w.blob) AS size
) SELECT count(*)::bigint AS n, COALESCE(sum(size), 0)::bigint AS bytes FROM d
"""
TRIM_BLOBS_SQL = """
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
TRIM_PARENTS_SQL = """
UPDATE checkpoints c SET parent_checkpoint_id = NULL
WHERE c.thread_id = %(tid)s AND c.parent_checkpoint_id IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM checkpoints p
    WHERE p.thread_id = c.thread_id AND p.checkpoint_ns = c.checkpoint_ns
      AND p.checkpoint_id = c.parent_checkpoint_id)
"""
THREAD_ROW_LOCK_SQL = """
SELECT status, (lease_owner IS NOT NULL AND lease_expires_at > now()) AS leased
FROM durable_threads WHERE thread_id = %s FOR UPDATE
"""
