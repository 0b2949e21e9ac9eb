"""A thread's artifact reference rows: the closure of its envelopes (chunk children
included), the per-thread artifact lock, and recomputing the rows from what the thread
still holds.

Shared by the saver (delete, prune), retention (recompute, gc), archive (dump, restore)
and migration undo (backup check): its own module below all of them, so they import it
without importing each other.
"""

from __future__ import annotations

import logging
from typing import Any

from langgraph_durable._io import AfterCommit, Batch, Op, Stmt
from langgraph_durable._view import RefsView
from langgraph_durable.artifacts import REF_TYPE
from langgraph_durable.errors import CheckpointLoadError
from langgraph_durable.sql.artifacts import (
    ARTIFACT_LOCK_CLASS,
    ARTIFACT_LOCK_SQL,
    FETCH_ARTIFACTS_SQL,
)
from langgraph_durable.sql.retention import (
    BLOB_CHECKPOINT_SQL,
    DROP_REFS_SQL,
    REPAIR_REFS_SQL,
    THREAD_ENVELOPES_SQL,
)

logger = logging.getLogger("langgraph_durable")


def artifact_lock(thread_id: str) -> Stmt:
    return Stmt(ARTIFACT_LOCK_SQL, (ARTIFACT_LOCK_CLASS, thread_id))


def op_closure(saver: RefsView, pairs: list[tuple[str, bytes]], where: dict[str, Any]) -> Op[set[bytes]]:
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
            [Stmt(FETCH_ARTIFACTS_SQL, (sorted(need),), fetch=True, prepare=False)]
        )
        found = [(r["digest"], r["data"]) for r in rows[0]]
        codec.accept(found, serde=saver.serde, local=local, **where)
        gone |= need - {bytes(d) for d, _ in found}


def op_recompute_locked(saver: RefsView, thread_id: str) -> Op[int]:
    """Raises ``CheckpointLoadError`` when an envelope or chunk does not decode: what it
    references is unknown then, so no reference row may be dropped."""
    rows = yield Batch(
        [Stmt(THREAD_ENVELOPES_SQL, (thread_id, REF_TYPE) * 3, fetch=True, prepare=False)]
    )
    where = {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": None}
    pairs = []
    for r in rows[0]:
        pair = (REF_TYPE, bytes(r["blob"]))
        try:
            saver.codec.referenced([pair])
        except Exception as exc:  # damaged bytes: name the checkpoint that holds them
            cid = r["checkpoint_id"]
            if r["version"] is not None:
                at = yield Batch(
                    [
                        Stmt(
                            BLOB_CHECKPOINT_SQL,
                            (thread_id, r["checkpoint_ns"], r["channel"], r["version"]),
                            fetch=True,
                        )
                    ]
                )
                cid = at[0][0]["checkpoint_id"] if at[0] else None
            kind = "channel" if r["version"] is not None else "pending write of channel"
            raise CheckpointLoadError(
                f"cannot decode the artifact envelope of {kind} {r['channel']!r} in checkpoint "
                f"{cid!r} of thread {thread_id!r}: {type(exc).__name__}: {exc}",
                thread_id=thread_id,
                checkpoint_ns=r["checkpoint_ns"],
                checkpoint_id=cid,
            ) from exc
        pairs.append(pair)
    keep = yield from op_closure(saver, pairs, where)
    digests = sorted(keep)
    out = yield Batch(
        [
            Stmt(DROP_REFS_SQL, (thread_id, digests), fetch=True, prepare=False),
            Stmt(REPAIR_REFS_SQL, (thread_id, digests), prepare=False),
        ]
    )
    yield AfterCommit(lambda: saver._known_refs.forget_thread(thread_id))
    return int(out[0][0]["n"])


def op_recompute_refs(saver: RefsView, thread_id: str) -> Op[int]:
    """Recompute one thread's reference rows from its remaining blobs and writes
    (under its exclusive artifact lock). Returns the number of rows dropped. A thread
    with a damaged envelope keeps every row (logged; 0 dropped): what it references is
    unknown, and dropping a row it needs would let GC delete live data."""
    tid = str(thread_id)
    yield Batch([artifact_lock(tid)])
    try:
        return (yield from op_recompute_locked(saver, tid))
    except CheckpointLoadError as exc:
        logger.error("thread %s: reference rows kept as they are: %s", tid, exc)
        return 0
