"""delete_thread, delete_for_runs, copy_thread and prune."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import psycopg
from langgraph.checkpoint.postgres.base import (
    PRUNE_STRATEGIES,
    _keep_latest,
    _refuse_delta_threads,
)

from langgraph_durable import _values
from langgraph_durable._io import (
    AfterCommit,
    Batch,
    Flow,
    Op,
    Sleep,
    Stmt,
    Tx,
    op_memo,
)
from langgraph_durable._refs import op_recompute_refs
from langgraph_durable.core.view import AdminView
from langgraph_durable.errors import (
    DurableError,
    ThreadBusyError,
    ThreadExistsError,
)
from langgraph_durable.sql.artifacts import (
    ARTIFACT_LOCK_CLASS,
    ARTIFACT_LOCK_SQL,
)
from langgraph_durable.sql.checkpoints import (
    COPY_THREAD_SQL,
    DELETE_FOR_RUNS_SQL,
    DELETE_STOCK_THREADS_SQL,
    DELETE_THREAD_EXTRA_SQL,
    DELETE_THREADS_EXTRA_SQL,
    DELETE_UNUSED_BLOBS_SQL,
    EMPTY_THREADS_SQL,
    RUN_THREADS_SQL,
    SAME_HEAD_SQL,
    THREAD_HAS_CHECKPOINTS_SQL,
)
from langgraph_durable.sql.threads import (
    DELETE_THREAD_ROWS_FIRST_SQL,
    DELETE_THREAD_ROWS_SQL,
    ENSURE_THREAD_ROWS_SQL,
    LOCK_THREAD_ROWS_SQL,
    LOCK_THREADS_FOR_DELETE_SQL,
)

logger = logging.getLogger("langgraph_durable")


class AdminOps(AdminView):
    """Thread deletion, copy and pruning."""

    def _op_delete_thread(self, thread_id: str) -> Op[None]:
        tid = str(thread_id)
        stmts = [
            # Exclusive artifact lock: a put adding references to this thread waits, so
            # its reference rows are never deleted under it (see _artifact_stmts).
            Stmt(ARTIFACT_LOCK_SQL, (ARTIFACT_LOCK_CLASS, tid)),
            # Then the thread row: a leased put in flight commits first (see the SQL).
            *[Stmt(s, ([tid],)) for s in LOCK_THREADS_FOR_DELETE_SQL],
            # The locked row goes before the checkpoints (see DELETE_THREAD_ROWS_FIRST_SQL).
            Stmt(DELETE_THREAD_ROWS_FIRST_SQL, ([tid],)),
            *[Stmt(s, ([tid],)) for s in DELETE_STOCK_THREADS_SQL],
            *[Stmt(s, (tid,)) for s in DELETE_THREAD_EXTRA_SQL],
        ]
        yield Batch(stmts)
        yield AfterCommit(lambda: self._known_refs.forget_thread(tid))

    def _forget_threads(self, thread_ids: Sequence[str]) -> None:
        for t in thread_ids:
            self._known_refs.forget_thread(t)

    def _op_delete_for_runs(self, runs: list[str]) -> Op[list[str]]:
        """Delete the runs' checkpoints and writes, the blob rows of their threads that
        no remaining checkpoint uses, and recompute the threads' artifact references;
        a thread left without checkpoints is deleted whole (every table of
        THREAD_TABLES). One transaction, so a retry after a lost COMMIT reply
        finds nothing left to do. Returns the threads touched.

        A thread a live run holds is refused (``ThreadBusyError``, nothing deleted
        anywhere), not fenced like ``delete_thread`` fences it: delete_thread removes
        the thread, so nothing will resume the fenced run's half-done node, while here
        the thread lives on and its next run would execute that node again (its
        effects twice); and deleting under a live run dropped blob versions the run
        still points to (issue 11, defect 1). LangGraph's rollback calls this after
        the cancelled run has exited, when the lease is free."""
        locked, created = yield from self._op_lock_run_threads(runs)
        if not locked:
            return []
        params = {"runs": runs, "threads": locked}
        yield Batch(
            [Stmt(s, params, fetch="RETURNING" in s) for s in DELETE_FOR_RUNS_SQL]
            + [Stmt(DELETE_UNUSED_BLOBS_SQL, params)]
        )
        rows = yield Batch([Stmt(EMPTY_THREADS_SQL, params, fetch=True)])
        empty = [r["thread_id"] for r in rows[0]]
        if empty:
            yield Batch(
                [Stmt(s, (empty,)) for s in DELETE_STOCK_THREADS_SQL]
                + [Stmt(s, (empty,)) for s in DELETE_THREADS_EXTRA_SQL]
            )
            yield AfterCommit(partial(self._forget_threads, empty))
        kept_created = sorted(created - set(empty))
        if kept_created:  # rows made above only to lock: no row stays "no row"
            yield Batch([Stmt(DELETE_THREAD_ROWS_SQL, (kept_created,))])
        # The threads' reference rows still name what the deleted checkpoints used:
        # recompute them (same transaction, under the exclusive locks taken above) so
        # gc() can free those artifacts.
        for tid in locked:
            if tid not in empty:
                try:
                    yield from op_recompute_refs(self, tid)
                except DurableError as exc:  # a damaged artifact, found in Python
                    # The rows stay a superset (GC frees less, never too much): the
                    # delete the caller asked for still happens.
                    logger.warning("thread %s: references not recomputed: %s", tid, exc)
        return locked

    def _op_lock_run_threads(self, runs: list[str]) -> Op[tuple[list[str], set[str]]]:
        """delete_for_runs' first step: lock (artifact lock, then thread row) every thread
        holding checkpoints of the runs, refusing a live lease (``ThreadBusyError``).
        Returns the threads locked and those whose row was made only to lock it."""
        found = yield Batch([Stmt(RUN_THREADS_SQL, {"runs": runs}, fetch=True)])
        threads = [r["thread_id"] for r in found[0]]
        created: set[str] = set()
        locked: list[str] = []
        while threads:
            params = {"runs": runs, "threads": threads}
            rows = yield Batch(
                [Stmt(ARTIFACT_LOCK_SQL, (ARTIFACT_LOCK_CLASS, t)) for t in threads]
                + [Stmt(ENSURE_THREAD_ROWS_SQL, params, fetch=True)]
                + [Stmt(LOCK_THREAD_ROWS_SQL, params, fetch=True)]
            )
            created |= {r["thread_id"] for r in rows[-2]}
            for r in rows[-1]:
                if r["leased"]:
                    raise ThreadBusyError(r["thread_id"], r["lease_owner"], r["expires_in"])
            locked = sorted({*locked, *threads})
            # A run that checkpointed in another thread meanwhile: lock and check it too.
            again = yield Batch([Stmt(RUN_THREADS_SQL, {"runs": runs}, fetch=True)])
            threads = sorted({r["thread_id"] for r in again[0]} - set(locked))
        return locked, created

    def _flow_delete_for_runs(self, run_ids: Sequence[str]) -> Flow[None]:
        runs = [str(r) for r in run_ids]
        if not runs:
            return
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                yield Tx(partial(self._op_delete_for_runs, runs))
                return
            except ThreadBusyError:
                if self.on_busy == "wait" and time.monotonic() < deadline:
                    yield Sleep(0.25)
                    continue
                raise

    def _op_copy_thread(self, source: str, target: str) -> Op[None]:
        params = {"source": str(source), "target": str(target)}
        _values.check_ids(params["source"])
        _values.check_ids(params["target"])
        # Copying into a thread with checkpoints would interleave two histories by
        # checkpoint id (ON CONFLICT DO NOTHING keeps the target's rows): refuse. The
        # target's exclusive artifact lock makes a put with artifacts into it wait.
        memo = op_memo()
        try:
            rows = yield Batch(
                [
                    Stmt(ARTIFACT_LOCK_SQL, (ARTIFACT_LOCK_CLASS, params["target"])),
                    Stmt(
                        THREAD_HAS_CHECKPOINTS_SQL,
                        (params["target"],),
                        fetch=True,
                    ),
                ]
            )
            if rows[1][0]["taken"]:
                if memo.get("copy_sent") and (yield from self._op_copied(params)):
                    return  # a retry after a lost COMMIT reply: the first attempt copied
                raise ThreadExistsError(params["source"], params["target"])
            memo["copy_sent"] = True
            yield Batch([Stmt(s, params) for s in COPY_THREAD_SQL])
        except psycopg.Error as exc:
            err = _values.canceled_error(exc, "copy_thread", params["target"])
            if err is None:
                raise
            raise err from exc

    @staticmethod
    def _op_copied(params: Mapping[str, str]) -> Op[bool]:
        """Whether the target holds exactly the source's newest checkpoint: the copy a
        retried ``copy_thread`` sent before its COMMIT reply was lost committed."""
        rows = yield Batch(
            [
                Stmt(
                    SAME_HEAD_SQL,
                    params,
                    fetch=True,
                )
            ]
        )
        return bool(rows[0][0]["same"])

    def _op_stock(self, statements: Any) -> Op[None]:
        """Run one of the stock saver's prune statement generators."""
        try:
            sql, params, fetch = next(statements)
            while True:
                rows = yield Batch([Stmt(sql, params, fetch=fetch, prepare=False)])
                sql, params, fetch = statements.send(rows[0] if fetch else [])
        except StopIteration:
            return

    def _flow_prune(self, thread_ids: Sequence[str], strategy: str) -> Flow[None]:
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"Unknown prune strategy: {strategy!r}")
        ids = [str(t) for t in thread_ids]
        if not ids:
            return
        if strategy == "delete":

            def delete_all() -> Op[None]:
                yield Batch(
                    [Stmt(ARTIFACT_LOCK_SQL, (ARTIFACT_LOCK_CLASS, t)) for t in sorted(set(ids))]
                    + [Stmt(s, (ids,)) for s in LOCK_THREADS_FOR_DELETE_SQL]
                    + [Stmt(DELETE_THREAD_ROWS_FIRST_SQL, (ids,))]
                    + [Stmt(s, (ids,)) for s in DELETE_STOCK_THREADS_SQL]
                    # Everything delete_thread removes, so no lease, quarantine record
                    # or migration backup outlives the thread it describes.
                    + [Stmt(s, (ids,)) for s in DELETE_THREADS_EXTRA_SQL]
                )
                yield AfterCommit(partial(self._forget_threads, ids))

            yield Tx(delete_all)
            return
        yield Tx(lambda: self._op_stock(_refuse_delta_threads(ids)))
        for tid in ids:
            yield Tx(partial(self._op_stock, _keep_latest(tid)))
            # The thread's reference rows still name what the pruned checkpoints used:
            # recompute them from what is left, so gc() can free those artifacts.
            yield Tx(partial(op_recompute_refs, self, tid))
