"""Leases whose owner is a provably dead process of this machine, found outside a run.

A run start takes such a lease over at once (``LeaseOps._op_acquire_contended``, judged
by ``owners.owner_is_dead``). The same judgement, made the same way, serves everything
else that looks at leases without starting a run: the recovery workers' claim (so a
worker picks the thread up as soon as ``invoke`` would) and the operator's views
(``threads status/list/show``, the console), which show such a lease as what it is,
``recoverable``, instead of ``running``. The candidates come from one bounded, indexed
statement (``LOCAL_LIVE_LEASES_SQL``); the judgement is made here, in Python, where the
process table is."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping
from typing import Any

from langgraph_durable._io import Batch, Op, Stmt
from langgraph_durable.leases.owners import owner_is_dead
from langgraph_durable.sql.threads import EXPIRE_DEAD_LEASE_SQL, LOCAL_LIVE_LEASES_SQL

# How many live leases one look scans at most (soonest expiry first, see the SQL).
SCAN_LIMIT = 500


def local_prefix() -> str:
    """The prefix of every owner id this machine makes (``host:``)."""
    return socket.gethostname() + ":"


def params(scan: int = SCAN_LIMIT) -> dict[str, Any]:
    return {"scan": int(scan), "prefix": local_prefix()}


def dead_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows (``thread_id``, ``status``, ``lease_owner``) whose owner is provably
    dead; each owner is judged once."""
    judged: dict[str, bool] = {}
    out = []
    for row in rows:
        owner = row.get("lease_owner")
        if not owner:
            continue
        if owner not in judged:
            judged[owner] = owner_is_dead(owner)
        if judged[owner]:
            out.append(dict(row))
    return out


def op_dead_leases(scan: int = SCAN_LIMIT) -> Op[list[dict[str, Any]]]:
    """The live leases of this machine whose owner is dead (one statement)."""
    rows = yield Batch([Stmt(LOCAL_LIVE_LEASES_SQL, params(scan), fetch=True)])
    return dead_rows(rows[0])


def op_expire_if_dead(thread_id: str, owner: str | None) -> Op[bool]:
    """End ``owner``'s lease on the thread when it is a provably dead process of this
    machine (``EXPIRE_DEAD_LEASE_SQL``); True when it did, so a refused write outside a
    run is retried once instead of waiting out lease_ttl."""
    if not owner or not owner_is_dead(owner):
        return False
    yield Batch([Stmt(EXPIRE_DEAD_LEASE_SQL, (thread_id, owner))])
    return True


def dead_owner_note(owner: str | None) -> str | None:
    """``owner pid N on host H is dead; takeover pending`` when ``owner`` is provably
    dead, else None (alive, another machine, or not an id this package judges)."""
    if not owner or not owner_is_dead(owner):
        return None
    host, pid = owner.split(":")[:2]
    return f"owner pid {pid} on host {host} is dead; takeover pending"
