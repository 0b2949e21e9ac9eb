"""SQL of the read-only inspection (ops/inspection.py, the ``threads``/``stats``
commands): metadata questions answered on the stock tables and ours."""

from psycopg import sql

from langgraph_durable._values import ISO_TS_RE
from langgraph_durable.states import state_case_sql

# The thread's state (states.py), computed in SQL so ``--status`` filters before LIMIT.
THREAD_STATE_CASE_SQL = state_case_sql("t")

# What a page of threads weighs and where each stands (its checkpoints, blobs, writes,
# artifacts, its latest root checkpoint), one LATERAL per table keyed by the page's
# thread ids: shared by the threads list here and the console's natural-order page.
THREAD_PAGE_SIZES_SQL = """LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE c.checkpoint_ns = '') AS checkpoints,
           sum(pg_column_size(c.checkpoint) + pg_column_size(c.metadata))::bigint AS cp_bytes,
           max(c.checkpoint_id) FILTER (WHERE c.checkpoint_ns = '') AS latest_id
    FROM checkpoints c WHERE c.thread_id = page.thread_id
) cp ON true
LEFT JOIN LATERAL (
    SELECT sum(octet_length(b.blob))::bigint AS bytes
    FROM checkpoint_blobs b WHERE b.thread_id = page.thread_id
) bl ON true
LEFT JOIN LATERAL (
    SELECT sum(octet_length(w.blob))::bigint AS bytes, count(*) AS n
    FROM checkpoint_writes w WHERE w.thread_id = page.thread_id
) wr ON true
LEFT JOIN LATERAL (
    SELECT sum(octet_length(a.data))::bigint AS bytes, count(*) AS n
    FROM durable_artifact_refs r JOIN durable_artifacts a ON a.digest = r.digest
    WHERE r.thread_id = page.thread_id
) art ON true
LEFT JOIN checkpoints latest ON latest.thread_id = page.thread_id
    AND latest.checkpoint_ns = '' AND latest.checkpoint_id = cp.latest_id"""

# One page of threads in thread_id order, after the ``after`` cursor (keyset): the page's
# ids come from index walks (durable_threads' primary key, and a skip scan of the
# checkpoints' primary key for threads with no durable_threads row), then the
# per-thread aggregates are computed for those ids only. So a page costs what it shows,
# not every row of history (issue 14: 1.7 s at 100k threads before). A ``status``
# filter other than 'untracked' walks durable_threads alone (a thread without a row is
# untracked); 'untracked' walks the checkpoints alone.
# A thread page's state filter. ``%(dead)s``: the lease owners this machine judged dead
# processes (``leases.dead``, one bounded statement before the page): an operator sees
# their live leases as 'recoverable' (``inspection.mark_dead_owner``), so they are listed
# under recoverable and not under running; before, `threads list --status recoverable`
# left out the threads `threads list` labelled recoverable until their lease expired
# (newcomer review, stop 32). ``{state}`` is THREAD_STATE_CASE_SQL.
STATE_FILTER_SQL = """(%(status)s::text IS NULL
           OR ((t.status = %(status)s OR {state} = %(status)s)
               AND NOT (%(status)s = 'running' AND t.lease_owner = ANY(%(dead)s::text[])))
           OR (%(status)s = 'recoverable' AND t.lease_owner = ANY(%(dead)s::text[])))"""

THREAD_LIST_SQL = sql.SQL("""
WITH RECURSIVE tracked AS (
    SELECT t.thread_id FROM durable_threads t
    WHERE t.thread_id > COALESCE(%(after)s::text, '') AND t.thread_id >= COALESCE(%(prefix)s::text, '')
      AND (%(prefix)s::text IS NULL OR starts_with(t.thread_id, %(prefix)s))
      AND {state_filter}
    ORDER BY t.thread_id
    LIMIT %(limit)s
), bound AS (
    -- A full page of tracked threads: untracked ones past its last id are not on it.
    SELECT CASE WHEN count(*) >= %(limit)s THEN max(thread_id) END AS id FROM tracked
), walk AS (
    (SELECT c.thread_id FROM checkpoints c
     WHERE c.thread_id > COALESCE(%(after)s::text, '') AND c.thread_id >= COALESCE(%(prefix)s::text, '')
     ORDER BY c.thread_id LIMIT 1)
    UNION ALL
    SELECT (SELECT c.thread_id FROM checkpoints c WHERE c.thread_id > walk.thread_id
            ORDER BY c.thread_id LIMIT 1)
    FROM walk
    WHERE walk.thread_id IS NOT NULL
      AND walk.thread_id < COALESCE((SELECT id FROM bound), walk.thread_id || 'x')
), untracked AS (
    SELECT w.thread_id FROM walk w
    WHERE w.thread_id IS NOT NULL
      AND (%(status)s::text IS NULL OR %(status)s = 'untracked')
      AND (%(prefix)s::text IS NULL OR starts_with(w.thread_id, %(prefix)s))
      AND NOT EXISTS (SELECT 1 FROM durable_threads t WHERE t.thread_id = w.thread_id)
    LIMIT %(limit)s
), page AS (
    SELECT thread_id FROM (SELECT thread_id FROM untracked UNION ALL SELECT thread_id FROM tracked) p
    ORDER BY thread_id LIMIT %(limit)s
)
SELECT page.thread_id,
       t.status,
       {state} AS state,
       COALESCE(t.graph_version, latest.metadata ->> 'graph_version') AS graph_version,
       CASE WHEN jsonb_typeof(latest.metadata -> 'step') = 'number'
            THEN (latest.metadata ->> 'step')::numeric::int END AS step,
       COALESCE(cp.checkpoints, 0) AS checkpoints,
       COALESCE(wr.n, 0) AS writes,
       COALESCE(cp.cp_bytes, 0) + COALESCE(bl.bytes, 0) + COALESCE(wr.bytes, 0) AS row_bytes,
       COALESCE(art.bytes, 0) AS artifact_bytes,
       COALESCE(art.n, 0) AS artifacts,
       t.attempts,
       t.lease_owner,
       EXTRACT(EPOCH FROM (t.lease_expires_at - now()))::float8 AS lease_expires_in,
       t.last_error,
       GREATEST(t.updated_at, CASE WHEN latest.checkpoint ->> 'ts' ~ {ts_re}
            THEN (latest.checkpoint ->> 'ts')::timestamptz END) AS last_activity
FROM page
LEFT JOIN durable_threads t ON t.thread_id = page.thread_id
{sizes}
ORDER BY page.thread_id
""").format(state=sql.SQL(THREAD_STATE_CASE_SQL), ts_re=sql.Literal(ISO_TS_RE),
           state_filter=sql.SQL(STATE_FILTER_SQL.format(state=THREAD_STATE_CASE_SQL)),
          sizes=sql.SQL(THREAD_PAGE_SIZES_SQL))

# Tracked threads by status from the trigger-kept durable_thread_counts (issue 14), the
# live leases (the only rows whose state is not their status's, besides quarantine) by
# the (status, lease_expires_at) index: neither grows with history. Untracked threads
# (checkpoints but no durable_threads row) can only be found by looking at every
# thread id in checkpoints: UNTRACKED_COUNT_SQL, an index-only anti-join.
THREAD_STATE_COUNTS_SQL = """
WITH totals AS (
    SELECT status, sum(n)::bigint AS n FROM durable_thread_counts GROUP BY status HAVING sum(n) <> 0
), live AS (
    SELECT t.status, count(*)::bigint AS n FROM durable_threads t
    WHERE t.status = ANY(ARRAY(SELECT status FROM totals WHERE status <> 'quarantined'))
      AND t.lease_expires_at > now() AND t.lease_owner IS NOT NULL
    GROUP BY t.status
)
SELECT totals.status, totals.n, COALESCE(live.n, 0) AS live
FROM totals LEFT JOIN live ON live.status = totals.status
"""

UNTRACKED_COUNT_SQL = """
SELECT count(*)::bigint AS n
FROM (SELECT thread_id FROM checkpoints GROUP BY thread_id) c
WHERE NOT EXISTS (SELECT 1 FROM durable_threads t WHERE t.thread_id = c.thread_id)
"""

THREAD_ROW_SQL = """
SELECT thread_id, status, graph_version, lease_owner, lease_token,
       lease_expires_at,
       EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS lease_expires_in,
       attempts, attempts_checkpoint_id, last_error, last_failure, created_at, updated_at
FROM durable_threads WHERE thread_id = %s
"""

HISTORY_SQL = """
SELECT checkpoint_id, parent_checkpoint_id, checkpoint -> 'channel_versions' AS versions,
       checkpoint ->> 'ts' AS ts, metadata,
       (pg_column_size(checkpoint) + pg_column_size(metadata))::int AS row_bytes
FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s
ORDER BY checkpoint_id DESC LIMIT %s
"""

WRITES_SQL = """
SELECT checkpoint_id, task_id, task_path, channel, type, octet_length(blob)::int AS bytes
FROM checkpoint_writes
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = ANY(%s)
ORDER BY checkpoint_id, task_id, idx
"""

BLOB_SIZES_SQL = """
SELECT channel, version, type, octet_length(blob)::int AS bytes
FROM checkpoint_blobs WHERE thread_id = %s AND checkpoint_ns = %s
"""

# show_thread's facts beside the thread row.
QUARANTINE_ROW_SQL = "SELECT * FROM durable_quarantine WHERE thread_id = %s"
CHECKPOINT_COUNT_SQL = (
    "SELECT count(*)::int AS n FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s"
)
LEDGER_BY_STATUS_SQL = (
    "SELECT status, count(*)::int AS n FROM durable_ledger WHERE thread_id = %s GROUP BY status"
)

# storage_stats' dedup figures: the envelopes referencing artifacts, the artifact table's
# totals, chunk contents and element sizes, and who uses a damaged chunk.
REF_BLOBS_SQL = "SELECT blob, thread_id, checkpoint_ns, channel FROM checkpoint_blobs WHERE type = %s"
REF_WRITES_SQL = (
    "SELECT blob, thread_id, checkpoint_ns, channel, checkpoint_id "
    "FROM checkpoint_writes WHERE type = %s"
)
ARTIFACT_TOTALS_SQL = (
    "SELECT count(*)::bigint AS n, COALESCE(sum(size), 0)::bigint AS unique_bytes, "
    "COALESCE(sum(octet_length(data)), 0)::bigint AS stored_bytes FROM durable_artifacts"
)
ARTIFACT_DATA_SQL = "SELECT digest, data FROM durable_artifacts WHERE digest = ANY(%s)"
ARTIFACT_SIZES_SQL = "SELECT digest, size FROM durable_artifacts WHERE digest = ANY(%s)"
ARTIFACT_USERS_SQL = (
    "SELECT thread_id FROM durable_artifact_refs WHERE digest = %s ORDER BY thread_id LIMIT 10"
)

# Checkpoint references: one checkpoint's channel versions (a history's missing parent),
# the n-th newest (``~n``), the ones an id prefix matches (starts_with: never a pattern).
CHECKPOINT_VERSIONS_SQL = (
    "SELECT checkpoint_id, checkpoint -> 'channel_versions' AS versions FROM checkpoints "
    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
)
NTH_CHECKPOINT_SQL = (
    "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s "
    "ORDER BY checkpoint_id DESC OFFSET %s LIMIT 1"
)
CHECKPOINT_PREFIX_SQL = (
    "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s "
    "AND starts_with(checkpoint_id, %s) ORDER BY checkpoint_id DESC LIMIT 2"
)

# Table and database sizes (storage_stats).
TABLE_OID_SQL = "SELECT to_regclass(%s)::oid AS oid"
TABLE_SIZES_SQL = (
    "SELECT pg_total_relation_size(%s)::bigint AS total, pg_relation_size(%s)::bigint AS heap, "
    "pg_indexes_size(%s)::bigint AS indexes"
)
DATABASE_SIZE_SQL = (
    "SELECT current_database() AS name, pg_database_size(current_database())::bigint AS bytes"
)


def table_count_sql(name: str) -> sql.Composed:
    """Rows of ``name`` (from the package's fixed table lists; quoted as an identifier)."""
    return sql.SQL("SELECT count(*)::bigint AS n FROM {}").format(sql.Identifier(name))

# A statement timeout for this transaction only (the queue gauge: a scrape never waits
# on a slow count).
STATEMENT_TIMEOUT_SQL = "SELECT set_config('statement_timeout', %s, true)"
