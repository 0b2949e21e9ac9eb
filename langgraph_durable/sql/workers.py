"""SQL on ``durable_workers``, the recovery workers' registry (issue 25): register,
heartbeat, stop, prune, list. Owner: langgraph_durable/recovery.py (writes) and
langgraph_durable/ops/control.py (reads)."""

WORKER_REGISTER_SQL = """
INSERT INTO durable_workers (worker_id, name, host, pid, identity, ttl_s, versions,
                             graph_names, concurrency, claimed, started_at, heartbeat_at)
VALUES (%(worker_id)s, %(name)s, %(host)s, %(pid)s, %(identity)s, %(ttl)s, %(versions)s,
        %(graph_names)s, %(concurrency)s, 0, now(), now())
ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL
"""

# One UPDATE per heartbeat interval (never per claim): liveness, the last poll (the
# worker's own clock, sent as seconds ago so clocks need not agree) and the runs in flight.
WORKER_HEARTBEAT_SQL = """
UPDATE durable_workers SET
    heartbeat_at = now(),
    last_poll_at = CASE WHEN %(poll_ago)s::float8 IS NULL THEN last_poll_at
                        ELSE now() - make_interval(secs => %(poll_ago)s::float8) END,
    claimed = %(claimed)s
WHERE worker_id = %(worker_id)s
RETURNING worker_id
"""

WORKER_STOPPED_SQL = """
UPDATE durable_workers SET stopped_at = now(), heartbeat_at = now(), claimed = 0
WHERE worker_id = %(worker_id)s
"""

# Bounded table: rows of stopped or dead workers older than %(keep_s)s go, and beyond
# the newest %(keep)s such rows the rest go too. Live rows are never touched.
WORKER_PRUNE_SQL = """
DELETE FROM durable_workers w
WHERE (w.stopped_at IS NOT NULL OR w.heartbeat_at < now() - make_interval(secs => w.ttl_s))
  AND (w.heartbeat_at < now() - make_interval(secs => %(keep_s)s)
       OR w.worker_id IN (
           SELECT o.worker_id FROM durable_workers o
           WHERE o.stopped_at IS NOT NULL OR o.heartbeat_at < now() - make_interval(secs => o.ttl_s)
           ORDER BY o.heartbeat_at DESC OFFSET %(keep)s))
"""

# Newest heartbeat first; the server judges age (alive also needs the pid check, done in
# Python for workers of this host: leases.owners.owner_is_dead).
WORKER_LIST_SQL = """
SELECT worker_id, name, host, pid, identity, started_at, heartbeat_at, last_poll_at,
       stopped_at, ttl_s, versions, graph_names, concurrency, claimed,
       EXTRACT(EPOCH FROM (now() - heartbeat_at))::float8 AS age_s
FROM durable_workers
WHERE %(include_dead)s OR (stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => ttl_s))
ORDER BY heartbeat_at DESC
LIMIT %(limit)s
"""
