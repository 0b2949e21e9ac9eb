"""SQL on ``durable_threads``: the lease (acquire, fence, renew, release, abandon) and
the thread-row locks deletes take. Parameterized, unqualified (see ``sql.schema``)."""

from __future__ import annotations

# Take the lease if it is free, expired, held by a provably dead process of this
# machine (dead_owner) or handed over by a recovery worker (claim_owner AND its token,
# see saver.claim_handoff), bump the fencing token, and count one attempt for the
# checkpoint the run starts from. Poison counting: attempts_checkpoint_id is the checkpoint the
# previous run started from. The same checkpoint: one more attempt. Another one with
# status still 'running': the previous run moved on to it and died there (SIGKILL, OOM:
# no exit handler ran), so that was attempt 1 at it and this is attempt 2. Otherwise the
# previous run ended (done/waiting/stopped reset or undo; an error moved the count to
# its head itself): attempt 1. Counting here, not in every put, keeps puts write-free
# on durable_threads (an UPDATE per checkpoint cost ~20% per step). last_error belongs
# to attempts_checkpoint_id and is cleared with it. Quarantined threads are never
# taken. The conditional upsert is atomic: concurrent acquirers serialize on the row
# lock and the loser re-evaluates the WHERE on the winner's row, so at most one owner
# holds a live lease (no SELECT ... FOR UPDATE needed). prev_* report the row as it
# was, to restore it if the run never starts; kept in lease_prev_*, so a retry reports
# them too. With no checkpoint requested, the run starts from the thread's latest root
# checkpoint, looked up in the same statement: the whole acquisition is one autocommit
# statement, one round trip (issue 14).
# Owner ids are unique per run, so a row already held by this owner is this very
# acquisition, committed once already and retried by the driver because the COMMIT's
# reply was lost: then nothing is counted or bumped again (retried = true), so a lost
# acknowledgement can never push a healthy thread over max_resume_attempts.
LEASE_ACQUIRE_SQL = """
WITH prev AS (SELECT lease_owner FROM durable_threads WHERE thread_id = %(thread_id)s),
head AS (SELECT COALESCE(%(checkpoint_id)s::text,
                         (SELECT checkpoint_id FROM checkpoints
                          WHERE thread_id = %(thread_id)s AND checkpoint_ns = ''
                          ORDER BY checkpoint_id DESC LIMIT 1)) AS id)
INSERT INTO durable_threads AS t (
    thread_id, status, graph_version, lease_owner, lease_token, lease_expires_at,
    attempts, attempts_checkpoint_id, updated_at)
VALUES (%(thread_id)s, 'running', %(version)s, %(owner)s, 1,
        now() + make_interval(secs => %(ttl)s), 1, (SELECT id FROM head), now())
ON CONFLICT (thread_id) DO UPDATE SET
    status = 'running',
    graph_version = COALESCE(EXCLUDED.graph_version, t.graph_version),
    lease_owner = EXCLUDED.lease_owner,
    lease_token = CASE WHEN t.lease_owner = EXCLUDED.lease_owner THEN t.lease_token
                       ELSE t.lease_token + 1 END,
    lease_expires_at = EXCLUDED.lease_expires_at,
    attempts = CASE WHEN t.lease_owner = EXCLUDED.lease_owner THEN t.attempts
                    WHEN t.attempts_checkpoint_id IS NOT DISTINCT FROM EXCLUDED.attempts_checkpoint_id
                    THEN t.attempts + 1
                    WHEN t.status = 'running' THEN 2
                    ELSE 1 END,
    attempts_checkpoint_id = EXCLUDED.attempts_checkpoint_id,
    last_error = CASE WHEN t.lease_owner = EXCLUDED.lease_owner THEN t.last_error
                      WHEN t.attempts_checkpoint_id IS NOT DISTINCT FROM EXCLUDED.attempts_checkpoint_id
                      THEN t.last_error END,
    lease_prev_status = CASE WHEN t.lease_owner = EXCLUDED.lease_owner THEN t.lease_prev_status
                             ELSE t.status END,
    lease_prev_version = CASE WHEN t.lease_owner = EXCLUDED.lease_owner THEN t.lease_prev_version
                              ELSE t.graph_version END,
    cancelled_at = NULL,
    -- A cancel requested for a recovery worker's claim follows it into the run it hands
    -- the claim to (issue 25); any other request belongs to its own run's token only.
    cancel_token = CASE WHEN t.cancel_token = t.lease_token AND t.lease_owner = %(claim_owner)s
                             AND t.lease_token = %(claim_token)s
                        THEN t.lease_token + 1 ELSE t.cancel_token END,
    updated_at = now()
WHERE t.status <> 'quarantined'
  AND (t.lease_owner IS NULL OR t.lease_expires_at < now() OR t.lease_owner = EXCLUDED.lease_owner
       OR t.lease_owner = %(dead_owner)s
       OR (t.lease_owner = %(claim_owner)s AND t.lease_token = %(claim_token)s))
RETURNING lease_token, attempts, last_error, attempts_checkpoint_id AS checkpoint_id,
          lease_prev_status AS prev_status, lease_prev_version AS prev_version,
          COALESCE((SELECT lease_owner FROM prev) = %(owner)s, false) AS retried
"""

# A run that took the lease but never started (version mismatch, failed migration,
# load error): give the thread back as it was and do not count the attempt.
LEASE_ABANDON_SQL = """
UPDATE durable_threads SET
    status = %(status)s,
    graph_version = COALESCE(%(version)s, graph_version),
    lease_owner = NULL,
    lease_expires_at = NULL,
    attempts = GREATEST(attempts - 1, 0),
    updated_at = now()
WHERE thread_id = %(thread_id)s AND lease_token = %(token)s AND lease_owner = %(owner)s
"""

THREAD_LEASE_ROW_SQL = """
SELECT thread_id, status, graph_version, lease_owner, lease_token,
       EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS expires_in,
       attempts, attempts_checkpoint_id, last_error
FROM durable_threads WHERE thread_id = %s
"""

LATEST_CHECKPOINT_ID_SQL = """
SELECT checkpoint_id FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = '' ORDER BY checkpoint_id DESC LIMIT 1
"""

# Row lock in share mode: a takeover (UPDATE of the row) waits until this write commits,
# so a write is either before the takeover or rejected, never interleaved.
LEASE_FENCE_SQL = """
SELECT 1 AS ok FROM durable_threads
WHERE thread_id = %s AND lease_token = %s AND lease_owner = %s FOR SHARE
"""

# The same two checks raising server-side (durable_fence / durable_foreign_lease above):
# for puts sent as one implicit transaction. LGD01: lease lost; LGD02: busy.
LEASE_FENCE_RAISING_SQL = "SELECT durable_fence(%s, %s, %s) AS ok"
FOREIGN_LEASE_RAISING_SQL = "SELECT * FROM durable_foreign_lease(%s)"
FENCE_LOST_STATE = "LGD01"
FENCE_BUSY_STATE = "LGD02"

# A write made outside a leased run (update_state, tools) is refused while another
# process holds a live lease on the thread.
FOREIGN_LEASE_SQL = """
SELECT lease_owner, EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS expires_in
FROM durable_threads
WHERE thread_id = %s AND lease_owner IS NOT NULL AND lease_expires_at > now()
"""

LEASE_RENEW_SQL = """
UPDATE durable_threads AS t
SET lease_expires_at = now() + make_interval(secs => %s)
FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS l(thread_id, token, owner)
WHERE t.thread_id = l.thread_id AND t.lease_token = l.token AND t.lease_owner = l.owner
RETURNING t.thread_id, t.cancel_token IS NOT DISTINCT FROM t.lease_token AS cancel
"""

# has_root (recovery.status_counts' cache, see the migration): whether a root checkpoint
# exists, probed here (one primary-key probe) rather than taken from what the run wrote,
# which a concurrent delete may have removed since. If the row changed after this
# statement's snapshot (a delete's trigger cleared the flag and committed while this
# waited for the row lock; t.xmin is then the newer version's), the probe read the
# checkpoints before that delete: NULL (unknown, probed by status_counts) instead.
# A flag not yet TRUE is probed with a row lock (FOR KEY SHARE on one root checkpoint):
# a delete in flight whose trigger ran before this thread had a row (a stock-only thread
# deleted while a run starts on it) found nothing to lock out, so this probe must not
# read its uncommitted deletions as live; the lock waits for that delete, then skips
# the rows it removed. A TRUE flag was set before any such delete's trigger ran (a
# first release is never TRUE), so the trigger's own row lock covers it: no lock, no
# WAL record on the common release.
LEASE_RELEASE_SQL = """
UPDATE durable_threads t SET
    status = %(status)s,
    lease_owner = NULL,
    lease_expires_at = NULL,
    attempts = CASE WHEN %(reset)s THEN 0
                    WHEN %(undo)s THEN GREATEST(t.attempts - 1, 0)
                    ELSE t.attempts END,
    attempts_checkpoint_id = COALESCE(%(checkpoint_id)s, t.attempts_checkpoint_id),
    last_error = CASE WHEN %(reset)s THEN NULL ELSE COALESCE(%(error)s, t.last_error) END,
    has_root = CASE WHEN t.xmin = (SELECT s.xmin FROM durable_threads s WHERE s.thread_id = %(thread_id)s)
                    THEN CASE WHEN t.has_root
                              THEN EXISTS (SELECT 1 FROM checkpoints c
                                           WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = '')
                              ELSE EXISTS (SELECT 1 FROM checkpoints c
                                           WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''
                                           LIMIT 1 FOR KEY SHARE) END END,
    updated_at = now()
WHERE t.thread_id = %(thread_id)s AND t.lease_token = %(token)s AND t.lease_owner = %(owner)s
  AND (NOT %(async_commit)s OR set_config('synchronous_commit', 'off', true) IS NOT NULL)
"""
# async_commit (the run finished, status 'done'): this transaction commits without
# waiting for its WAL flush (set_config(..., true): this transaction only; the session
# keeps its setting). The release is visible to every other session at COMMIT as
# before, before invoke returns: another worker's acquisition never sees the finished
# run's lease, and a client crash after the return leaves nothing behind. What it gives
# up, only on a crash of the database server itself within the WAL writer's delay
# (<= 3 x wal_writer_delay, 0.6 s by default): the release, i.e. the state of a crash
# just before it (status 'running' until the lease expires, then a resume that runs
# nothing: the thread's last checkpoint, written and flushed by a synchronous put
# before the release, has no next task). The checkpoints themselves are never at risk
# (every put commits synchronously, and any later commit flushes this one too). Not
# for waiting, stopped or failed runs: a lost release there makes a resume re-run a
# node. The acquisition always waits for its flush: a lease lost to a server crash
# would let a second worker run nodes beside this run. Measured (issue 14): the flush
# was most of the run end's wall, ~0.2-0.9 ms by disk and load.


# Whole-thread deletes (delete_thread, prune(strategy="delete")) lock the thread rows
# first, after the artifact locks (the order puts take them in), creating one for a
# thread that has none (removed with the rest). A leased put in flight holds its row
# FOR SHARE: the delete waits for its commit and then deletes what it wrote; the next
# put fails its fence (LGD01: the row is gone) and a run starting waits, then finds
# nothing. Without this, a put committing between the delete's statements left a
# checkpoint whose blobs the next statement had deleted.
LOCK_THREADS_FOR_DELETE_SQL = (
    """INSERT INTO durable_threads (thread_id, status)
       SELECT t, 'done' FROM unnest(%s::text[]) AS t ORDER BY t
       ON CONFLICT (thread_id) DO NOTHING""",
    "SELECT thread_id FROM durable_threads WHERE thread_id = ANY(%s) ORDER BY thread_id FOR UPDATE",
)


# delete_for_runs' row locks (see sql.checkpoints.RUN_THREADS_SQL for the whole story).
ENSURE_THREAD_ROWS_SQL = """
INSERT INTO durable_threads (thread_id, status)
SELECT t, 'done' FROM unnest(%(threads)s::text[]) AS t ORDER BY t
ON CONFLICT (thread_id) DO NOTHING
RETURNING thread_id
"""
LOCK_THREAD_ROWS_SQL = """
SELECT thread_id, lease_owner,
       EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS expires_in,
       (lease_owner IS NOT NULL AND lease_expires_at > now()) AS leased
FROM durable_threads WHERE thread_id = ANY(%(threads)s)
ORDER BY thread_id FOR UPDATE
"""

# Thread rows made only to lock a thread (delete_for_runs, retention), removed again.
DELETE_THREAD_ROWS_SQL = "DELETE FROM durable_threads WHERE thread_id = ANY(%s)"
# A whole-thread delete (delete_thread, prune(strategy="delete"), retain) removes the
# thread rows it has just locked FOR UPDATE before the checkpoints, in the same
# transaction: the has_root trigger on checkpoints (durable_unroot) then finds no row
# to lock, check or write FALSE (issue 14: deleting the checkpoints of 10k threads took
# 1652 ms with has_root TRUE, 694 ms with it NULL, 335 ms without the trigger). Nothing
# is weakened: the row lock is taken first as before (a leased put in flight commits
# first, one arriving waits for this transaction and then finds no row), and a row that
# no longer exists claims no root. Others see the row go at COMMIT, as before.
DELETE_THREAD_ROWS_FIRST_SQL = DELETE_THREAD_ROWS_SQL

# A run that failed past the checkpoint it started from: the first failed attempt at
# the new head (sent before LEASE_RELEASE_SQL, in the same pipeline). Only a head that
# is stored: the loop's head is in memory before its put commits, and a put that fails
# every time (an unencodable value) would otherwise reset the count on every run, so
# the thread would never be quarantined (issue 23). Params: head, thread, token, owner.
ATTEMPT_AT_HEAD_SQL = (
    "UPDATE durable_threads t SET attempts = 1, attempts_checkpoint_id = h.id "
    "FROM (SELECT %s::text AS id) h "
    "WHERE t.thread_id = %s AND t.lease_token = %s AND t.lease_owner = %s "
    "AND EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = t.thread_id "
    "AND c.checkpoint_ns = '' AND c.checkpoint_id = h.id)"
)
# ... or, when the run stopped on a decision only an operator can make
# (quarantine.needs_operator), no attempt at the new head yet.
# Like ATTEMPT_AT_HEAD_SQL, only to a head that is stored.
ATTEMPT_UNCOUNTED_AT_HEAD_SQL = ATTEMPT_AT_HEAD_SQL.replace("attempts = 1,", "attempts = 0,")
assert ATTEMPT_UNCOUNTED_AT_HEAD_SQL != ATTEMPT_AT_HEAD_SQL


# --- operator modules (migrations, export): lock a thread outside a run ---------------
# Outside a run (CLI, batch): lock the thread row so no run can take the lease (and
# read the checkpoint) until this transaction commits; the lease columns say whether
# a live run holds it now.
LOCK_THREAD_LEASE_SQL = """
SELECT lease_owner, EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS expires_in
FROM durable_threads WHERE thread_id = %s FOR UPDATE
"""


# A migration (or its undo) moves the thread's recorded version with its checkpoint.
SET_THREAD_VERSION_SQL = "UPDATE durable_threads SET graph_version = %s WHERE thread_id = %s"

# A root put outside a run (update_state from another graph version, a script) moves the
# thread row's version with its new head (issue 26): the claim of a worker of some
# versions finds threads by the row's graph_version (durable_threads_claim_version_idx),
# so a row left naming the old version hid the thread from the new version's workers
# until an old-version worker walked past it. No lock unless the version differs (the
# WHERE is false otherwise); no row, no insert (a thread never run has nothing to claim).
SYNC_THREAD_VERSION_SQL = """
UPDATE durable_threads SET graph_version = %s
WHERE thread_id = %s AND graph_version IS DISTINCT FROM %s
"""



# --- dead owners outside a run (leases.dead) -------------------------------------------
# Live leases held by owners of this host (the prefix is ``<hostname>:``), for the
# dead-owner check that invoke makes at its run start (owners.owner_is_dead), made by
# the recovery workers' claim and the `threads` / console views too. Bounded and
# indexed whatever the fleet: the live leases by durable_threads_leased_idx, soonest
# expiry first, at most %(scan)s of them. A dead owner stopped renewing, so its lease
# sorts before every lease renewed since it died (renewals move expiries to now + ttl).
LOCAL_LIVE_LEASES_SQL = """
SELECT s.thread_id, s.status, s.lease_owner FROM (
    SELECT thread_id, status, lease_owner FROM durable_threads
    WHERE lease_owner IS NOT NULL AND lease_expires_at > now()
    ORDER BY lease_expires_at LIMIT %(scan)s) s
WHERE starts_with(s.lease_owner, %(prefix)s)
"""

# A write outside a run (update_state, a script) or an operator's decision (resume,
# answer, fork, delete: ops.control) that found a live lease whose owner is a provably
# dead process of this machine (judged in Python, owners.owner_is_dead, as a run start
# judges it) ends that lease at once (just before now(): the same transaction's
# "expired" tests, < now(), agree) instead of being refused as busy for the rest of
# lease_ttl. The thread is then what the lease's expiry would have left (recoverable,
# its status kept: a worker or the next invoke resumes it). Matched by owner (an owner
# id names one process, with a random part): a lease taken since, by a live run, is
# never touched.
EXPIRE_DEAD_LEASE_SQL = """
UPDATE durable_threads SET lease_expires_at = now() - interval '1 millisecond'
WHERE thread_id = %s AND lease_owner = %s AND lease_expires_at > now()
"""


# --- failover branch ---
# A finished run's release ('done', 'waiting': nothing left to run) when the run wrote
# checkpoints (issue 23): the same statement, its status set only if the run's last
# acknowledged root checkpoint (%(head)s) is on the server. Lost in a failover, the
# release raises LGD04 ('gone', the real head in the DETAIL) instead of marking the thread
# finished on an older head with work left; the run's exit then hands it back. In the SET
# list, so it is evaluated for the run's own row only (matched by token and owner); a
# CASE, so the check runs first. Its own text: never a check switched off by a NULL.
_STATUS_SET = "    status = %(status)s,\n"
assert _STATUS_SET in LEASE_RELEASE_SQL
LEASE_RELEASE_CHECKED_SQL = LEASE_RELEASE_SQL.replace(
    _STATUS_SET,
    """    status = CASE WHEN EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = %(thread_id)s
                                  AND c.checkpoint_ns = '' AND c.checkpoint_id = %(head)s)
                  THEN %(status)s
                  WHEN durable_guard_fail('gone', %(thread_id)s, NULL, '', %(head)s) THEN %(status)s END,
""",
)


# The last failure's details (issue 25), written before LEASE_RELEASE_SQL in the release
# pipeline of a run that raised, while the lease (owner and token) is still held: only
# failed runs pay this statement. A JSON document (failure.py's record), bounded there.
RECORD_FAILURE_SQL = """
UPDATE durable_threads SET last_failure = %(failure)s
WHERE thread_id = %(thread_id)s AND lease_token = %(token)s AND lease_owner = %(owner)s
"""


# --- operator decisions (issue 25, ops/control.py) -----------------------------------
# The thread as a decision sees it, locked (a run start or claim waits for the decision):
# status, the live lease, the head root checkpoint and a pending interrupt at the head.
CONTROL_THREAD_SQL = """
SELECT t.thread_id, t.status, t.graph_version, t.lease_owner, t.lease_token,
       (t.lease_owner IS NOT NULL AND t.lease_expires_at > now()) AS leased,
       EXTRACT(EPOCH FROM (t.lease_expires_at - now()))::float8 AS expires_in,
       t.answer_checkpoint_id, t.cancelled_at
FROM durable_threads t WHERE t.thread_id = %s FOR UPDATE
"""
CONTROL_HEAD_SQL = """
SELECT c.checkpoint_id, c.metadata ->> 'graph_version' AS graph_version,
       EXISTS (SELECT 1 FROM checkpoint_writes w
               WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = ''
                 AND w.checkpoint_id = c.checkpoint_id AND w.channel = '__interrupt__') AS interrupted
FROM checkpoints c
WHERE c.thread_id = %s AND c.checkpoint_ns = ''
ORDER BY c.checkpoint_id DESC LIMIT 1
"""

# A cancel request for the run holding the live lease now: tied to its fencing token, so
# a run that ends before its next step boundary leaves nothing for the next run (which
# holds another token); its puts (GUARDED_UPSERT_*_SQL's RETURNING) and renewals see it.
# The second parameter: the token the operator confirmed (NULL: whichever run holds it);
# another run's lease is left alone (rev25).
REQUEST_CANCEL_SQL = """
UPDATE durable_threads SET cancel_token = lease_token
WHERE thread_id = %s AND lease_owner IS NOT NULL AND lease_expires_at > now()
  AND lease_token = COALESCE(%s::bigint, lease_token)
RETURNING lease_token, lease_owner
"""
# Sent before LEASE_RELEASE_SQL by the release of a run that stopped on a cancel request:
# workers leave the stopped thread alone (the claim skips cancelled_at) until an operator
# resumes or queues it, or a run starts on it (LEASE_ACQUIRE_SQL clears it).
MARK_CANCELLED_SQL = """
UPDATE durable_threads SET cancelled_at = now(), cancel_token = NULL
WHERE thread_id = %s AND lease_token = %s AND lease_owner = %s
"""

# Queue an answer to a waiting thread: Command(resume=value) for the worker that claims
# it, the value as the saver's serde encodes it; only from 'waiting' with no live lease.
QUEUE_ANSWER_SQL = """
UPDATE durable_threads AS t SET
    status = 'queued',
    answer_type = %(type)s, answer_blob = %(blob)s, answer_checkpoint_id = %(checkpoint_id)s,
    cancel_token = NULL, cancelled_at = NULL,
    attempts = 0, attempts_checkpoint_id = NULL, last_error = NULL,
    updated_at = now()
WHERE t.thread_id = %(thread_id)s AND t.status = 'waiting'
  AND (t.lease_owner IS NULL OR t.lease_expires_at < now())
RETURNING thread_id
"""
# After a worker's run of a thread with a queued answer: cleared once consumed, i.e.
# the run ended on its own (done, or waiting on a next interrupt), LangGraph stored a
# resume write at the answered checkpoint, or the head moved past that checkpoint (the
# answered node's step was checkpointed). A worker SIGKILLed (or a node that failed)
# before that leaves the answer for the next claim, which runs the same command again
# at the same checkpoint: the answered step's work is not kept twice.
CLEAR_ANSWER_SQL = """
UPDATE durable_threads t SET answer_type = NULL, answer_blob = NULL, answer_checkpoint_id = NULL
WHERE t.thread_id = %(thread_id)s AND t.answer_checkpoint_id = %(checkpoint_id)s
  AND (t.status IN ('done', 'waiting')
       OR EXISTS (SELECT 1 FROM checkpoint_writes w
               WHERE w.thread_id = t.thread_id AND w.checkpoint_ns = ''
                 AND w.checkpoint_id = t.answer_checkpoint_id AND w.channel = '__resume__')
       OR (SELECT c.checkpoint_id FROM checkpoints c
           WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = ''
           ORDER BY c.checkpoint_id DESC LIMIT 1) IS DISTINCT FROM t.answer_checkpoint_id)
"""

THREAD_HAS_CHECKPOINTS_SQL = "SELECT 1 AS one FROM checkpoints WHERE thread_id = %s LIMIT 1"
# A fork's row: 'stopped' and held (cancelled_at) so no worker runs it before an
# operator resumes it (has_root left NULL: unknown, status_counts probes it). Inserted
# before the fork writes anything: no row returned, the id is taken (the fork refuses).
FORK_THREAD_INSERT_SQL = """
INSERT INTO durable_threads (thread_id, status, graph_version, cancelled_at, updated_at)
VALUES (%s, 'stopped', %s, now(), now())
ON CONFLICT (thread_id) DO NOTHING
RETURNING thread_id
"""
