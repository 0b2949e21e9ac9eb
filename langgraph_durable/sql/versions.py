"""SQL of graph versions and migrations: durable_migration_log, the version stamp in
checkpoint metadata, and the views the ``versions`` commands read.

Used by the version gate (versioning.flow_migrate, the saver's rewrite) and the operator
APIs (ops/migrations.py).
"""

# The pre-migration rows, copied server side (exact bytes) in the migration's own
# transaction: the checkpoint JSON, its metadata, its pending writes, and the blobs the
# migrated checkpoint no longer references (prune may delete those later).
INSERT_LOG_SQL = """
INSERT INTO durable_migration_log (
    thread_id, checkpoint_ns, checkpoint_id, from_version, to_version, steps, origin,
    old_checkpoint, old_metadata, old_writes, old_blobs)
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, %(from)s, %(to)s, %(steps)s, %(origin)s,
       c.checkpoint, c.metadata,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                    'task_id', w.task_id, 'task_path', w.task_path, 'idx', w.idx,
                    'channel', w.channel, 'type', w.type, 'blob', encode(w.blob, 'base64'))
                    ORDER BY w.task_id, w.idx)
                 FROM checkpoint_writes w
                 WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
                   AND w.checkpoint_id = c.checkpoint_id), '[]'::jsonb),
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                    'channel', b.channel, 'version', b.version, 'type', b.type,
                    'blob', encode(b.blob, 'base64')))
                 FROM checkpoint_blobs b
                 JOIN unnest(%(channels)s::text[], %(versions)s::text[]) AS o(channel, version)
                   ON b.channel = o.channel AND b.version = o.version
                 WHERE b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns), '[]'::jsonb)
FROM checkpoints c
WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = %(ns)s AND c.checkpoint_id = %(cid)s
RETURNING id
"""

# The migration's own transaction locks the checkpoint row and re-reads its version:
# a concurrent migration (another worker, the CLI) is detected, never interleaved.
LOCK_CHECKPOINT_SQL = """
SELECT metadata ->> 'graph_version' AS graph_version,
       checkpoint -> 'channel_values' AS inline_values
FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s
FOR UPDATE
"""

WRITE_PATHS_SQL = """
SELECT DISTINCT task_id, task_path FROM checkpoint_writes
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s
"""

# Latest root checkpoint of every thread, with its version and time.
_LATEST_CTE = """
WITH latest AS (
    SELECT DISTINCT ON (c.thread_id)
           c.thread_id, c.checkpoint_id, c.metadata ->> 'graph_version' AS graph_version,
           c.metadata ->> 'migrated_from' AS migrated_from,
           (c.metadata ->> 'step')::int AS step,
           (c.checkpoint ->> 'ts')::timestamptz AS ts
    FROM checkpoints c
    WHERE c.checkpoint_ns = ''
    ORDER BY c.thread_id, c.checkpoint_id DESC
)
"""

SUMMARY_SQL = (
    _LATEST_CTE
    + """
SELECT l.graph_version, COALESCE(t.status, 'unknown') AS status, count(*)::int AS threads,
       max(GREATEST(l.ts, t.updated_at)) AS last_activity
FROM latest l LEFT JOIN durable_threads t ON t.thread_id = l.thread_id
GROUP BY 1, 2
"""
)

THREADS_SQL = (
    _LATEST_CTE
    + """
SELECT l.thread_id, l.graph_version, COALESCE(t.status, 'unknown') AS status,
       l.checkpoint_id, l.step, l.migrated_from,
       GREATEST(l.ts, t.updated_at) AS last_activity
FROM latest l LEFT JOIN durable_threads t ON t.thread_id = l.thread_id
WHERE (%(any_version)s OR l.graph_version IS NOT DISTINCT FROM %(version)s)
  AND (%(status)s::text IS NULL OR COALESCE(t.status, 'unknown') = %(status)s)
  AND (%(thread_ids)s::text[] IS NULL OR l.thread_id = ANY(%(thread_ids)s))
ORDER BY GREATEST(l.ts, t.updated_at) DESC NULLS LAST, l.thread_id
LIMIT %(limit)s
"""
)

LOG_SQL = """
SELECT id, thread_id, checkpoint_ns, checkpoint_id, from_version, to_version, steps, origin,
       migrated_at, undone_at, jsonb_array_length(old_writes) AS old_writes,
       jsonb_array_length(old_blobs) AS old_blobs
FROM durable_migration_log
WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
ORDER BY id DESC
LIMIT %(limit)s
"""



# The envelopes (artifact references) among a backup's blobs and writes.
BACKUP_ENVELOPES_SQL = """
SELECT decode(e.blob, 'base64') AS blob FROM durable_migration_log l,
       jsonb_to_recordset(l.old_blobs || l.old_writes) AS e(type text, blob text)
WHERE l.id = %s AND e.type = %s AND e.blob IS NOT NULL
"""
# Which of them are stored, locked against GC until the undo commits (GC deletes an
# artifact only with FOR UPDATE; a key-share lock makes it wait or skip the row).
LOCK_BACKUP_ARTIFACTS_SQL = "SELECT digest FROM durable_artifacts WHERE digest = ANY(%b) FOR KEY SHARE"

# --- undo_migration ------------------------------------------------------------------

# The migration to undo: the thread's latest not undone (or ``id``), row-locked. A retry
# of the same call (after a lost COMMIT reply) asks for undone ones too, by id.
FIND_MIGRATION_SQL = (
    "SELECT id, checkpoint_ns, checkpoint_id, from_version, to_version, "
    "undone_at IS NOT NULL AS undone "
    "FROM durable_migration_log WHERE thread_id = %s "
    "AND (undone_at IS NULL OR %s) "
    "AND (%s::bigint IS NULL OR id = %s) ORDER BY id DESC LIMIT 1 FOR UPDATE"
)
# The thread's head checkpoint and the migration that wrote it (if one did), locked.
HEAD_MIGRATION_SQL = (
    "SELECT checkpoint_id, metadata ->> %s AS migration_id FROM checkpoints "
    "WHERE thread_id = %s AND checkpoint_ns = %s ORDER BY checkpoint_id DESC LIMIT 1 "
    "FOR UPDATE"
)
# The restore: the backup's checkpoint and metadata, its pending writes, its blobs.
RESTORE_CHECKPOINT_SQL = (
    "UPDATE checkpoints c SET checkpoint = l.old_checkpoint, metadata = l.old_metadata "
    "FROM durable_migration_log l WHERE l.id = %s "
    "AND c.thread_id = %s AND c.checkpoint_ns = %s AND c.checkpoint_id = %s"
)
DELETE_CHECKPOINT_WRITES_SQL = (
    "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_ns = %s "
    "AND checkpoint_id = %s"
)
RESTORE_WRITES_SQL = (
    "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
    "task_path, idx, channel, type, blob) "
    "SELECT l.thread_id, l.checkpoint_ns, l.checkpoint_id, w.task_id, w.task_path, w.idx, "
    "w.channel, w.type, decode(w.blob, 'base64') "
    "FROM durable_migration_log l, jsonb_to_recordset(l.old_writes) AS "
    "w(task_id text, task_path text, idx int, channel text, type text, blob text) "
    "WHERE l.id = %s"
)
RESTORE_BLOBS_SQL = (
    "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
    "SELECT l.thread_id, l.checkpoint_ns, b.channel, b.version, b.type, "
    "decode(b.blob, 'base64') "
    "FROM durable_migration_log l, jsonb_to_recordset(l.old_blobs) AS "
    "b(channel text, version text, type text, blob text) "
    "WHERE l.id = %s ON CONFLICT DO NOTHING"
)
MARK_UNDONE_SQL = "UPDATE durable_migration_log SET undone_at = now() WHERE id = %s"

# --- durable_graph_versions (compat.py) --------------------------------------------

# Once per version: a name reused for another topology marks the row ambiguous (its
# topology no longer says which graph wrote a checkpoint stamped with that name).
RECORD_VERSION_SQL = """
INSERT INTO durable_graph_versions AS v (version, fingerprint, topology, graph_name)
VALUES (%s, %s, %s, %s)
ON CONFLICT (version) DO UPDATE SET
    ambiguous = v.ambiguous OR v.fingerprint <> EXCLUDED.fingerprint,
    graph_name = COALESCE(v.graph_name, EXCLUDED.graph_name)
WHERE (v.fingerprint <> EXCLUDED.fingerprint AND NOT v.ambiguous)
   OR (v.graph_name IS NULL AND EXCLUDED.graph_name IS NOT NULL)
"""
# A version recorded before graph names were (graph_name NULL) gets its name on the
# next run start of a process that records it: the first name wins.

LOAD_VERSIONS_SQL = """
SELECT version, fingerprint, topology, ambiguous FROM durable_graph_versions
WHERE version = ANY(%s)
"""

RECORDED_VERSIONS_SQL = "SELECT version, fingerprint, ambiguous, created_at FROM durable_graph_versions"
