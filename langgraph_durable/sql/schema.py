"""Schema of this package: its migrations, the thread-keyed table lists, identifiers.

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
from langgraph_durable.sql.secrets import CREATE_SECRETS_SQL

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
    # Issue 13 (one order check): durable_checkpoint_order, the stand-alone order check no
    # statement of the package calls since durable_put_guard inlined it (issue 14), kept
    # for installs and grants that name it, becomes durable_put_guard's order check with
    # no lease check: the rule is written once. Same signature, result and SQLSTATE.
    """CREATE OR REPLACE FUNCTION durable_checkpoint_order(p_thread text, p_ns text, p_id text)
    RETURNS integer LANGUAGE sql AS $$
        SELECT CASE WHEN durable_put_guard(p_thread, NULL, NULL, false, p_ns, p_id) THEN 1 END
    $$""",
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
    # Issue 14 (status counts bounded by what they return): whether the thread has a root
    # checkpoint, so recovery.status_counts probes checkpoints only for the threads that
    # may be orphaned, not for the whole backlog. A cache with one rule: TRUE only while
    # a root checkpoint exists. NULL (rows from before this migration, rows inserted by
    # any path) and FALSE mean "not known to have one": status_counts probes them, so a
    # stale FALSE (a checkpoint written since, e.g. by a run killed before its release)
    # costs one probe and is never a wrong count. Set by LEASE_RELEASE_SQL (probed in the
    # statement, never from what the run believes it wrote); made FALSE by the triggers
    # below whenever root checkpoints go, whoever deletes them (stock saver, retention,
    # hand-written SQL). Puts never touch it.
    "ALTER TABLE durable_threads ADD COLUMN IF NOT EXISTS has_root BOOLEAN",
    # The triggers keeping has_root = TRUE honest, on the stock checkpoints table:
    # statement-level on DELETE (one pass per statement over its deleted rows, not a
    # call per row), TRUNCATE, and a row trigger on an UPDATE that moves a root
    # checkpoint to another thread or namespace (no package statement does; the stock
    # upsert's SET names neither column, so puts never fire it). durable_unroot:
    # - locks the thread rows first (in thread order: no deadlock between two deletes),
    #   then checks for a remaining root in a NEW statement, whose snapshot (READ
    #   COMMITTED) sees every delete that held those locks before: two transactions
    #   deleting disjoint roots of one thread cannot both see the other's as remaining.
    #   Under REPEATABLE READ / SERIALIZABLE (the stock prune) the snapshot is the
    #   transaction's, so a remaining root is proven by locking it (FOR KEY SHARE: a
    #   delete of it waits for this commit, then runs this trigger itself; one deleted
    #   meanwhile is a serialization failure); the row is written only when none is
    #   left, so pruning a thread a live run keeps updating does not conflict with it.
    # - writes the row whenever it clears, so a LEASE_RELEASE_SQL that read checkpoints
    #   before the delete committed sees the row changed (xmin) and writes NULL. READ
    #   COMMITTED skips rows already not TRUE and without a lease: the row is locked and
    #   read as of now, so no release can be in flight on it (a release needs the lease
    #   in the current row; a new acquisition waits for this lock, so its release reads
    #   after this commit). Under REPEATABLE READ the row read is old: always written.
    # SECURITY DEFINER: a role granted only the stock tables may delete checkpoints.
    # Harmless if durable_threads was dropped (uninstall) and the triggers left behind.
    """DO $$ BEGIN
        CREATE OR REPLACE FUNCTION durable_unroot(p_threads text[]) RETURNS void
        LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
        BEGIN
            IF p_threads IS NULL OR to_regclass('durable_threads') IS NULL THEN
                RETURN;
            END IF;
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                UPDATE durable_threads t SET has_root = false
                WHERE t.thread_id = ANY(p_threads)
                  AND NOT EXISTS (SELECT 1 FROM checkpoints c
                                  WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = ''
                                  LIMIT 1 FOR KEY SHARE);
                RETURN;
            END IF;
            PERFORM 1 FROM durable_threads WHERE thread_id = ANY(p_threads)
            ORDER BY thread_id FOR NO KEY UPDATE;
            UPDATE durable_threads t SET has_root = false
            WHERE t.thread_id = ANY(p_threads) AND (t.has_root OR t.lease_owner IS NOT NULL)
              AND NOT EXISTS (SELECT 1 FROM checkpoints c
                              WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '');
        END $f$;
        CREATE OR REPLACE FUNCTION durable_root_deleted() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
        BEGIN
            PERFORM durable_unroot((SELECT array_agg(DISTINCT g.thread_id ORDER BY g.thread_id)
                                    FROM durable_root_gone g WHERE g.checkpoint_ns = ''));
            RETURN NULL;
        END $f$;
        CREATE OR REPLACE FUNCTION durable_root_moved() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
        BEGIN
            PERFORM durable_unroot(ARRAY[OLD.thread_id]);
            RETURN NULL;
        END $f$;
        CREATE OR REPLACE FUNCTION durable_root_truncated() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
        BEGIN
            IF to_regclass('durable_threads') IS NOT NULL THEN
                UPDATE durable_threads SET has_root = false WHERE has_root;
            END IF;
            RETURN NULL;
        END $f$;
        DROP TRIGGER IF EXISTS durable_root_del ON checkpoints;
        DROP TRIGGER IF EXISTS durable_root_upd ON checkpoints;
        DROP TRIGGER IF EXISTS durable_root_trunc ON checkpoints;
        CREATE TRIGGER durable_root_del AFTER DELETE ON checkpoints
            REFERENCING OLD TABLE AS durable_root_gone
            FOR EACH STATEMENT EXECUTE FUNCTION durable_root_deleted();
        CREATE TRIGGER durable_root_upd AFTER UPDATE OF thread_id, checkpoint_ns ON checkpoints
            FOR EACH ROW WHEN (OLD.checkpoint_ns = ''
                               AND (OLD.thread_id, OLD.checkpoint_ns) IS DISTINCT FROM
                                   (NEW.thread_id, NEW.checkpoint_ns))
            EXECUTE FUNCTION durable_root_moved();
        CREATE TRIGGER durable_root_trunc AFTER TRUNCATE ON checkpoints
            FOR EACH STATEMENT EXECUTE FUNCTION durable_root_truncated();
        REVOKE EXECUTE ON FUNCTION durable_unroot(text[]) FROM PUBLIC;
    END $$""",
    # Backfill, after the triggers exist (a delete from now on clears what it sets): only
    # the rows status_counts would probe (running, stopped, queued: the ready index walks
    # them), not the whole table; the rest get the flag at their next release. Safe next
    # to live deletes: a row a delete's trigger changed meanwhile is re-read (READ
    # COMMITTED) and no longer NULL, so it is skipped, never set TRUE from the old read.
    """UPDATE durable_threads t
    SET has_root = EXISTS (SELECT 1 FROM checkpoints c
                           WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '')
    WHERE t.status IN ('running', 'stopped', 'queued') AND t.has_root IS NULL""",
    # The rows status_counts must look at one by one: those not known to have a root.
    # Stays as small as the orphans plus runs in flight on new threads.
    """CREATE INDEX IF NOT EXISTS durable_threads_unrooted_idx ON durable_threads (thread_id)
        WHERE status IN ('running', 'stopped', 'queued') AND has_root IS NOT TRUE""",
    # Live leases (status_counts, inspect.thread_status_counts): only rows holding an
    # owner, by expiry, the status alongside: the count of live leases is a range scan
    # over the live ones, not a walk of the backlog's expired or never-taken rows.
    """CREATE INDEX IF NOT EXISTS durable_threads_leased_idx ON durable_threads (lease_expires_at)
        INCLUDE (status) WHERE lease_owner IS NOT NULL""",
    # Issue 14 (writes at the floor): the write statements carry the guard as plain SQL
    # (sql.checkpoints._GUARD: the same FOR SHARE row lock, predicates and order rule as
    # durable_put_guard), measured ~0.07 ms of server time cheaper per put than the
    # plpgsql call, whose two SPI queries each took a snapshot. plpgsql runs only on the
    # failure path: this function raises the guard's errors, with the messages, DETAIL
    # and SQLSTATEs durable_put_guard raised (LGD01 lease lost, LGD02 leased by someone
    # else, LGD03 checkpoint before its head). Returns boolean so a CASE can call it.
    """CREATE OR REPLACE FUNCTION durable_guard_fail(
        p_kind text, p_thread text, p_token bigint, p_ns text, p_id text)
    RETURNS boolean LANGUAGE plpgsql AS $$
    DECLARE
        v_owner text;
        v_expires float8;
        v_head text;
    BEGIN
        IF p_kind = 'lost' THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD01',
                MESSAGE = format('lease on thread %s (token %s) was lost', p_thread, p_token);
        ELSIF p_kind = 'busy' THEN
            SELECT t.lease_owner, EXTRACT(EPOCH FROM (t.lease_expires_at - now()))::float8
            INTO v_owner, v_expires
            FROM durable_threads t WHERE t.thread_id = p_thread;
            RAISE EXCEPTION USING ERRCODE = 'LGD02',
                MESSAGE = format('thread %s is being run by %s', p_thread, v_owner),
                DETAIL = json_build_object('owner', v_owner, 'expires_in', v_expires)::text;
        ELSE
            SELECT checkpoint_id INTO v_head FROM checkpoints
            WHERE thread_id = p_thread AND checkpoint_ns = p_ns
            ORDER BY checkpoint_id DESC LIMIT 1;
            RAISE EXCEPTION USING ERRCODE = 'LGD03',
                MESSAGE = format('checkpoint %s of thread %s would sort before its head %s',
                                 p_id, p_thread, v_head),
                DETAIL = json_build_object('head', v_head)::text;
        END IF;
    END $$""",
    # The ready queue by status (recovery.RECOVERY_CLAIM_SQL, issue 14): one ordered walk
    # per status the poll takes, merged by updated_at, instead of one walk of every ready
    # thread (a worker that takes only 'queued' read the whole backlog of running,
    # stopped and error threads to find none). Unleased rows only: a live run's row
    # (leased until it ends) is never walked past; leased rows a claim may take (expired,
    # or its own) are found by lease, durable_threads_leased_idx and the owner index.
    # Replaces durable_threads_ready_idx, whose only reader was the claim.
    """CREATE INDEX IF NOT EXISTS durable_threads_claim_idx ON durable_threads (status, updated_at)
        WHERE status IN ('running', 'stopped', 'queued', 'error') AND lease_owner IS NULL""",
    """CREATE INDEX IF NOT EXISTS durable_threads_owner_idx ON durable_threads (lease_owner)
        WHERE lease_owner IS NOT NULL""",
    "DROP INDEX IF EXISTS durable_threads_ready_idx",
    # durable_unroot, cheaper (issue 14: whole-thread deletes paid the has_root trigger
    # ~60-170 ms per 10k threads). The same guarantee and the same locks, one pass fewer:
    # the READ COMMITTED lock pass returns the rows it locked, as of now (a locked row
    # waited for is returned in its newest version), and keeps only the ones the old
    # UPDATE would have looked at (has_root TRUE, or a lease held). Nothing can change
    # them between the lock and the UPDATE (FOR NO KEY UPDATE blocks every writer), so
    # filtering there is the old UPDATE's own filter. Every row is still locked: the
    # filter is an aggregate FILTER over the locking subquery, never pushed into it (an
    # unlocked row could be acquired and released with a stale TRUE before this commits).
    # When none is left, no UPDATE runs at all: the whole-thread deletes, which remove the
    # thread rows first (sql.threads.DELETE_THREAD_ROWS_FIRST_SQL), and deletes of threads
    # whose flag is not TRUE, pay one primary-key pass instead of two. The REPEATABLE READ
    # branch is unchanged. A thread with no row at all when the lock pass runs (a
    # stock-only thread) is locked out by nothing here: a run starting on it meanwhile
    # that writes no checkpoint would release before this delete commits. Its release's
    # probe covers that case (sql.threads.LEASE_RELEASE_SQL: a flag not yet TRUE is probed
    # FOR KEY SHARE, so it waits for this delete; test_status_counts
    # test_a_stock_only_thread_deleted_while_a_run_starts_never_keeps_a_stale_true).
    """CREATE OR REPLACE FUNCTION durable_unroot(p_threads text[]) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $f$
    DECLARE
        v_write text[];
    BEGIN
        IF p_threads IS NULL OR to_regclass('durable_threads') IS NULL THEN
            RETURN;
        END IF;
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            UPDATE durable_threads t SET has_root = false
            WHERE t.thread_id = ANY(p_threads)
              AND NOT EXISTS (SELECT 1 FROM checkpoints c
                              WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = ''
                              LIMIT 1 FOR KEY SHARE);
            RETURN;
        END IF;
        SELECT array_agg(l.thread_id) FILTER (WHERE l.has_root OR l.lease_owner IS NOT NULL)
        INTO v_write
        FROM (SELECT thread_id, has_root, lease_owner FROM durable_threads
              WHERE thread_id = ANY(p_threads)
              ORDER BY thread_id FOR NO KEY UPDATE) l;
        IF v_write IS NULL THEN
            RETURN;
        END IF;
        UPDATE durable_threads t SET has_root = false
        WHERE t.thread_id = ANY(v_write) AND (t.has_root OR t.lease_owner IS NOT NULL)
          AND NOT EXISTS (SELECT 1 FROM checkpoints c
                          WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '');
    END $f$""",  # CREATE OR REPLACE keeps the earlier entry's REVOKE ... FROM PUBLIC
    # --- failover branch ---
    # Issue 23 (asynchronous failover): durable_guard_fail learns 'gone', a run's put
    # whose parent is not on the server (sql.checkpoints._GUARD_PARENT): LGD04, the
    # thread's real head in the DETAIL. Same signature, so grants and callers of earlier
    # releases are unchanged; their kinds raise exactly what they raised.
    """CREATE OR REPLACE FUNCTION durable_guard_fail(
        p_kind text, p_thread text, p_token bigint, p_ns text, p_id text)
    RETURNS boolean LANGUAGE plpgsql AS $$
    DECLARE
        v_owner text;
        v_expires float8;
        v_head text;
    BEGIN
        IF p_kind = 'lost' THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD01',
                MESSAGE = format('lease on thread %s (token %s) was lost', p_thread, p_token);
        ELSIF p_kind = 'busy' THEN
            SELECT t.lease_owner, EXTRACT(EPOCH FROM (t.lease_expires_at - now()))::float8
            INTO v_owner, v_expires
            FROM durable_threads t WHERE t.thread_id = p_thread;
            RAISE EXCEPTION USING ERRCODE = 'LGD02',
                MESSAGE = format('thread %s is being run by %s', p_thread, v_owner),
                DETAIL = json_build_object('owner', v_owner, 'expires_in', v_expires)::text;
        END IF;
        SELECT checkpoint_id INTO v_head FROM checkpoints
        WHERE thread_id = p_thread AND checkpoint_ns = p_ns
        ORDER BY checkpoint_id DESC LIMIT 1;
        IF p_kind = 'gone' THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD04',
                MESSAGE = format('checkpoint %s of thread %s is not on this server '
                                 '(acknowledged work lost); its head is %s',
                                 p_id, p_thread, v_head),
                DETAIL = json_build_object('head', v_head)::text;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'LGD03',
            MESSAGE = format('checkpoint %s of thread %s would sort before its head %s',
                             p_id, p_thread, v_head),
            DETAIL = json_build_object('head', v_head)::text;
    END $$""",


    # --- console25 branch ---
    # The last failure of a run with its traceback (issue 25): node, exception type,
    # message, traceback bounded at 16 KiB (the cut said), written by the release of a
    # run that raised (sql.threads.RECORD_FAILURE_SQL); kept through quarantine.
    "ALTER TABLE durable_threads ADD COLUMN IF NOT EXISTS last_failure JSONB",
    # The graph's name beside its versions (issue 25): with two graphs in one database,
    # "current" and "must drain" are per graph. The run's config metadata graph_id (as
    # LangGraph Platform sets it), else the compiled graph's own name unless the default.
    "ALTER TABLE durable_graph_versions ADD COLUMN IF NOT EXISTS graph_name TEXT",
    # --- ctl25 branch ---
    # The worker registry (issue 25): one row per running `langgraph-durable worker` /
    # RecoveryWorker.run, registered at start, one UPDATE per heartbeat interval,
    # stopped_at set on a clean exit; a SIGKILLed worker's row goes stale (dead after
    # ttl_s, at once on its own host when its pid is gone). Pruned at registration.
    """CREATE TABLE IF NOT EXISTS durable_workers (
        worker_id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        identity TEXT NOT NULL,
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        last_poll_at TIMESTAMPTZ,
        stopped_at TIMESTAMPTZ,
        ttl_s DOUBLE PRECISION NOT NULL,
        versions TEXT[] NOT NULL DEFAULT '{}',
        graph_names TEXT[] NOT NULL DEFAULT '{}',
        concurrency INTEGER NOT NULL,
        claimed INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX IF NOT EXISTS durable_workers_heartbeat_idx ON durable_workers (heartbeat_at DESC)",
    # Operator decisions on a thread (issue 25): cancel_token, a cancel request for the
    # run holding that lease token (seen by its puts and renewals, never by a later
    # run); cancelled_at, set by the release of a cancelled run (workers leave such a
    # 'stopped' thread alone until it is resumed or queued); answer_*, a queued
    # Command(resume=...) value (the saver's serde: type tag and bytes, never plain
    # JSON) for the waiting checkpoint answer_checkpoint_id.
    """ALTER TABLE durable_threads
        ADD COLUMN IF NOT EXISTS cancel_token BIGINT,
        ADD COLUMN IF NOT EXISTS cancelled_at TIMESTAMPTZ,
        ADD COLUMN IF NOT EXISTS answer_type TEXT,
        ADD COLUMN IF NOT EXISTS answer_blob BYTEA,
        ADD COLUMN IF NOT EXISTS answer_checkpoint_id TEXT""",


    # --- ui25 branch ---
    # A natural sort of thread ids for the console's threads list (issue 25: "order-2"
    # before "order-10"), bounded at any size: an ICU collation with numeric ordering
    # and an expression index in it, walked page by page (sql.console.THREADS_NATURAL_SQL).
    # A server built without ICU (the embedded PostgreSQL's, for one) skips both: the
    # list stays in byte order and says so. The index build locks durable_threads against
    # writes for its duration (about 0.3 s per 100k threads here).
    """DO $$
    BEGIN
        EXECUTE 'CREATE COLLATION IF NOT EXISTS durable_natural '
                '(provider = icu, locale = ''und-u-kn-true'')';
        EXECUTE 'CREATE INDEX IF NOT EXISTS durable_threads_natural_idx '
                'ON durable_threads ((thread_id COLLATE durable_natural))';
    EXCEPTION WHEN feature_not_supported OR invalid_parameter_value OR undefined_object THEN
        RAISE NOTICE 'no ICU collation here (%): the threads list stays in byte order', SQLERRM;
    END $$""",
    # --- claim26 branch ---
    # The rolling-deploy poll (issue 26): a worker of some versions only walks the ready
    # queue of those (one ordered walk per version and status, sql.recovery.claim_sql) and
    # the expired leases of those, never the other versions' backlog (a v2 worker read all
    # 22k ready v1 threads per poll at 100k threads: 162 ms). Keyed by the row's
    # graph_version: what the thread's last run or submit wrote, the version its
    # checkpoints carry; a claim corrects a row whose latest checkpoint says otherwise.
    # Keyed by COALESCE(graph_version, ''): rows naming no version are one more equality
    # range, walked in order like the others (sql.recovery.claim_sql).
    """CREATE INDEX IF NOT EXISTS durable_threads_claim_version_idx
        ON durable_threads ((COALESCE(graph_version, '')), status, updated_at)
        WHERE status IN ('running', 'stopped', 'queued', 'error') AND lease_owner IS NULL""",
    """CREATE INDEX IF NOT EXISTS durable_threads_expired_version_idx
        ON durable_threads (graph_version, lease_expires_at) WHERE lease_owner IS NOT NULL""",
    # Rows of the ready queue naming no version whose latest checkpoint has one (rows
    # written before the run path kept the column): named now, so a worker of some
    # versions finds them by its own branch. Only the ready rows, once; a claim corrects
    # any left later (see sql.recovery._CLAIM_REPAIR).
    """UPDATE durable_threads t SET graph_version = h.v
    FROM (SELECT r.thread_id,
                 (SELECT c.metadata ->> 'graph_version' FROM checkpoints c
                  WHERE c.thread_id = r.thread_id AND c.checkpoint_ns = ''
                  ORDER BY c.checkpoint_id DESC LIMIT 1) AS v
          FROM durable_threads r
          WHERE r.status IN ('running', 'stopped', 'queued', 'error') AND r.graph_version IS NULL) h
    WHERE t.thread_id = h.thread_id AND h.v IS NOT NULL AND t.graph_version IS NULL""",
    # --- digest27 branch ---
    # The database's digest secret, sealed (issue 27; sql/secrets.py owns its SQL).
    CREATE_SECRETS_SQL,
]

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
# Tables with a thread_id column that deleting a thread does NOT empty, on purpose:
# durable_audit is the trail of who did what (including who deleted the thread); its rows
# hold ids and action metadata, never state values, so nothing the user asked to delete
# survives in it (audit.py builds every row from ids, counts and type names).
KEPT_AFTER_DELETE = ("durable_audit",)

# setup(): the session advisory lock, polled (see core.setup), and the two version tables.
SETUP_TRY_LOCK_SQL = "SELECT pg_try_advisory_lock(%s) AS ok"
SETUP_POLL_SLEEP_SQL = "SELECT pg_sleep(0.05)"
SETUP_UNLOCK_SQL = "SELECT pg_advisory_unlock(%s)"
STOCK_MIGRATION_VERSION_SQL = "SELECT v FROM checkpoint_migrations ORDER BY v DESC LIMIT 1"
STOCK_MIGRATION_RECORD_SQL = "INSERT INTO checkpoint_migrations (v) VALUES (%s)"
DURABLE_MIGRATION_VERSION_SQL = "SELECT v FROM durable_migrations ORDER BY v DESC LIMIT 1"
DURABLE_MIGRATION_RECORD_SQL = "INSERT INTO durable_migrations (v) VALUES (%s)"


# --- setup behind a transaction pooler, and the DDL-free schema check (pooler.py) -------
# The setup lock for one transaction (never waited for in the server; see pooler.py).
TRY_SETUP_XACT_LOCK_SQL = "SELECT pg_try_advisory_xact_lock(%s) AS ok"
CURRENT_SCHEMA_SQL = "SELECT current_schema() AS s, current_user AS u"
TABLE_EXISTS_SQL = "SELECT to_regclass(%s) IS NOT NULL AS ok"


def migration_version_sql(table: sql.Identifier) -> sql.Composed:
    """The newest migration recorded in ``table`` (checkpoint_migrations or ours)."""
    return sql.SQL("SELECT max(v) AS v FROM {}").format(table)


def record_migration_sql(table: sql.Identifier) -> sql.Composed:
    return sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(table)
