"""The console's own SQL: what the operator APIs (inspect, poison, idempotency,
versioning, retention, audit) do not already answer. Read-only statements, each
bounded by an index walk or a LIMIT (bench/bench_console.py times them at 100k
threads)."""

from __future__ import annotations

from psycopg import sql

from langgraph_durable.sql.inspection import STATE_FILTER_SQL, THREAD_PAGE_SIZES_SQL
from langgraph_durable.sql.inspection import THREAD_STATE_CASE_SQL as _STATE_SQL

# Live leases by owner (the workers). The status list comes from the trigger-kept
# counts so the (status, lease_expires_at) index answers it (as inspect._COUNTS_SQL).
WORKERS_SQL = """
SELECT t.lease_owner AS owner, count(*)::int AS threads,
       min(EXTRACT(EPOCH FROM (t.lease_expires_at - now())))::float8 AS min_expires_in,
       max(EXTRACT(EPOCH FROM (t.lease_expires_at - now())))::float8 AS max_expires_in
FROM durable_threads t
WHERE t.status = ANY(ARRAY(SELECT status FROM durable_thread_counts GROUP BY status))
  AND t.lease_owner IS NOT NULL AND t.lease_expires_at > now()
GROUP BY t.lease_owner ORDER BY t.lease_owner
LIMIT 200
"""

LEASES_SQL = """
SELECT t.thread_id, t.lease_owner AS owner, t.lease_token AS token, t.status,
       EXTRACT(EPOCH FROM (t.lease_expires_at - now()))::float8 AS expires_in
FROM durable_threads t
WHERE t.status = ANY(ARRAY(SELECT status FROM durable_thread_counts GROUP BY status))
  AND t.lease_owner IS NOT NULL AND t.lease_expires_at > now()
ORDER BY t.lease_expires_at
LIMIT %s
"""

# Tracked threads filtered by what inspect.list_threads does not filter on (graph
# version, age), in thread_id order after a keyset cursor: a walk of the primary key
# that stops after one page of matches.
_STATE_FILTER = sql.SQL(STATE_FILTER_SQL.format(state=_STATE_SQL))

THREADS_SQL = sql.SQL("""
SELECT t.thread_id, t.status, {state} AS state, t.graph_version, t.attempts,
       t.lease_owner, EXTRACT(EPOCH FROM (t.lease_expires_at - now()))::float8 AS lease_expires_in,
       t.last_error, t.updated_at AS last_activity
FROM durable_threads t
WHERE t.thread_id > COALESCE(%(after)s::text, '')
  AND t.thread_id >= COALESCE(%(prefix)s::text, '')
  AND (%(prefix)s::text IS NULL OR starts_with(t.thread_id, %(prefix)s))
  AND (%(version)s::text IS NULL OR t.graph_version = %(version)s)
  AND (%(older)s::float8 IS NULL OR t.updated_at < now() - make_interval(secs => %(older)s))
  AND (%(newer)s::float8 IS NULL OR t.updated_at >= now() - make_interval(secs => %(newer)s))
  AND {state_filter}
ORDER BY t.thread_id
LIMIT %(limit)s
""").format(state=sql.SQL(_STATE_SQL), state_filter=_STATE_FILTER)

# The threads with the most stored bytes (their own rows: checkpoints, blobs, writes).
# A scan of the three tables: the storage page's one statement that grows with them.
LARGEST_SQL = """
SELECT thread_id, sum(bytes)::bigint AS bytes, sum(rows)::bigint AS rows FROM (
    SELECT thread_id, sum(pg_column_size(checkpoint) + pg_column_size(metadata)) AS bytes,
           count(*) AS rows
    FROM checkpoints GROUP BY thread_id
    UNION ALL
    SELECT thread_id, sum(octet_length(blob)), count(*) FROM checkpoint_blobs GROUP BY thread_id
    UNION ALL
    SELECT thread_id, sum(octet_length(blob)), count(*) FROM checkpoint_writes GROUP BY thread_id
) x GROUP BY thread_id ORDER BY bytes DESC, thread_id LIMIT %s
"""

TABLE_SIZES_SQL = """
SELECT c.relname AS name, c.reltuples::bigint AS rows_estimate,
       COALESCE(s.n_live_tup, 0)::bigint AS live_tuples,
       pg_total_relation_size(c.oid)::bigint AS total_bytes,
       pg_relation_size(c.oid)::bigint AS heap_bytes,
       pg_indexes_size(c.oid)::bigint AS index_bytes
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
  AND (c.relname LIKE 'durable\\_%%' OR c.relname LIKE 'checkpoint%%')
ORDER BY pg_total_relation_size(c.oid) DESC
"""

# One sample of the counters the charts plot (see _app.Sampler): rows inserted into
# checkpoints since the statistics were reset, and the bytes of every table.
SAMPLE_SQL = """
SELECT COALESCE((SELECT n_tup_ins FROM pg_stat_user_tables
                 WHERE relname = 'checkpoints' AND schemaname = current_schema()), 0)::bigint
           AS checkpoints_inserted,
       COALESCE((SELECT n_tup_ins FROM pg_stat_user_tables
                 WHERE relname = 'checkpoint_writes' AND schemaname = current_schema()), 0)::bigint
           AS writes_inserted,
       COALESCE((SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
                 WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
                   AND (c.relname LIKE 'durable\\_%%' OR c.relname LIKE 'checkpoint%%')), 0)::bigint
           AS total_bytes,
       now() AS at
"""

# Threads per graph version and status from durable_threads (the version the saver
# stamped at the thread's last run start or migration): one scan of durable_threads,
# where versioning.version_summary reads every thread's latest checkpoint (exact, also
# for untracked threads, but ~2 s at 100k threads; the versions page offers it).
VERSIONS_SQL = """
SELECT graph_version, status, count(*)::int AS threads, max(updated_at) AS last_activity,
       max(created_at) AS newest_thread
FROM durable_threads GROUP BY 1, 2
"""

# reltuples is -1 until a table's first VACUUM or ANALYZE (issue 25: the page said "?").
# A table that small is counted exactly (at most SMALL_TABLE_BYTES of heap: a few ms);
# a larger one takes the statistics' live-tuple count.
SMALL_TABLE_BYTES = 8 * 1024 * 1024


def count_rows_sql(table: str) -> sql.Composed:
    return sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(table))

# The recorded results of the ledger rows a transcript links to, in one statement (issue
# 25; the thread page would otherwise read one row per tool call).
LEDGER_RESULTS_SQL = """
SELECT key, result_type, result FROM durable_ledger
WHERE key = ANY(%s) AND status = 'completed'
"""

# Each version's graph name (issue 25), for the versions page's per-graph "current".
VERSION_NAMES_SQL = """
SELECT version, graph_name FROM durable_graph_versions WHERE version = ANY(%s)
"""

# --- ui25: the threads list in natural order (issue 25) ---------------------------------
# "order-2" before "order-10": an ICU collation with numeric ordering (und-u-kn-true),
# created with an expression index on durable_threads by the ui25 migration (where the
# server has ICU; without it the list stays in byte order and says so). A page is a walk
# of that index after a keyset cursor (the last id of the previous page, compared in the
# same collation) that stops after one page of matches, then the same per-thread
# aggregates as inspect.list_threads for that page only. With a prefix the rows are the
# prefix's range of the primary key (contiguous in byte order, not in natural order),
# sorted naturally: that costs the prefix's matches, not the table's.
NATURAL_AVAILABLE_SQL = """
SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'durable_natural'
               AND collnamespace = current_schema()::regnamespace)
   AND to_regclass('durable_threads_natural_idx') IS NOT NULL AS ok
"""

THREADS_NATURAL_SQL = sql.SQL("""
WITH page AS (
    SELECT t.thread_id FROM durable_threads t
    WHERE (%(after)s::text IS NULL OR (t.thread_id COLLATE durable_natural) > %(after)s)
      AND (%(prefix)s::text IS NULL OR (t.thread_id >= %(prefix)s AND starts_with(t.thread_id, %(prefix)s)))
      AND (%(version)s::text IS NULL OR t.graph_version = %(version)s)
      AND (%(older)s::float8 IS NULL OR t.updated_at < now() - make_interval(secs => %(older)s))
      AND (%(newer)s::float8 IS NULL OR t.updated_at >= now() - make_interval(secs => %(newer)s))
      AND {state_filter}
    ORDER BY (t.thread_id COLLATE durable_natural)
    LIMIT %(limit)s
)
SELECT t.thread_id, t.status, {state} AS state, t.graph_version, t.attempts,
       CASE WHEN jsonb_typeof(latest.metadata -> 'step') = 'number'
            THEN (latest.metadata ->> 'step')::numeric::int END AS step,
       COALESCE(cp.checkpoints, 0) AS checkpoints,
       COALESCE(cp.cp_bytes, 0) + COALESCE(bl.bytes, 0) + COALESCE(wr.bytes, 0)
           + COALESCE(art.bytes, 0) AS bytes,
       t.lease_owner, EXTRACT(EPOCH FROM (t.lease_expires_at - now()))::float8 AS lease_expires_in,
       t.last_error, t.updated_at AS last_activity
FROM page JOIN durable_threads t ON t.thread_id = page.thread_id
{sizes}
ORDER BY (t.thread_id COLLATE durable_natural)
""").format(state=sql.SQL(_STATE_SQL), sizes=sql.SQL(THREAD_PAGE_SIZES_SQL), state_filter=_STATE_FILTER)
