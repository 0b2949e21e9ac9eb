"""Acquire, release and abandon a lease (ops), and the saver's one renewer."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from langgraph_durable import _sealing
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import (
    Batch,
    Op,
    Stmt,
    op_memo,
)
from langgraph_durable.core.view import LeaseView
from langgraph_durable.errors import LeaseLostError
from langgraph_durable.leases.model import Lease, _Handoff
from langgraph_durable.leases.owners import owner_is_dead
from langgraph_durable.leases.renewer import _Renewer
from langgraph_durable.sql.threads import (
    LEASE_ABANDON_SQL,
    LEASE_ACQUIRE_SQL,
    LEASE_RELEASE_CHECKED_SQL,
    LEASE_RELEASE_SQL,
    THREAD_LEASE_ROW_SQL,
)

logger = logging.getLogger("langgraph_durable")


class LeaseOps(LeaseView):
    """Lease acquisition, release and renewal of a saver."""

    @property
    def _renewer(self) -> _Renewer | None:
        return self._renewer_slot.renewer

    @_renewer.setter
    def _renewer(self, value: _Renewer | None) -> None:
        self._renewer_slot.renewer = value

    @property
    def _renewer_lock(self) -> threading.Lock:
        return self._renewer_slot.lock

    def _acquire_params(
        self, thread_id: str, owner: str, version: str | None, checkpoint_id: str | None,
        handoff: _Handoff | None,
    ) -> dict[str, Any]:
        mine = handoff if handoff is not None and handoff.thread_id == thread_id else None
        return {
            "thread_id": thread_id,
            "owner": owner,
            "version": version,
            "ttl": self.lease_ttl,
            "checkpoint_id": checkpoint_id,
            "dead_owner": None,
            "claim_owner": mine.owner if mine else None,
            "claim_token": mine.token if mine else None,
        }

    @_telemetry.instrument("lease_acquire")
    def _op_acquire(
        self,
        thread_id: str,
        owner: str,
        version: str | None,
        checkpoint_id: str | None,
        handoff: _Handoff | None = None,
        load: Stmt | None = None,
    ) -> Op[dict[str, Any]]:
        """Take the lease: one autocommit statement, one round trip (ACQUIRE_SQL looks up
        the latest checkpoint itself). Safe to run again after a lost COMMIT reply (the
        driver retries): ACQUIRE_SQL recognises its own owner and then counts no attempt
        and bumps no token, and reports the thread as it was before the first execution
        (lease_prev_*). Not taken: the contended path, ``_op_acquire_contended``.

        ``load``: the run start's checkpoint read (``_get_tuple_stmt``), sent after the
        acquisition in the same pipeline, before one Sync: one implicit transaction, so
        a run start costs the stock saver's one round trip. The read is a later
        statement, with its own snapshot (READ COMMITTED) taken once the acquisition
        holds the thread row's lock, which a fenced writer of an older lease waits on
        until the Sync commits and is then refused: the rows are the state this lease
        runs from. They come back as ``res["loaded"]`` only when the lease was taken
        (a busy or quarantined thread's are thrown away); a failed read rolls the
        acquisition back with it (nothing to hand back). (Both as one PL/pgSQL function
        call, no pipeline, was tried in issue 14: the client CPU it saved, ~0.06 ms,
        came back as backend CPU, +0.05 to +0.26 ms per invoke.)"""
        params = self._acquire_params(thread_id, owner, version, checkpoint_id, handoff)
        stmts = [Stmt(LEASE_ACQUIRE_SQL, params, fetch=True)]
        if load is not None:
            stmts.append(load)
        rows = yield Batch(stmts, final=True)
        if rows[0]:
            res = self._acquired(rows[0][0], rows[0][0]["checkpoint_id"])
            if load is not None:
                res["loaded"] = rows[1]
            return res
        return {"ok": False, "checkpoint_id": checkpoint_id, "contended": True}

    @_telemetry.instrument("lease_acquire")
    def _op_acquire_contended(
        self,
        thread_id: str,
        owner: str,
        version: str | None,
        checkpoint_id: str | None,
        handoff: _Handoff | None = None,
    ) -> Op[dict[str, Any]]:
        """The lease is held (or the thread quarantined): who holds it, and a takeover
        when the holder is a provably dead process of this machine."""
        params = self._acquire_params(thread_id, owner, version, checkpoint_id, handoff)
        rows = yield Batch([Stmt(THREAD_LEASE_ROW_SQL, (thread_id,), fetch=True)])
        row = rows[0][0] if rows[0] else {}
        holder = row.get("lease_owner")
        if row.get("status") == "quarantined" or not (
            self.takeover_dead_owners and owner_is_dead(holder)
        ):
            return {"ok": False, "checkpoint_id": checkpoint_id, **row}
        logger.warning(
            "thread %s: lease holder %s is a dead process of this machine and pid namespace; "
            "taking over", thread_id, holder,
        )
        params["dead_owner"] = holder
        _telemetry.count("leases_taken_over", reason="dead_owner")
        rows = yield Batch([Stmt(LEASE_ACQUIRE_SQL, params, fetch=True)])
        if not rows[0]:
            rows = yield Batch([Stmt(THREAD_LEASE_ROW_SQL, (thread_id,), fetch=True)])
            row = rows[0][0] if rows[0] else {}
            return {"ok": False, "checkpoint_id": checkpoint_id, **row}
        return self._acquired(rows[0][0], rows[0][0]["checkpoint_id"])

    @staticmethod
    def _acquired(row: Mapping[str, Any], checkpoint_id: str | None) -> dict[str, Any]:
        res = {"ok": True, "checkpoint_id": checkpoint_id, **row}
        memo = op_memo()
        if res.get("retried") and "prev" in memo:
            res["prev_status"], res["prev_version"] = memo["prev"]
        else:
            memo["prev"] = (res.get("prev_status"), res.get("prev_version"))
        return res

    def _op_release(
        self,
        lease: Lease,
        status: str,
        *,
        reset: bool,
        undo: bool,
        error: str | None,
        checkpoint_id: str | None = None,
        first: Sequence[Stmt] = (),
        head: str | None = None,
    ) -> Op[None]:
        # One autocommit pipeline (no BEGIN/COMMIT): one round trip at run end. RELEASE
        # matches owner and token, so a retry after a lost reply changes nothing.
        # ``head``: the run's last acknowledged root checkpoint, which must be on the
        # server (LEASE_RELEASE_CHECKED_SQL, issue 23).
        yield Batch(
            [
                *first,
                Stmt(
                    LEASE_RELEASE_SQL if head is None else LEASE_RELEASE_CHECKED_SQL,
                    {
                        "head": head,
                        "status": status,
                        "reset": reset,
                        "undo": undo,
                        # Sealed with an encrypting serializer (issue 27): it quotes state.
                        "error": _sealing.seal_text(_sealing.keyring_of(self.serde), error),
                        "checkpoint_id": checkpoint_id,
                        "thread_id": lease.thread_id,
                        "token": lease.token,
                        "owner": lease.owner,
                        # A finished run's release need not wait for its WAL flush
                        # (see LEASE_RELEASE_SQL: only a database crash could undo it,
                        # and a finished thread resumed runs nothing).
                        "async_commit": status == "done",
                    },
                )
            ],
            final=True,
        )

    def _op_abandon(self, lease: Lease) -> Op[None]:
        yield Batch(
            [
                Stmt(
                    LEASE_ABANDON_SQL,
                    {
                        "status": lease.prev_status or "stopped",
                        "version": lease.prev_version,
                        "thread_id": lease.thread_id,
                        "token": lease.token,
                        "owner": lease.owner,
                    },
                )
            ]
        )

    def _ensure_renewer(self) -> None:
        # Every run start calls this after adding its lease to the registry. A live
        # renewer that is not exiting sees that lease: it decides to exit only under
        # the lock, after finding the registry empty (renewer.run), so the lock is
        # needed only when it may be gone (issue 14: a lock per run start less).
        renewer = self._renewer
        if renewer is not None and renewer.is_alive():
            return
        with self._renewer_lock:
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = _Renewer(self)
                self._renewer.start()

    def _stop_renewer(self) -> None:
        with self._renewer_lock:
            if self._renewer is not None:
                self._renewer.stop()
                self._renewer = None

    def _confirm_lease(self, lease: Lease) -> None:
        if not lease.lost and time.monotonic() - lease.renewed_at > self.lease_ttl / 2:
            # The renewer (every ttl/3) fell behind: paused process, database outage.
            # Renew now or learn the lease is gone, before another step runs on it.
            self._ensure_renewer()
            renewer = self._renewer
            if renewer is not None:
                try:
                    renewer.renew_now([lease])
                except Exception as exc:
                    logger.warning("could not confirm the lease on thread %s: %s", lease.thread_id, exc)
                    if time.monotonic() - lease.renewed_at > self.lease_ttl:
                        lease.lost = True
        if lease.lost:
            raise LeaseLostError(lease.thread_id, lease.token)
