"""``durable_ledger``: the SQL of ``@idempotent`` (claim, run, record), the journal and the
``Ledger`` operator API. Its owners are langgraph_durable/idempotency/ and journal.py;
delete_thread / prune reach the rows through the thread tables' SQL."""


# Claim a free key, or a key whose TTL ran out (an expired key= key counts as absent).
# RETURNING yields a row only when this statement claimed the key. A concurrent
# uncommitted claim of the same key makes this wait for that transaction (transactional
# mode relies on it; the lock_timeout bounds the wait).
LEDGER_CLAIM_SQL = """
INSERT INTO durable_ledger AS l (
    key, thread_id, origin_thread_id, checkpoint_ns, task_id, name, fingerprint,
    args_preview, status, owner, attempts, claim_expires_at, expires_at, created_at)
VALUES (
    %(key)s, %(thread_id)s, %(origin)s, %(ns)s, %(task_id)s, %(name)s, %(fp)s,
    %(preview)s, 'started', %(owner)s, 1,
    CASE WHEN %(claim_ttl)s::float8 IS NULL THEN NULL
         ELSE now() + make_interval(secs => %(claim_ttl)s::float8) END,
    CASE WHEN %(ttl)s::float8 IS NULL THEN NULL
         ELSE now() + make_interval(secs => %(ttl)s::float8) END,
    now())
ON CONFLICT (key) DO UPDATE SET
    thread_id = EXCLUDED.thread_id, origin_thread_id = EXCLUDED.origin_thread_id,
    checkpoint_ns = EXCLUDED.checkpoint_ns, task_id = EXCLUDED.task_id,
    name = EXCLUDED.name, fingerprint = EXCLUDED.fingerprint,
    args_preview = EXCLUDED.args_preview, status = 'started', owner = EXCLUDED.owner,
    attempts = 1, claim_expires_at = EXCLUDED.claim_expires_at,
    expires_at = EXCLUDED.expires_at, created_at = now(), completed_at = NULL,
    result_type = NULL, result = NULL, error_type = NULL, error = NULL
WHERE l.expires_at IS NOT NULL AND l.expires_at <= now()
RETURNING key
"""

_ROW_COLUMNS = """
    key, status, name, fingerprint, thread_id, origin_thread_id, checkpoint_ns, task_id,
    owner, attempts, result_type, result, error_type, error, args_preview,
    created_at, completed_at, expires_at,
    (status = 'started' AND claim_expires_at IS NOT NULL AND claim_expires_at > now()) AS live,
    (expires_at IS NOT NULL AND expires_at <= now()) AS expired
"""

# Concatenation of constants only (no value is ever formatted into SQL).
LEDGER_READ_SQL = "SELECT " + _ROW_COLUMNS + " FROM durable_ledger WHERE key = %s"  # noqa: S608
# A journal record under the keys older fingerprint forms give (digest27), read beside
# LEDGER_READ_SQL in the same round trip.
LEDGER_READ_ANY_SQL = "SELECT " + _ROW_COLUMNS + " FROM durable_ledger WHERE key = ANY(%s)"  # noqa: S608

LEDGER_LIST_SQL = (
    "SELECT " + _ROW_COLUMNS + " FROM durable_ledger "  # noqa: S608
    "WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s OR origin_thread_id = %(thread_id)s) "
    "AND (%(status)s::text IS NULL OR status = %(status)s) "
    "ORDER BY created_at DESC, key LIMIT %(limit)s"
)

# on_unknown="retry": take over a dead claim. The owner check makes two takers race
# safely: the second one's UPDATE matches nothing once the first committed. owner_dead:
# the caller judged old_owner a dead process of this machine (owners.owner_is_dead), so
# its claim is dead before its claim lease runs out.
LEDGER_TAKEOVER_SQL = """
UPDATE durable_ledger SET owner = %(owner)s, attempts = attempts + 1,
    claim_expires_at = CASE WHEN %(claim_ttl)s::float8 IS NULL THEN NULL
                            ELSE now() + make_interval(secs => %(claim_ttl)s::float8) END
WHERE key = %(key)s AND status = 'started' AND owner IS NOT DISTINCT FROM %(old_owner)s
  AND (claim_expires_at IS NULL OR claim_expires_at <= now() OR %(owner_dead)s)
RETURNING attempts
"""

LEDGER_COMPLETE_SQL = """
UPDATE durable_ledger SET status = 'completed', result_type = %s, result = %s,
    completed_at = now(), claim_expires_at = NULL
WHERE key = %s AND owner = %s AND status = 'started'
RETURNING key
"""

LEDGER_FAIL_SQL = """
UPDATE durable_ledger SET status = 'failed', error_type = %s, error = %s,
    completed_at = now(), claim_expires_at = NULL
WHERE key = %s AND owner = %s AND status = 'started'
RETURNING key
"""

# An exception means "no effect" by the function's contract: drop the claim so the
# next attempt runs the function again.
LEDGER_RELEASE_SQL = "DELETE FROM durable_ledger WHERE key = %s AND owner = %s AND status = 'started'"

# Cancelled or interrupted mid-call: the effect may have happened. Expire the claim now
# so the next caller sees an unknown outcome at once instead of waiting for the lease.
LEDGER_ABANDON_SQL = """
UPDATE durable_ledger SET claim_expires_at = now()
WHERE key = %s AND owner = %s AND status = 'started'
"""

LEDGER_RENEW_SQL = """
UPDATE durable_ledger AS d
SET claim_expires_at = now() + make_interval(secs => c.ttl)
FROM unnest(%s::text[], %s::text[], %s::float8[]) AS c(key, owner, ttl)
WHERE d.key = c.key AND d.owner = c.owner AND d.status = 'started'
RETURNING d.key
"""

# The operator's answers refuse a call in flight: a live claim lease, unless the
# operator's process judged its owner dead (the last parameter: that owner, see
# Ledger._op_change), so an answer is taken as soon as the resume raised
# OutcomeUnknownError, not once the dead caller's claim lease ran out.
LEDGER_RESOLVE_SQL = """
UPDATE durable_ledger SET status = 'completed', result_type = %s, result = %s,
    error_type = NULL, error = NULL, completed_at = now(), claim_expires_at = NULL,
    owner = 'operator'
WHERE key = %s AND status <> 'completed'
  AND NOT (status = 'started' AND claim_expires_at IS NOT NULL AND claim_expires_at > now()
           AND owner IS DISTINCT FROM %s)
RETURNING key
"""

LEDGER_FORGET_SQL = """
DELETE FROM durable_ledger WHERE key = %s
  AND NOT (status = 'started' AND claim_expires_at IS NOT NULL AND claim_expires_at > now()
           AND owner IS DISTINCT FROM %s)
RETURNING key
"""

# Is the checkpoint a task was prepared from stored yet? (Checkpoint ids are uuid6, so
# the thread and the id are enough; the namespace differs for subgraphs.)
LEDGER_CHECKPOINT_STORED_SQL = """
SELECT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s) AS ok
"""
# While waiting for it: does the run still hold its lease? (delete_thread or a takeover
# fenced it: the checkpoint will never be stored, so stop at once, not after wait_timeout)
LEDGER_LEASE_HELD_SQL = """
SELECT EXISTS (SELECT 1 FROM durable_threads
               WHERE thread_id = %s AND lease_token = %s AND lease_owner = %s) AS held
"""

# A tool call recorded under the key scheme before task ids were part of tool keys
# (thread + tool_call_id only). It is the same call only if the same task made it: the
# row keeps the task id of its first claim (derived keys never expire, so LEDGER_CLAIM_SQL
# never overwrites it), and a later turn reusing the tool_call_id runs another task.
LEDGER_LEGACY_TOOL_KEY_SQL = """
SELECT key FROM durable_ledger WHERE key = %s AND thread_id IS NOT DISTINCT FROM %s AND task_id = %s
"""

# Expired key= entries, never a claim still in flight: one predicate for the ledger's
# own purge and retention's count (dry run) and purge (sql/retention.py).
EXPIRED_LEDGER_KEYS = """
FROM durable_ledger WHERE expires_at IS NOT NULL AND expires_at <= now()
  AND NOT (status = 'started' AND claim_expires_at IS NOT NULL AND claim_expires_at > now())
"""
LEDGER_PURGE_EXPIRED_SQL = "DELETE " + EXPIRED_LEDGER_KEYS



# Record a result; a key recorded meanwhile (another execution of the same task) keeps
# its first record, which the READ in the same round trip returns to both. An expired
# key (a journal entry nested in a key= call with a ttl) counts as absent.
JOURNAL_RECORD_SQL = """
INSERT INTO durable_ledger AS l (
    key, thread_id, origin_thread_id, checkpoint_ns, task_id, name, fingerprint,
    args_preview, status, owner, attempts, result_type, result, expires_at, created_at,
    completed_at)
VALUES (
    %(key)s, %(thread_id)s, %(origin)s, %(ns)s, %(task_id)s, %(name)s, %(fp)s,
    %(preview)s, 'completed', %(owner)s, 1, %(result_type)s, %(result)s,
    CASE WHEN %(ttl)s::float8 IS NULL THEN NULL
         ELSE now() + make_interval(secs => %(ttl)s::float8) END,
    now(), now())
ON CONFLICT (key) DO UPDATE SET
    thread_id = EXCLUDED.thread_id, origin_thread_id = EXCLUDED.origin_thread_id,
    checkpoint_ns = EXCLUDED.checkpoint_ns, task_id = EXCLUDED.task_id,
    name = EXCLUDED.name, fingerprint = EXCLUDED.fingerprint,
    args_preview = EXCLUDED.args_preview, status = 'completed', owner = EXCLUDED.owner,
    attempts = 1, claim_expires_at = NULL, result_type = EXCLUDED.result_type,
    result = EXCLUDED.result, error_type = NULL, error = NULL,
    expires_at = EXCLUDED.expires_at, created_at = now(), completed_at = now()
WHERE l.expires_at IS NOT NULL AND l.expires_at <= now()
"""

# --- journal: answers of a node attempt that raised (journal.py) ------------------------
# Did the last run of this task raise? LangGraph stores a raised task's exception as its
# ``__error__`` write (idx -1, upserted: a new failure rewrites the row, so its xmin is
# the transaction of the latest failure). It raised *after* the journal's newest record
# of the task when no journal row of the task is younger than that write: then the
# records are answers the failed run got, and are superseded. A journal row younger
# than the write was recorded by a later run (one that crashed, or stopped at an
# interrupt): it stands. Transaction ids are compared as a signed 32-bit difference,
# which is right whatever their age as long as the two are < 2^31 transactions apart.
JOURNAL_TASK_FAILED_SQL = """
SELECT EXISTS (
    SELECT 1 FROM checkpoint_writes e
    WHERE e.thread_id = %(thread_id)s AND e.checkpoint_ns = %(graph_ns)s
      AND e.checkpoint_id = %(checkpoint_id)s AND e.task_id = %(task_id)s
      AND e.idx = -1 AND e.channel = '__error__'
      AND NOT EXISTS (
          SELECT 1 FROM durable_ledger l
          WHERE l.thread_id = %(thread_id)s AND l.task_id = %(task_id)s AND l.key LIKE 'llm:%%'
            AND (l.xmin::text::bigint - e.xmin::text::bigint + 6442450944) %% 4294967296 > 2147483648)
) AS failed
"""

# Supersede the journal records of a task before an attempt that follows a failed one
# looks anything up: delete the task's journal rows that this attempt did not record
# itself (its owners end in '#<attempt tag>'), except those recorded before the task's
# latest durable effect (an @idempotent or tool call claimed or completed after them may
# depend on them: they are kept, so the effect and the answers it saw stay consistent).
# A claim still in flight is not such an effect: the failed attempt released or
# abandoned its own, so a live one is this attempt's (the @idempotent call a nested
# journaled call runs in). Returns what was superseded and kept, and the pinning effect.
JOURNAL_SUPERSEDE_SQL = """
WITH pin AS (
    SELECT e.key, e.name, GREATEST(e.created_at, e.completed_at) AS at
    FROM durable_ledger e
    WHERE e.thread_id = %(thread_id)s AND e.task_id = %(task_id)s AND e.key NOT LIKE 'llm:%%'
      AND NOT (e.status = 'started' AND e.claim_expires_at IS NOT NULL AND e.claim_expires_at > now())
    ORDER BY 3 DESC LIMIT 1
), gone AS (
    DELETE FROM durable_ledger l
    WHERE l.thread_id = %(thread_id)s AND l.task_id = %(task_id)s AND l.key LIKE 'llm:%%'
      AND l.status = 'completed' AND l.owner NOT LIKE %(mine)s
      AND l.created_at > COALESCE((SELECT at FROM pin), '-infinity'::timestamptz)
    RETURNING l.key
)
SELECT (SELECT count(*) FROM gone) AS superseded,
       (SELECT count(*) FROM durable_ledger k
        WHERE k.thread_id = %(thread_id)s AND k.task_id = %(task_id)s AND k.key LIKE 'llm:%%'
          AND k.status = 'completed' AND k.owner NOT LIKE %(mine)s
          AND k.created_at <= (SELECT at FROM pin)) AS kept,
       (SELECT name FROM pin) AS pin_name, (SELECT key FROM pin) AS pin_key
"""
