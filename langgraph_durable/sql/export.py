"""SQL of export_stock (export.py): inlining artifact references so the stock saver
reads a thread."""

EXPORT_THREADS_SQL = """
SELECT DISTINCT thread_id FROM checkpoints
WHERE (%(thread_ids)s::text[] IS NULL OR thread_id = ANY(%(thread_ids)s))
ORDER BY thread_id
"""

THREAD_CHECKPOINT_COUNT_SQL = "SELECT count(*)::int AS n FROM checkpoints WHERE thread_id = %s"

REF_BLOBS_SQL = """
SELECT checkpoint_ns, channel, version, blob FROM checkpoint_blobs
WHERE thread_id = %s AND type = %s
ORDER BY checkpoint_ns, channel, version
"""

REF_WRITES_SQL = """
SELECT checkpoint_ns, checkpoint_id, task_id, idx, blob FROM checkpoint_writes
WHERE thread_id = %s AND type = %s
ORDER BY checkpoint_ns, checkpoint_id, task_id, idx
"""

UPDATE_BLOB_SQL = """
UPDATE checkpoint_blobs SET type = %s, blob = %s
WHERE thread_id = %s AND checkpoint_ns = %s AND channel = %s AND version = %s AND type = %s
"""

UPDATE_WRITE_SQL = """
UPDATE checkpoint_writes SET type = %s, blob = %s
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s AND task_id = %s AND idx = %s
  AND type = %s
"""

# Issue 27 (rekey27): run metadata whose user keys are sealed (``_sealing.seal_metadata``)
# goes back to LangGraph's plain form: the stock saver reads metadata as it is stored.
SEALED_METADATA_SQL = """
SELECT checkpoint_ns, checkpoint_id, metadata FROM checkpoints
WHERE thread_id = %s AND metadata ? %s
ORDER BY checkpoint_ns, checkpoint_id
"""

UPDATE_METADATA_SQL = """
UPDATE checkpoints SET metadata = %s::jsonb
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s
"""

# Compact channel versions (issue 26, _chanver) to the stock form: the checkpoints'
# version maps (filtered in Python: export is a one-off walk of the thread) and the
# blob rows keyed by a compact version (they start with 'v', stock ones with a digit).
THREAD_VERSIONS_SQL = """
SELECT checkpoint_ns, checkpoint_id, checkpoint -> 'channel_versions' AS versions,
       checkpoint -> 'versions_seen' AS seen
FROM checkpoints WHERE thread_id = %s
"""

COMPACT_BLOB_VERSIONS_SQL = """
SELECT checkpoint_ns, channel, version FROM checkpoint_blobs
WHERE thread_id = %s AND version LIKE 'v%%'
ORDER BY checkpoint_ns, channel, version
"""

UPDATE_CHECKPOINT_VERSIONS_SQL = """
UPDATE checkpoints
SET checkpoint = checkpoint || jsonb_build_object('channel_versions', %s::jsonb, 'versions_seen', %s::jsonb)
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s
"""

UPDATE_BLOB_VERSION_SQL = """
UPDATE checkpoint_blobs SET version = %s
WHERE thread_id = %s AND checkpoint_ns = %s AND channel = %s AND version = %s
"""
