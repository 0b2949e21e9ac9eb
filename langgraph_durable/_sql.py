"""SQL of this package: its own migrations and statements.

Every statement is unqualified: the saver points ``search_path`` at the configured
schema on each connection it uses, so the stock saver's SQL (reused verbatim from
``langgraph.checkpoint.postgres.base``) and ours address the same tables. Values are
always bound parameters; the only identifier ever interpolated is the schema name,
validated and quoted with ``psycopg.sql.Identifier``.
"""

from __future__ import annotations

import re

from psycopg import sql

from langgraph_durable.errors import InvalidIdentifierError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

# Advisory-lock key serializing setup() across processes ("lgdurable" in ASCII, folded).
SETUP_LOCK_KEY = 0x6C6764757261626C


def validate_schema(name: str | None) -> str | None:
    """Return ``name`` if it is a safe identifier, else raise ``InvalidIdentifierError``."""
    if name is None:
        return None
    if not isinstance(name, str) or not _IDENT.match(name) or name.lower().startswith("pg_"):
        raise InvalidIdentifierError(name)
    return name


def set_search_path(schema: str) -> sql.Composed:
    return sql.SQL("SET search_path TO {}").format(sql.Identifier(schema))


def create_schema(schema: str) -> sql.Composed:
    return sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))


# Our migrations, recorded in durable_migrations (the stock ones keep their own table).
# The position in the list is the version; never edit an applied entry, append.
MIGRATIONS: list[str] = [
    """CREATE TABLE IF NOT EXISTS durable_migrations (
        v INTEGER PRIMARY KEY,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    # One row per thread: lifecycle status, lease (owner, token, expiry), the resume
    # attempt counter of poison detection, and the graph version of the latest run.
    """CREATE TABLE IF NOT EXISTS durable_threads (
        thread_id TEXT PRIMARY KEY,
        status TEXT NOT NULL DEFAULT 'running',
        graph_version TEXT,
        lease_owner TEXT,
        lease_token BIGINT NOT NULL DEFAULT 0,
        lease_expires_at TIMESTAMPTZ,
        attempts INTEGER NOT NULL DEFAULT 0,
        attempts_checkpoint_id TEXT,
        last_error TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    "CREATE INDEX IF NOT EXISTS durable_threads_status_idx ON durable_threads (status, lease_expires_at)",
    """CREATE TABLE IF NOT EXISTS durable_quarantine (
        thread_id TEXT PRIMARY KEY,
        checkpoint_ns TEXT NOT NULL DEFAULT '',
        checkpoint_id TEXT,
        attempts INTEGER NOT NULL,
        last_error TEXT,
        graph_version TEXT,
        quarantined_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    # Content-addressed artifacts: digest = sha256 of the uncompressed content.
    """CREATE TABLE IF NOT EXISTS durable_artifacts (
        digest BYTEA PRIMARY KEY,
        size INTEGER NOT NULL,
        data BYTEA NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        last_used_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    # Which threads reference which artifacts: GC deletes artifacts no thread refers to.
    """CREATE TABLE IF NOT EXISTS durable_artifact_refs (
        thread_id TEXT NOT NULL,
        digest BYTEA NOT NULL,
        PRIMARY KEY (thread_id, digest)
    )""",
    "CREATE INDEX IF NOT EXISTS durable_artifact_refs_digest_idx ON durable_artifact_refs (digest)",
    # The idempotency ledger of @idempotent calls.
    """CREATE TABLE IF NOT EXISTS durable_ledger (
        key TEXT PRIMARY KEY,
        thread_id TEXT,
        checkpoint_ns TEXT,
        task_id TEXT,
        fingerprint TEXT NOT NULL,
        status TEXT NOT NULL,
        owner TEXT,
        result_type TEXT,
        result BYTEA,
        error TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        completed_at TIMESTAMPTZ,
        expires_at TIMESTAMPTZ
    )""",
    "CREATE INDEX IF NOT EXISTS durable_ledger_thread_idx ON durable_ledger (thread_id)",
    # Stock tables gain an index used by retention and the CLI (latest activity).
    "CREATE INDEX IF NOT EXISTS durable_checkpoints_thread_cp_idx ON checkpoints (thread_id, checkpoint_ns, checkpoint_id DESC)",
    "CREATE INDEX IF NOT EXISTS durable_checkpoints_run_id_idx ON checkpoints ((metadata ->> 'run_id'))",
    # Why a thread was quarantined: 'max_attempts' (crash/error loop) or 'load_error'
    # (undecodable checkpoint); they call for different operator actions.
    "ALTER TABLE durable_quarantine ADD COLUMN IF NOT EXISTS reason TEXT NOT NULL DEFAULT 'max_attempts'",
    # @idempotent (idempotency.py): what an operator needs to judge an unknown outcome
    # (which function, which arguments, how many attempts), the claim's own lease (live:
    # in flight; expired: the outcome is unknown), and the thread a key= key was first
    # used in (key= keys outlive their thread, so their thread_id stays NULL and
    # delete_thread leaves them to their TTL).
    """ALTER TABLE durable_ledger
        ADD COLUMN IF NOT EXISTS name TEXT,
        ADD COLUMN IF NOT EXISTS args_preview TEXT,
        ADD COLUMN IF NOT EXISTS attempts INTEGER NOT NULL DEFAULT 1,
        ADD COLUMN IF NOT EXISTS claim_expires_at TIMESTAMPTZ,
        ADD COLUMN IF NOT EXISTS error_type TEXT,
        ADD COLUMN IF NOT EXISTS origin_thread_id TEXT""",
    "CREATE INDEX IF NOT EXISTS durable_ledger_expires_idx ON durable_ledger (expires_at) WHERE expires_at IS NOT NULL",
    # Artifacts (issue #5): a reference row can only point at a stored artifact, so GC
    # can never delete an artifact a committed reference names (its DELETE fails), and
    # a put that reuses an artifact GC just removed fails loudly and is retried with
    # the data. NOT VALID: rows written before this migration are not re-checked.
    """DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conname = 'durable_artifact_refs_digest_fk'
                         AND conrelid = 'durable_artifact_refs'::regclass) THEN
            ALTER TABLE durable_artifact_refs ADD CONSTRAINT durable_artifact_refs_digest_fk
                FOREIGN KEY (digest) REFERENCES durable_artifacts (digest) NOT VALID;
        END IF;
    END $$""",
    # The primary key (thread_id, checkpoint_ns, checkpoint_id) already serves "latest
    # checkpoint of a thread" (a backward index scan); the copy cost one more index
    # insert per checkpoint and ~7% of the chat benchmark's bytes.
    "DROP INDEX IF EXISTS durable_checkpoints_thread_cp_idx",
    # Graph-version migrations (versioning.py): the rows a migration replaced, copied
    # in its own transaction, so an operator can audit and undo it.
    """CREATE TABLE IF NOT EXISTS durable_migration_log (
        id BIGSERIAL PRIMARY KEY,
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL DEFAULT '',
        checkpoint_id TEXT NOT NULL,
        from_version TEXT,
        to_version TEXT NOT NULL,
        steps JSONB NOT NULL,
        origin TEXT NOT NULL,
        old_checkpoint JSONB NOT NULL,
        old_metadata JSONB NOT NULL,
        old_writes JSONB NOT NULL,
        old_blobs JSONB NOT NULL,
        migrated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        undone_at TIMESTAMPTZ
    )""",
    "CREATE INDEX IF NOT EXISTS durable_migration_log_thread_idx ON durable_migration_log (thread_id, id)",
    # Server-side fences for puts sent as one implicit transaction (_io._implicit): the
    # check must abort the transaction itself, as the Python-side check of FENCE_SQL's
    # rows would come after the commit. Same predicates and row lock as FENCE_SQL /
    # FOREIGN_LEASE_SQL; SQLSTATE LGD01 = lease lost, LGD02 = leased by someone else
    # (DETAIL: JSON owner / expires_in). Tables resolve through the caller's search_path.
    """CREATE OR REPLACE FUNCTION durable_fence(p_thread text, p_token bigint, p_owner text)
    RETURNS integer LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM durable_threads
        WHERE thread_id = p_thread AND lease_token = p_token AND lease_owner = p_owner
        FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD01',
                MESSAGE = format('lease on thread %s (token %s) was lost', p_thread, p_token);
        END IF;
        RETURN 1;
    END $$""",
    """CREATE OR REPLACE FUNCTION durable_foreign_lease(p_thread text)
    RETURNS SETOF integer LANGUAGE plpgsql AS $$
    DECLARE
        v_owner text;
        v_expires float8;
    BEGIN
        SELECT t.lease_owner, EXTRACT(EPOCH FROM (t.lease_expires_at - now()))::float8
        INTO v_owner, v_expires
        FROM durable_threads t
        WHERE t.thread_id = p_thread AND t.lease_owner IS NOT NULL AND t.lease_expires_at > now();
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD02',
                MESSAGE = format('thread %s is being run by %s', p_thread, v_owner),
                DETAIL = json_build_object('owner', v_owner, 'expires_in', v_expires)::text;
        END IF;
    END $$""",
    # Storage (issue #5, measured with bench/bench_storage.py). Reference rows: the
    # primary key leads with the digest (it serves the foreign-key check of an artifact
    # delete and GC's "still referenced?" probe, as the digest index did), and thread_id
    # gets a plain index, which btree deduplication keeps to a few bytes per thread
    # instead of one ~50-byte entry per (thread, digest) pair: one index fewer.
    """DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conname = 'durable_artifact_refs_digest_pkey'
                         AND conrelid = 'durable_artifact_refs'::regclass) THEN
            ALTER TABLE durable_artifact_refs DROP CONSTRAINT IF EXISTS durable_artifact_refs_pkey;
            ALTER TABLE durable_artifact_refs ADD CONSTRAINT durable_artifact_refs_digest_pkey
                PRIMARY KEY (digest, thread_id);
        END IF;
    END $$""",
    "CREATE INDEX IF NOT EXISTS durable_artifact_refs_thread_idx ON durable_artifact_refs (thread_id)",
    "DROP INDEX IF EXISTS durable_artifact_refs_digest_idx",
    # delete_for_runs' index only needs checkpoints that name a run: a partial index
    # (the planner proves `metadata ->> 'run_id' = ANY(...)` implies NOT NULL) stays
    # empty for graphs invoked without a run_id instead of holding one entry per row.
    """CREATE INDEX IF NOT EXISTS durable_checkpoints_run_idx ON checkpoints ((metadata ->> 'run_id'))
        WHERE (metadata ->> 'run_id') IS NOT NULL""",
    "DROP INDEX IF EXISTS durable_checkpoints_run_id_idx",
    # Graph versions (compat.py): each version's topology (the JSON its fingerprint
    # hashes, plus declared value types), written once per version at run start, so a
    # version mismatch can be classified identical / compatible / incompatible.
    # ``ambiguous``: the version name was stamped by graphs of different topologies.
    """CREATE TABLE IF NOT EXISTS durable_graph_versions (
        version TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        topology JSONB NOT NULL,
        ambiguous BOOLEAN NOT NULL DEFAULT false,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    # Checkpoint order (issue 11, clock skew): checkpoint ids are uuid6 from the writer's
    # clock and "latest" is the greatest id, so a writer whose clock is behind the head's
    # writer would add checkpoints that sort before the head: the next load would resume
    # from the old head and run its steps (and their effects) again. A put whose id
    # sorts before the head of its thread and namespace, and is not a re-put of a stored
    # checkpoint, is refused (SQLSTATE LGD03, DETAIL: JSON head). One backward index
    # probe on the primary key, inside the put's pipeline.
    """CREATE OR REPLACE FUNCTION durable_checkpoint_order(p_thread text, p_ns text, p_id text)
    RETURNS integer LANGUAGE plpgsql AS $$
    DECLARE
        v_head text;
    BEGIN
        SELECT checkpoint_id INTO v_head FROM checkpoints
        WHERE thread_id = p_thread AND checkpoint_ns = p_ns
        ORDER BY checkpoint_id DESC LIMIT 1;
        IF v_head > p_id AND NOT EXISTS (
            SELECT 1 FROM checkpoints
            WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD03',
                MESSAGE = format('checkpoint %s of thread %s would sort before its head %s',
                                 p_id, p_thread, v_head),
                DETAIL = json_build_object('head', v_head)::text;
        END IF;
        RETURN 1;
    END $$""",
    # Artifacts are zstd output already: the default EXTENDED storage made pglz try (and
    # fail) to compress every large one again, ~390 ms per 40 MB (issue 14). EXTERNAL:
    # out of line, uncompressed. Existing rows keep their form; setting it twice is a no-op.
    "ALTER TABLE durable_artifacts ALTER COLUMN data SET STORAGE EXTERNAL",
    # The workers' ready queue (recovery.CLAIM_SQL, issue 14): only the threads a claim
    # may take, in claim order, so a poll walks from the oldest claimable thread and
    # stops at the first it can take instead of sorting every candidate. Done, waiting
    # and quarantined threads (nearly all of them, in time) are not in it.
    """CREATE INDEX IF NOT EXISTS durable_threads_ready_idx ON durable_threads (updated_at)
        WHERE status IN ('running', 'stopped', 'queued', 'error')""",
    # Threads per status, maintained by triggers (recovery.status_counts, issue 14: the
    # count scanned every thread, 117 ms at 100k). Append-only +1/-1 rows, no upsert:
    # concurrent runs never wait for (or deadlock on) a shared counter row; readers sum
    # them and fold them into one row per status now and then (STATUS_FOLD_SQL). Created
    # and filled in one transaction, durable_threads locked against writes meanwhile.
    """DO $$ BEGIN
        IF to_regclass('durable_thread_counts') IS NULL THEN
            CREATE TABLE durable_thread_counts (status TEXT NOT NULL, n BIGINT NOT NULL);
            CREATE OR REPLACE FUNCTION durable_thread_counts_row() RETURNS trigger
            LANGUAGE plpgsql SET search_path FROM CURRENT AS $f$
            BEGIN
                IF TG_OP <> 'INSERT' THEN
                    INSERT INTO durable_thread_counts VALUES (OLD.status, -1);
                END IF;
                IF TG_OP <> 'DELETE' THEN
                    INSERT INTO durable_thread_counts VALUES (NEW.status, 1);
                END IF;
                RETURN NULL;
            END $f$;
            CREATE OR REPLACE FUNCTION durable_thread_counts_truncate() RETURNS trigger
            LANGUAGE plpgsql SET search_path FROM CURRENT AS $f$
            BEGIN
                DELETE FROM durable_thread_counts;
                RETURN NULL;
            END $f$;
            LOCK TABLE durable_threads IN SHARE ROW EXCLUSIVE MODE;
            CREATE TRIGGER durable_thread_counts_ins_del AFTER INSERT OR DELETE ON durable_threads
                FOR EACH ROW EXECUTE FUNCTION durable_thread_counts_row();
            CREATE TRIGGER durable_thread_counts_upd AFTER UPDATE OF status ON durable_threads
                FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
                EXECUTE FUNCTION durable_thread_counts_row();
            CREATE TRIGGER durable_thread_counts_trunc AFTER TRUNCATE ON durable_threads
                FOR EACH STATEMENT EXECUTE FUNCTION durable_thread_counts_truncate();
            INSERT INTO durable_thread_counts SELECT status, count(*) FROM durable_threads GROUP BY status;
        END IF;
    END $$""",
    # Issue 14 (writes at the floor): the fence (or, outside a run, the foreign-lease
    # check) and the order check of a write, folded into the write's own statement
    # (GUARDED_* below: ``INSERT ... SELECT ... WHERE durable_put_guard(...)``), so a
    # leased put costs the stock saver's statements and round trips. Same predicates,
    # row lock and SQLSTATEs as durable_fence / durable_foreign_lease /
    # durable_checkpoint_order (inlined: a nested plpgsql call costs ~10 us each).
    # p_owner NULL and p_foreign false: no lease check; p_id NULL: no order check.
    """CREATE OR REPLACE FUNCTION durable_put_guard(
        p_thread text, p_token bigint, p_owner text, p_foreign boolean, p_ns text, p_id text)
    RETURNS boolean LANGUAGE plpgsql AS $$
    DECLARE
        v_owner text;
        v_expires float8;
        v_head text;
    BEGIN
        IF p_owner IS NOT NULL THEN
            PERFORM 1 FROM durable_threads
            WHERE thread_id = p_thread AND lease_token = p_token AND lease_owner = p_owner
            FOR SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'LGD01',
                    MESSAGE = format('lease on thread %s (token %s) was lost', p_thread, p_token);
            END IF;
        ELSIF p_foreign THEN
            SELECT t.lease_owner, EXTRACT(EPOCH FROM (t.lease_expires_at - now()))::float8
            INTO v_owner, v_expires
            FROM durable_threads t
            WHERE t.thread_id = p_thread AND t.lease_owner IS NOT NULL AND t.lease_expires_at > now();
            IF FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'LGD02',
                    MESSAGE = format('thread %s is being run by %s', p_thread, v_owner),
                    DETAIL = json_build_object('owner', v_owner, 'expires_in', v_expires)::text;
            END IF;
        END IF;
        IF p_id IS NOT NULL THEN
            SELECT checkpoint_id INTO v_head FROM checkpoints
            WHERE thread_id = p_thread AND checkpoint_ns = p_ns
            ORDER BY checkpoint_id DESC LIMIT 1;
            IF v_head > p_id AND NOT EXISTS (
                SELECT 1 FROM checkpoints
                WHERE thread_id = p_thread AND checkpoint_ns = p_ns AND checkpoint_id = p_id) THEN
                RAISE EXCEPTION USING ERRCODE = 'LGD03',
                    MESSAGE = format('checkpoint %s of thread %s would sort before its head %s',
                                     p_id, p_thread, v_head),
                    DETAIL = json_build_object('head', v_head)::text;
            END IF;
        END IF;
        RETURN true;
    END $$""",
    # Issue 14 (one round trip per run start): the thread's state before the current
    # lease, kept in the row by ACQUIRE_SQL, so an acquisition sent as one autocommit
    # statement whose reply was lost still knows, when retried, what to give back if
    # the run never starts (ABANDON_SQL). Before, an op memo filled between the
    # statement and its COMMIT did that, at the price of BEGIN/COMMIT round trips.
    """ALTER TABLE durable_threads
        ADD COLUMN IF NOT EXISTS lease_prev_status TEXT,
        ADD COLUMN IF NOT EXISTS lease_prev_version TEXT""",
    # Issue 17 (operator console): the audit trail of operator actions, from the
    # console, the CLI and the Python API (langgraph_durable/audit.py writes it).
    """CREATE TABLE IF NOT EXISTS durable_audit (
        id BIGSERIAL PRIMARY KEY,
        event_id UUID NOT NULL UNIQUE,
        at TIMESTAMPTZ NOT NULL DEFAULT now(),
        actor TEXT NOT NULL,
        via TEXT NOT NULL,
        action TEXT NOT NULL,
        thread_id TEXT,
        before_id TEXT,
        after_id TEXT,
        detail JSONB NOT NULL DEFAULT '{}'::jsonb
    )""",
    "CREATE INDEX IF NOT EXISTS durable_audit_thread_idx ON durable_audit (thread_id, id)",
]

# --- leases / lifecycle --------------------------------------------------------------

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
ACQUIRE_SQL = """
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
ABANDON_SQL = """
UPDATE durable_threads SET
    status = %(status)s,
    graph_version = COALESCE(%(version)s, graph_version),
    lease_owner = NULL,
    lease_expires_at = NULL,
    attempts = GREATEST(attempts - 1, 0),
    updated_at = now()
WHERE thread_id = %(thread_id)s AND lease_token = %(token)s AND lease_owner = %(owner)s
"""

THREAD_ROW_SQL = """
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
FENCE_SQL = """
SELECT 1 AS ok FROM durable_threads
WHERE thread_id = %s AND lease_token = %s AND lease_owner = %s FOR SHARE
"""

# The same two checks raising server-side (durable_fence / durable_foreign_lease above):
# for puts sent as one implicit transaction. LGD01: lease lost; LGD02: busy.
FENCE_RAISING_SQL = "SELECT durable_fence(%s, %s, %s) AS ok"
FOREIGN_LEASE_RAISING_SQL = "SELECT * FROM durable_foreign_lease(%s)"
FENCE_LOST_STATE = "LGD01"
FENCE_BUSY_STATE = "LGD02"
# A put's checkpoint id would sort before its thread's head (the order check, inlined in
# durable_put_guard; durable_checkpoint_order is the older stand-alone function).
ORDER_SKEW_STATE = "LGD03"

# A put's checkpoint upsert and the first row of a put_writes with their guard
# (durable_put_guard: fence or foreign-lease check, order check) folded in: the guard
# runs before the row is inserted, so a failing guard aborts the write's implicit
# transaction and a passing one holds the thread row FOR SHARE before the row's own
# lock (the order delete_thread and migrations take them in). Same columns and ON
# CONFLICT actions as the stock UPSERT_CHECKPOINTS_SQL / UPSERT_CHECKPOINT_WRITES_SQL
# / INSERT_CHECKPOINT_WRITES_SQL. Guard parameters last: thread, token, owner,
# foreign, ns, id (see durable_put_guard).
GUARDED_UPSERT_CHECKPOINT_SQL = """
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
SELECT %s::text, %s::text, %s::text, %s::text, %s::jsonb, %s::jsonb
WHERE durable_put_guard(%s, %s::bigint, %s, %s, %s, %s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
"""
# The same for a put with no graph version known (update_state from a script): the
# checkpoint inherits its parent's version (what versioning.INHERIT_VERSION_SQL did as
# a separate statement). Extra parameters after the metadata: thread, ns, parent.
GUARDED_UPSERT_CHECKPOINT_INHERIT_SQL = """
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
SELECT %s::text, %s::text, %s::text, %s::text, %s::jsonb,
       %s::jsonb || COALESCE((SELECT jsonb_build_object('graph_version', p.metadata -> 'graph_version')
                              FROM checkpoints p
                              WHERE p.thread_id = %s AND p.checkpoint_ns = %s AND p.checkpoint_id = %s
                                AND p.metadata ? 'graph_version'), '{}'::jsonb)
WHERE durable_put_guard(%s, %s::bigint, %s, %s, %s, %s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
"""
GUARDED_UPSERT_WRITE_SQL = """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %s::text, %s::text, %s::text, %s::text, %s::text, %s::integer, %s::text, %s::text, %s::bytea
WHERE durable_put_guard(%s, %s::bigint, %s, %s, %s, %s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob
"""
GUARDED_INSERT_WRITE_SQL = """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %s::text, %s::text, %s::text, %s::text, %s::text, %s::integer, %s::text, %s::text, %s::bytea
WHERE durable_put_guard(%s, %s::bigint, %s, %s, %s, %s)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
"""

# A write made outside a leased run (update_state, tools) is refused while another
# process holds a live lease on the thread.
FOREIGN_LEASE_SQL = """
SELECT lease_owner, EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS expires_in
FROM durable_threads
WHERE thread_id = %s AND lease_owner IS NOT NULL AND lease_expires_at > now()
"""

RENEW_SQL = """
UPDATE durable_threads AS t
SET lease_expires_at = now() + make_interval(secs => %s)
FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS l(thread_id, token, owner)
WHERE t.thread_id = l.thread_id AND t.lease_token = l.token AND t.lease_owner = l.owner
RETURNING t.thread_id
"""

RELEASE_SQL = """
UPDATE durable_threads SET
    status = %(status)s,
    lease_owner = NULL,
    lease_expires_at = NULL,
    attempts = CASE WHEN %(reset)s THEN 0
                    WHEN %(undo)s THEN GREATEST(attempts - 1, 0)
                    ELSE attempts END,
    attempts_checkpoint_id = COALESCE(%(checkpoint_id)s, attempts_checkpoint_id),
    last_error = CASE WHEN %(reset)s THEN NULL ELSE COALESCE(%(error)s, last_error) END,
    updated_at = now()
WHERE thread_id = %(thread_id)s AND lease_token = %(token)s AND lease_owner = %(owner)s
"""

# Quarantine a thread: status, lease dropped and the counter set to the failed attempts
# (the refused start is not one) in durable_threads, the operator's record in
# durable_quarantine, in one statement. Retention and recovery skip status 'quarantined'.
QUARANTINE_SQL = """
WITH t AS (
    UPDATE durable_threads SET status = 'quarantined', lease_owner = NULL,
        lease_expires_at = NULL, attempts = %(attempts)s,
        last_error = COALESCE(%(last_error)s, last_error), updated_at = now()
    WHERE thread_id = %(thread_id)s
    RETURNING thread_id
)
INSERT INTO durable_quarantine (thread_id, checkpoint_ns, checkpoint_id, attempts,
                                last_error, graph_version, reason, quarantined_at)
VALUES (%(thread_id)s, '', %(checkpoint_id)s, %(attempts)s, %(last_error)s,
        %(graph_version)s, %(reason)s, now())
ON CONFLICT (thread_id) DO UPDATE SET
    checkpoint_id = EXCLUDED.checkpoint_id, attempts = EXCLUDED.attempts,
    last_error = EXCLUDED.last_error, graph_version = EXCLUDED.graph_version,
    reason = EXCLUDED.reason, quarantined_at = now()
"""

# --- artifacts -----------------------------------------------------------------------

# New artifacts of one put, one statement (arrays, sorted by digest: two puts inserting
# the same new artifacts wait for each other instead of deadlocking). DO NOTHING, not
# an update of last_used_at: re-touching shared artifacts left a dead tuple per reuse,
# and the foreign key below makes the bump unnecessary for GC safety.
UPSERT_ARTIFACT_SQL = """
INSERT INTO durable_artifacts (digest, size, data)
SELECT * FROM unnest(%b::bytea[], %s::int[], %b::bytea[])
ON CONFLICT (digest) DO NOTHING
"""

# Every digest a put references, every put (a known pair costs an index probe; the row
# is what keeps GC away from the artifact, see durable_artifact_refs_digest_fk).
INSERT_ARTIFACT_REF_SQL = """
INSERT INTO durable_artifact_refs (thread_id, digest)
SELECT %s, d FROM unnest(%b::bytea[]) AS d
ON CONFLICT DO NOTHING
"""

# Per-thread transaction-level advisory lock (two-int key space, apart from setup's
# one-bigint key): puts that write references take it shared; whatever removes a
# thread's references (reference recompute after prune/retention, delete_thread, GC's
# orphan sweep) takes it exclusive, so it never drops a reference a put is adding.
ARTIFACT_LOCK_CLASS = 0x6C67
ARTIFACT_LOCK_SHARED_SQL = "SELECT pg_advisory_xact_lock_shared(%s, hashtext(%s))"
ARTIFACT_LOCK_SQL = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"

# Arrays of bytea go as %b (binary): the text form escapes every element, 6x slower
# (0.66 ms vs 0.10 ms for the 265 digests of a 200-message chat).
FETCH_ARTIFACTS_SQL = "SELECT digest, data FROM durable_artifacts WHERE digest = ANY(%b)"

# --- thread deletion / copy ----------------------------------------------------------

# THE list of this package's tables keyed by thread (beside the stock checkpoints,
# checkpoint_blobs, checkpoint_writes). Every path that deletes a thread (delete_thread,
# prune(strategy="delete"), retain, delete_for_runs of its last run) deletes its rows
# in all of them through the statements below: a migration backup or ledger row that
# outlived its thread would keep data the user asked to delete (issue 11, defect 5).
# A new per-thread table goes here; tests/test_seams_delete.py fails until it does.
# durable_threads last: its row is what a run's lease and fence lock.
THREAD_TABLES = (
    "durable_artifact_refs",
    "durable_ledger",
    "durable_quarantine",
    "durable_migration_log",
    "durable_threads",
)
STOCK_THREAD_TABLES = ("checkpoint_writes", "checkpoint_blobs", "checkpoints")


DELETE_THREAD_EXTRA_SQL = tuple(
    sql.SQL("DELETE FROM {} WHERE thread_id = %s").format(sql.Identifier(t)) for t in THREAD_TABLES
)

# The same for many threads at once (prune(strategy="delete"), retain, delete_for_runs).
DELETE_THREADS_EXTRA_SQL = tuple(
    sql.SQL("DELETE FROM {} WHERE thread_id = ANY(%s)").format(sql.Identifier(t))
    for t in THREAD_TABLES
)
# Writes, blobs, then checkpoints: a write that slips in unserialized (a put outside
# any lease takes no row lock) then leaves either a whole checkpoint or stray blobs,
# never a checkpoint whose blobs were deleted under it.
DELETE_STOCK_THREADS_SQL = tuple(
    sql.SQL("DELETE FROM {} WHERE thread_id = ANY(%s)").format(sql.Identifier(t))
    for t in STOCK_THREAD_TABLES
)

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

COPY_THREAD_SQL = (
    """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                                type, checkpoint, metadata)
       SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
              jsonb_set(metadata, '{thread_id}', to_jsonb(%(target)s::text), false)
       FROM checkpoints WHERE thread_id = %(source)s
       ON CONFLICT DO NOTHING""",
    """INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
       SELECT %(target)s, checkpoint_ns, channel, version, type, blob
       FROM checkpoint_blobs WHERE thread_id = %(source)s
       ON CONFLICT DO NOTHING""",
    """INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,
                                      idx, channel, type, blob)
       SELECT %(target)s, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
       FROM checkpoint_writes WHERE thread_id = %(source)s
       ON CONFLICT DO NOTHING""",
    """INSERT INTO durable_artifact_refs (thread_id, digest)
       SELECT %(target)s, digest FROM durable_artifact_refs WHERE thread_id = %(source)s
       ON CONFLICT DO NOTHING""",
)

# Checkpoints (and their writes) whose metadata names one of the runs, in the threads
# delete_for_runs locked and checked.
DELETE_FOR_RUNS_SQL = (
    """DELETE FROM checkpoint_writes w USING checkpoints c
       WHERE c.metadata ->> 'run_id' = ANY(%(runs)s) AND c.thread_id = ANY(%(threads)s)
         AND w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
         AND w.checkpoint_id = c.checkpoint_id""",
    """DELETE FROM checkpoints
       WHERE metadata ->> 'run_id' = ANY(%(runs)s) AND thread_id = ANY(%(threads)s)
       RETURNING thread_id""",
)

# delete_for_runs' cleanup: the threads holding checkpoints of the runs; their lease
# rows, locked after their artifact locks (the order puts take them in), so a leased
# put in flight commits first and the next one waits, and checked: a live lease
# refuses the whole delete (ThreadBusyError, see _DurableBase._op_delete_for_runs).
# Threads without a row get one for the transaction (a run starting there waits for
# it), removed again at its end. Then the blob rows no remaining checkpoint of the
# same thread and namespace names by (channel, version). One pass over the threads'
# channel_versions (a hash anti-join), not a probe per blob.
RUN_THREADS_SQL = """
SELECT DISTINCT thread_id FROM checkpoints WHERE metadata ->> 'run_id' = ANY(%(runs)s)
ORDER BY thread_id
"""
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
# Threads the delete left without any checkpoint: deleted whole (every table).
EMPTY_THREADS_SQL = """
SELECT t AS thread_id FROM unnest(%(threads)s::text[]) AS t
WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = t)
ORDER BY t
"""
DELETE_UNUSED_BLOBS_SQL = """
WITH used AS MATERIALIZED (
    SELECT c.thread_id, c.checkpoint_ns, v.key AS channel, v.value AS version
    FROM checkpoints c, jsonb_each_text(c.checkpoint -> 'channel_versions') AS v
    WHERE c.thread_id = ANY(%(threads)s)
)
DELETE FROM checkpoint_blobs b
WHERE b.thread_id = ANY(%(threads)s) AND NOT EXISTS (
    SELECT 1 FROM used u
    WHERE u.thread_id = b.thread_id AND u.checkpoint_ns = b.checkpoint_ns
      AND u.channel = b.channel AND u.version = b.version)
"""
