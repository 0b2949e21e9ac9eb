"""The artifact closure of envelopes, and the per-thread artifact lock: shared by
retention (ref recompute, gc), archive (dump, restore) and migration undo (backup check).

Its own module so those three import it without importing each other.
"""

from __future__ import annotations

from typing import Any

from langgraph_durable import _sql
from langgraph_durable._io import Batch, Op, Stmt
from langgraph_durable._view import SaverView


def artifact_lock(thread_id: str) -> Stmt:
    return Stmt(_sql.ARTIFACT_LOCK_SQL, (_sql.ARTIFACT_LOCK_CLASS, thread_id))


def op_closure(saver: SaverView, pairs: list[tuple[str, bytes]], where: dict[str, Any]) -> Op[set[bytes]]:
    """Every digest the envelopes reference, chunk children included (chunk artifacts
    are fetched, verified and expanded; a chunk that is gone has no children to keep)."""
    codec = saver.codec
    local: dict[bytes, bytes] = {}
    gone: set[bytes] = set()
    while True:
        seen, need = codec.referenced(pairs, local)
        need -= gone
        if not need:
            return seen
        rows = yield Batch(
            [Stmt(_sql.FETCH_ARTIFACTS_SQL, (sorted(need),), fetch=True, prepare=False)]
        )
        found = [(r["digest"], r["data"]) for r in rows[0]]
        codec.accept(found, serde=saver.serde, local=local, **where)
        gone |= need - {bytes(d) for d, _ in found}
