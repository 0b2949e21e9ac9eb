"""The recovery workers' SQL: claim a recoverable thread (``durable_threads``), queue
submitted work, read a thread back after its run, count threads by lifecycle. Owner:
langgraph_durable/recovery.py."""

from collections.abc import Sequence

_CLAIM_HEAD = """
WITH cand AS (
    SELECT l.thread_id, l.status AS prev_status, l.attempts, l.attempts_checkpoint_id,
           cp.checkpoint_id, cp.graph_version, k.ok
    FROM (
        -- What a claim may take (issue 14), in the order a plain Append reads it: first
        -- the leased threads it may take, found by lease (few, any order): an expired
        -- lease (its worker died) by durable_threads_leased_idx (by
        -- durable_threads_expired_version_idx for a worker of some versions only), or one this very claim
        -- took already (its COMMIT's reply was lost and the driver retried it: the
        -- retry takes it again, same token) by durable_threads_owner_idx. The status
        -- filter of these is the join's below.
{expired}        UNION ALL
        SELECT o.thread_id FROM durable_threads o
        WHERE o.lease_owner = %(owner)s AND (o.lease_expires_at < now()) IS NOT TRUE
          AND o.status IN ('running', 'stopped', 'queued', 'error')
          AND NOT (o.thread_id = ANY(%(skip)s))
{dead_branch}        UNION ALL
        -- Then the ready queue in claim order: one ordered walk of
        -- durable_threads_claim_idx (status, updated_at; unleased threads only) per
        -- status (durable_threads_claim_version_idx per status and version for a worker
        -- of some versions only, issue 26: never the other versions' backlog),
        -- merged by updated_at (Merge Append), so a poll reads only the statuses
        -- it may take (claim_sql writes a branch for those only), never a live run's
        -- row, and stops at the first taker. CLAIM_PLAN_SQL rules out sorting
        -- the queue instead. Each branch orders itself and the UNION ALL sits in a FROM
        -- of its own: only so are the branches planned as ordered walks that the outer
        -- ORDER BY merges (a branch with quals is a subquery planned for its own ORDER BY).
        SELECT q.thread_id FROM (SELECT u.thread_id FROM (
"""
# One branch per status the poll takes (no branch at all for the others: a branch
# folded to nothing at plan time still costs the merge a sort, which CLAIM_PLAN_SQL
# prices out, and the planner then turned the whole join around).
_CLAIM_STATUS = """
        (SELECT r.thread_id, r.updated_at FROM durable_threads r
        WHERE {version}r.status = '{st}' AND r.lease_owner IS NULL{held}
          AND NOT (r.thread_id = ANY(%(skip)s))
        ORDER BY r.updated_at)
"""
_CLAIM_ERRORS = """
        -- ... errors too when retried, once past their backoff (never less than
        -- %(backoff)s: the range of the index walk; the per-thread backoff filters).
        (SELECT r.thread_id, r.updated_at FROM durable_threads r
        WHERE {version}r.status = 'error' AND r.lease_owner IS NULL
          AND r.updated_at < now() - make_interval(secs => %(backoff)s)
          AND r.updated_at < now() - make_interval(secs => LEAST(
              %(backoff)s * power(2, GREATEST(r.attempts - 1, 0)), %(max_backoff)s))
          AND NOT (r.thread_id = ANY(%(skip)s))
        ORDER BY r.updated_at)
"""
_CLAIM_TAIL = """        ) u
        ORDER BY u.updated_at
        OFFSET 0) q
        -- OFFSET 0: the whole walk is a subquery of its own, so the checkpoint probe
        -- below runs per thread in this order and the LIMIT stops at the first taker.
        OFFSET 0
    ) t
    -- The row itself, locked, one primary-key probe per thread walked (a LATERAL with
    -- its own FOR UPDATE: never planned as the outer side of the join; FOR UPDATE is
    -- not allowed over the UNION). Under READ COMMITTED a row changed since the walk
    -- read it is re-read and re-checked, so a thread another worker took or finished
    -- meanwhile is passed over; one another open claim holds is skipped, not waited for.
    CROSS JOIN LATERAL (
        SELECT l.thread_id, l.status, l.attempts, l.attempts_checkpoint_id, l.graph_version AS hint
        FROM durable_threads l
        WHERE l.thread_id = t.thread_id
          AND l.status IN ('running', 'stopped', 'queued', 'error')
          AND NOT (l.status = 'stopped' AND l.cancelled_at IS NOT NULL)
          -- ... nor one whose last run an operator cancelled (cancel_token: that run's
          -- lease token) and that died (SIGKILL, OOM) or handed back before stopping:
          -- held as a cancelled one is, until resumed (queue clears it) or a run
          -- starts on it (a new token) (rev25: a worker took the dead lease over and
          -- ran the thread on, the cancel lost).
          AND l.cancel_token IS DISTINCT FROM l.lease_token
          -- ... or a thread this very claim took already (see above).
          AND (l.lease_owner IS NULL OR l.lease_expires_at < now() OR l.lease_owner = %(owner)s{dead_lock})
          AND (l.status = ANY(%(statuses)s)
               OR (l.status = 'error' AND %(retry_errors)s
                   AND l.updated_at < now() - make_interval(secs => LEAST(
                       %(backoff)s * power(2, GREATEST(l.attempts - 1, 0)), %(max_backoff)s))))
        FOR UPDATE SKIP LOCKED
    ) l
    CROSS JOIN LATERAL (
        SELECT c.checkpoint_id, c.metadata ->> 'graph_version' AS graph_version
        FROM checkpoints c
        WHERE c.thread_id = l.thread_id AND c.checkpoint_ns = ''
        ORDER BY c.checkpoint_id DESC
        LIMIT 1
    ) cp
    CROSS JOIN LATERAL (
        SELECT COALESCE(%(any_version)s OR cp.graph_version = ANY(%(versions)s)
                        OR (cp.graph_version IS NULL AND %(adopt)s), false) AS ok
    ) k
    WHERE k.ok{repair}
    LIMIT %(limit)s
)
-- A thread taken (ok): the lease for this worker. A thread only walked because its row
-- named a version its latest checkpoint does not (not ok; issue 26, see _CLAIM_REPAIR):
-- the row's graph_version corrected, nothing else; the caller polls again.
UPDATE durable_threads AS t
SET lease_owner = CASE WHEN cand.ok THEN %(owner)s ELSE t.lease_owner END,
    lease_token = CASE WHEN NOT cand.ok OR t.lease_owner = %(owner)s THEN t.lease_token
                       ELSE t.lease_token + 1 END,
    lease_expires_at = CASE WHEN cand.ok THEN now() + make_interval(secs => %(ttl)s)
                            ELSE t.lease_expires_at END,
    graph_version = cand.graph_version
FROM cand
WHERE t.thread_id = cand.thread_id
RETURNING t.thread_id, t.lease_token, cand.prev_status, cand.checkpoint_id, cand.graph_version,
          t.answer_type, t.answer_blob, t.answer_checkpoint_id,
          CASE WHEN cand.attempts_checkpoint_id IS NOT DISTINCT FROM cand.checkpoint_id
               THEN cand.attempts + 1 ELSE 1 END AS attempt, cand.ok AS claimed
"""
# The claim's variant for leases whose owner the worker judged dead (leases.dead: a
# process of this machine that is gone, the check a run start makes before taking over):
# those rows by durable_threads_owner_idx (one probe per owner in %(dead)s), before the
# queue, and the row lock accepts them. Only sent when there are such owners: the
# common claim's text and plan are unchanged.
_CLAIM_DEAD_BRANCH = """        UNION ALL
        SELECT d.thread_id FROM durable_threads d
        WHERE d.lease_owner = ANY(%(dead)s) AND d.lease_expires_at >= now()
          AND d.status IN ('running', 'stopped', 'queued', 'error')
          AND NOT (d.thread_id = ANY(%(skip)s))
"""
_CLAIM_DEAD_LOCK = " OR l.lease_owner = ANY(%(dead)s)"
# No status taken at all: an empty queue of the same shape.
_CLAIM_NONE = "        SELECT NULL::text AS thread_id, NULL::timestamptz AS updated_at WHERE false\n"
READY_STATUSES = ("running", "stopped", "queued", "error")

# The expired leases, for a worker of any version: every one (durable_threads_leased_idx).
_CLAIM_EXPIRED_ANY = """        SELECT e.thread_id FROM durable_threads e
        WHERE e.lease_owner IS NOT NULL AND e.lease_expires_at < now()
          AND e.status IN ('running', 'stopped', 'queued', 'error')
          AND NOT (e.thread_id = ANY(%(skip)s))
"""
# ... for a worker of some versions only (issue 26): the expired leases of those versions
# and of none, by durable_threads_expired_version_idx (graph_version, lease_expires_at):
# one range per version, never the other versions' dead runs. A leased row names its
# run's version (the acquisition writes it, and the run stamps its checkpoints with it).
_CLAIM_EXPIRED_VERSIONS = """        SELECT e.thread_id FROM durable_threads e
        WHERE e.lease_owner IS NOT NULL AND e.lease_expires_at < now()
          AND e.graph_version = ANY(%(versions)s)
          AND e.status IN ('running', 'stopped', 'queued', 'error')
          AND NOT (e.thread_id = ANY(%(skip)s))
        UNION ALL
        SELECT n.thread_id FROM durable_threads n
        WHERE n.lease_owner IS NOT NULL AND n.lease_expires_at < now()
          AND n.graph_version IS NULL
          AND n.status IN ('running', 'stopped', 'queued', 'error')
          AND NOT (n.thread_id = ANY(%(skip)s))
"""
# A worker of some versions only walks the rows naming one of them or none
# (durable_threads.graph_version: the version the thread's last run or submit wrote,
# which its checkpoints carry). The latest checkpoint's stamp stays the rule (k.ok).
# A row whose stamp differs from what it names (its head rewritten outside a run by
# another version, a stock write, a row from before the column was kept) is corrected
# when a claim walks it: then the worker of the stamp's version finds it by its index
# branch. Only in these claims: a worker of any version takes whatever it walks.
_CLAIM_REPAIR = "\n       OR cp.graph_version IS DISTINCT FROM l.hint"
_claim_cache: dict[tuple[tuple[str, ...], bool, bool, int | None], str] = {}


def claim_version_params(versions: Sequence[str]) -> dict[str, str]:
    """The per-version parameters of ``claim_sql(..., versions=len(versions))``."""
    return {f"cv{i}": v for i, v in enumerate(versions)}


def claim_sql(
    statuses: Sequence[str], retry_errors: bool, dead: bool = False, versions: int | None = None
) -> str:
    """The claim for a worker taking ``statuses`` (and errors past their backoff when
    ``retry_errors``): the ready-queue walk has one ordered branch per status it takes.
    The statuses are only ever the known ready ones (anything else has no branch).
    ``dead``: also the leases of the owners in ``%(dead)s`` (see _CLAIM_DEAD_BRANCH).
    ``versions``: None for a worker of any version; else how many versions the worker
    runs (``claim_version_params``): one ordered branch per status and version
    (durable_threads_claim_version_idx), and one for rows naming no version, so a poll
    never reads the threads of other versions (issue 26)."""
    key = (tuple(st for st in READY_STATUSES if st in statuses), bool(retry_errors), bool(dead), versions)
    sql = _claim_cache.get(key)
    if sql is None:
        if versions is None:
            keys = [""]
        else:
            # COALESCE(graph_version, ''): the index's key, so that rows naming none are
            # an equality too, walked in updated_at order like the others (IS NULL is
            # not an equality to the planner: that walk would need a sort).
            keys = [f"COALESCE(r.graph_version, '') = %(cv{i})s AND " for i in range(versions)]
            keys.append("COALESCE(r.graph_version, '') = '' AND ")
        # A thread an operator cancelled stays 'stopped' until resumed (cancelled_at).
        held = {"stopped": " AND r.cancelled_at IS NULL"}
        parts = [_CLAIM_STATUS.lstrip("\n").format(st=st, version=v, held=held.get(st, ""))
                 for v in keys for st in key[0]]
        if retry_errors and "error" not in key[0]:
            parts += [_CLAIM_ERRORS.lstrip("\n").replace("{version}", v) for v in keys]
        queue = "        UNION ALL\n".join(parts) if parts else _CLAIM_NONE
        # Literal replacements, not str.format: the SQL holds %(name)s parameters.
        head = _CLAIM_HEAD.replace("{dead_branch}", _CLAIM_DEAD_BRANCH if dead else "")
        head = head.replace("{expired}", _CLAIM_EXPIRED_ANY if versions is None else _CLAIM_EXPIRED_VERSIONS)
        tail = _CLAIM_TAIL.replace("{dead_lock}", _CLAIM_DEAD_LOCK if dead else "")
        tail = tail.replace("{repair}", "" if versions is None else _CLAIM_REPAIR)
        sql = _claim_cache[key] = head + queue + tail
    return sql


# Every status, errors retried (tests, benchmarks).
RECOVERY_CLAIM_SQL = claim_sql(READY_STATUSES, True)

JIT_OFF_SQL = "SELECT set_config('jit', 'off', true)"
# The claim's plan, sent in the claim's own transaction (transaction-local: safe behind
# PgBouncer transaction pooling, nothing leaks to the pooled session). jit off: the plan
# stops at the first claimable thread (well under a millisecond); compiling it cost
# 11-15 ms per poll. enable_sort / enable_bitmapscan off: the OFFSET 0 subquery is planned
# for its total cost (the outer LIMIT is not seen through it), so once the backlog rows
# have moved in the heap (every claim, renewal and release moves them; the correlation of
# updated_at drops) the planner priced Bitmap Heap Scan + Sort of the whole backlog below
# the ordered index walk, and a poll read and sorted all of it (34 ms at 100k threads,
# 153 ms at 1M; issue 14). The ordered walk (Merge Append of durable_threads_claim_idx
# per status) is the only plan that stops at the first taker, so it must not depend on
# the statistics. The claim has no other sort to lose (the checkpoint probe reads
# checkpoints_pkey backwards, the lock a primary-key probe).
# enable_seqscan / enable_hashjoin / enable_mergejoin off: the lock on the thread row and
# the update are primary-key probes of the rows walked, never a scan of or a join against
# the whole table (with a status's branch priced out, the planner once put a sequential
# scan of durable_threads outside the walk: 15 ms at 100k threads, for nothing).
CLAIM_PLAN_SQL = (
    "SELECT set_config('jit', 'off', true), set_config('enable_sort', 'off', true), "
    "set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true), "
    "set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"
)
# status_counts' plan: no JIT and no parallel workers. The orphan probe's estimate is
# the whole backlog (has_root is NULL on most rows, uncorrelated with status for the
# planner), so with workers allowed it splits a walk of the ready index between them
# instead of reading the near-empty durable_threads_unrooted_idx (issue 14: 40 ms of
# 120 at 1M threads). Serially the small partial index is always the cheaper path.
STATUS_PLAN_SQL = (
    "SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true)"
)

# After a run: drop the claim if the run never took it over (it failed before its
# lease acquisition), then read where the thread ended up.
RECOVERY_FINISH_SQL = """
UPDATE durable_threads SET lease_owner = NULL, lease_expires_at = NULL
WHERE thread_id = %(thread_id)s AND lease_owner = %(owner)s AND lease_token = %(token)s
"""

RECOVERY_THREAD_STATE_SQL = """
SELECT status, lease_owner, lease_token, attempts, last_error
FROM durable_threads WHERE thread_id = %s
"""

RECOVERY_QUEUE_SQL = """
INSERT INTO durable_threads AS t (thread_id, status, graph_version, updated_at)
VALUES (%(thread_id)s, 'queued', %(version)s, now())
ON CONFLICT (thread_id) DO UPDATE SET
    status = 'queued',
    graph_version = COALESCE(EXCLUDED.graph_version, t.graph_version),
    attempts = 0,
    attempts_checkpoint_id = NULL,
    last_error = NULL,
    cancel_token = NULL,
    cancelled_at = NULL,
    updated_at = now()
WHERE t.status <> 'quarantined'
  AND (t.lease_owner IS NULL OR t.lease_expires_at < now())
RETURNING thread_id
"""

# Threads by lifecycle, bounded by what they count, not by history or the backlog
# (issue 14): done, waiting and quarantined threads (nearly all, in time) are read from
# the trigger-kept durable_thread_counts; live leases by durable_threads_leased_idx (a
# range over the live ones only); orphans (running, stopped or queued, no live lease, no
# root checkpoint) by durable_threads_unrooted_idx: only rows whose has_root is not TRUE
# are probed in checkpoints. TRUE is only ever kept while a root checkpoint exists (see
# the migration), so skipping those rows changes no count. Same kinds as before: a live
# lease is 'running' whatever the status, 'orphaned' has no checkpoint.
STATUS_COUNTS_SQL = """
WITH totals AS (
    SELECT status, sum(n)::bigint AS n FROM durable_thread_counts GROUP BY status HAVING sum(n) <> 0
), leased AS (
    -- One pass, one aggregate: no sort or hash of the live leases by status.
    SELECT count(*) FILTER (WHERE t.status = 'running') AS running,
           count(*) FILTER (WHERE t.status = 'stopped') AS stopped,
           count(*) FILTER (WHERE t.status = 'queued') AS queued,
           count(*) FILTER (WHERE t.status = 'error') AS error
    FROM durable_threads t
    WHERE t.lease_owner IS NOT NULL AND t.lease_expires_at > now()
      AND t.status IN ('running', 'stopped', 'queued', 'error')
), live AS (
    SELECT v.status, v.n FROM leased l
    CROSS JOIN LATERAL (VALUES ('running', l.running), ('stopped', l.stopped),
                               ('queued', l.queued), ('error', l.error)) AS v (status, n)
), orphans AS (
    SELECT count(*)::bigint AS n FROM durable_threads t
    WHERE t.status IN ('running', 'stopped', 'queued') AND t.has_root IS NOT TRUE
      AND NOT (t.lease_owner IS NOT NULL AND t.lease_expires_at > now())
      AND NOT EXISTS (SELECT 1 FROM checkpoints c
                      WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '')
)
SELECT totals.status, totals.n, COALESCE(live.n, 0) AS live, (SELECT n FROM orphans) AS orphans
FROM totals LEFT JOIN live ON live.status = totals.status
"""

# Fold the +1/-1 rows into one per status. Concurrent folds are safe: a row deleted
# by one is skipped by the other, and rows inserted meanwhile are left for next time.
STATUS_FOLD_SQL = """
WITH gone AS (DELETE FROM durable_thread_counts RETURNING status, n)
INSERT INTO durable_thread_counts SELECT status, sum(n) FROM gone GROUP BY status HAVING sum(n) <> 0
"""
# Fold when the table holds more rows than this (a fold costs ~its row count).
STATUS_FOLD_ROWS = 500
STATUS_ROWS_SQL = "SELECT count(*) AS n FROM (SELECT 1 FROM durable_thread_counts LIMIT %s) x"
