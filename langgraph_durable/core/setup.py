"""setup(): the stock migrations, then ours, under a session advisory lock."""

from __future__ import annotations

from langgraph.checkpoint.postgres.base import MIGRATIONS as STOCK_MIGRATIONS

from langgraph_durable._io import (
    Batch,
    Flow,
    Op,
    Stmt,
    Tx,
)
from langgraph_durable.core.view import SetupView
from langgraph_durable.pooler import (
    flow_pooled_setup,
    op_check_schema,
)
from langgraph_durable.sql.schema import (
    DURABLE_MIGRATION_RECORD_SQL,
    DURABLE_MIGRATION_VERSION_SQL,
    MIGRATIONS,
    SETUP_LOCK_KEY,
    SETUP_POLL_SLEEP_SQL,
    SETUP_TRY_LOCK_SQL,
    SETUP_UNLOCK_SQL,
    STOCK_MIGRATION_RECORD_SQL,
    STOCK_MIGRATION_VERSION_SQL,
    create_schema,
    set_search_path,
)


class SetupOps(SetupView):
    """Schema creation and verification."""

    def _op_setup(self) -> Op[None]:
        """Stock migrations, then ours, under a session advisory lock (several
        processes may call setup() at once). Runs in autocommit: the stock
        migrations create indexes CONCURRENTLY.

        The lock is polled with pg_try_advisory_lock, never waited for in the server:
        CREATE INDEX CONCURRENTLY waits for every session of the database holding a
        snapshot, and a session blocked in pg_advisory_lock() holds one while it waits
        for the lock holder, which is the one running the CREATE INDEX: a deadlock
        (found with 4 processes calling setup() on a fresh database)."""
        while True:
            rows = yield Batch(
                [Stmt(SETUP_TRY_LOCK_SQL, (SETUP_LOCK_KEY,), fetch=True)]
            )
            if rows[0][0]["ok"]:
                break
            # Between polls this session holds no snapshot for longer than the sleep.
            yield Batch([Stmt(SETUP_POLL_SLEEP_SQL)])
        try:
            if self.schema:
                yield Batch([Stmt(create_schema(self.schema)), Stmt(set_search_path(self.schema))])
            yield Batch([Stmt(STOCK_MIGRATIONS[0])])
            rows = yield Batch(
                [Stmt(STOCK_MIGRATION_VERSION_SQL, fetch=True)]
            )
            version = rows[0][0]["v"] if rows[0] else -1
            for v in range(version + 1, len(STOCK_MIGRATIONS)):
                yield Batch([Stmt(STOCK_MIGRATIONS[v])])
                yield Batch([Stmt(STOCK_MIGRATION_RECORD_SQL, (v,))])
            yield Batch([Stmt(MIGRATIONS[0])])
            rows = yield Batch(
                [Stmt(DURABLE_MIGRATION_VERSION_SQL, fetch=True)]
            )
            version = rows[0][0]["v"] if rows[0] else -1
            for v in range(version + 1, len(MIGRATIONS)):
                yield Batch([Stmt(MIGRATIONS[v])])
                yield Batch([Stmt(DURABLE_MIGRATION_RECORD_SQL, (v,))])
        except Exception:
            # A failed statement is thrown in here by the driver: release the session
            # lock on this connection before it goes back to the pool. (Not a finally:
            # an op closed with GeneratorExit cannot yield.)
            yield Batch([Stmt(SETUP_UNLOCK_SQL, (SETUP_LOCK_KEY,))])
            raise
        yield Batch([Stmt(SETUP_UNLOCK_SQL, (SETUP_LOCK_KEY,))])

    def _flow_setup_or_check(self) -> Flow[None]:
        """setup() without DDL (``run_migrations=False``: verify the versions), or
        behind a transaction pooler (one transaction per attempt; see pooler.py)."""
        if not self.run_migrations:
            yield Tx(lambda: op_check_schema(self, STOCK_MIGRATIONS))
            return
        yield from flow_pooled_setup(self, STOCK_MIGRATIONS)
