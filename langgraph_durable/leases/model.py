"""The lease model: ``Lease``, the run's lease in context (``_RUN_LEASE``), the recovery
worker's hand-off (``claim_handoff``) and the process's lease registry."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph_durable.leases.renewer import _Renewer


@dataclass
class Lease:
    """A run's hold on a thread. Puts for the thread are fenced by ``token``."""

    thread_id: str
    owner: str
    token: int
    attempts: int
    checkpoint_id: str | None
    version: str | None
    lost: bool = False
    last_error: str | None = None
    # Set when the run's exit released the lease: a context that still carries this
    # lease (see _RUN_LEASE) then falls back to the registry instead of fencing with it.
    released: bool = False
    # Monotonic time just before the lease was last confirmed by the database (acquire
    # or renewal). Used to re-confirm a lease the renewer may have failed to keep alive
    # (process paused, database unreachable) before a new step starts.
    renewed_at: float = field(default_factory=time.monotonic)
    # Status and graph version of the thread before this run took it, restored when the
    # run never started (version mismatch, failed migration): a waiting thread whose
    # resume was refused stays waiting instead of looking crashed.
    prev_status: str | None = None
    prev_version: str | None = None
    # The run's last acknowledged checkpoint per namespace (a put that returned). With
    # ``checkpoint_id`` (what the run started from, read from the server) these are the
    # checkpoints the server had; one of them missing is acknowledged work lost (issue
    # 23: asynchronous failover). Set by _op_put, read by _await_checkpoint.
    acked: dict[str, str] = field(default_factory=dict)
    # The AcknowledgedWorkLostError this run hit (its writes stop there; the release
    # hands the thread back as 'stopped', recorded in durable_audit).
    work_lost: Any = None
    # The run's start found no checkpoint to resume (a new thread, or a config naming a
    # checkpoint id the thread does not have: a reused config after delete_thread,
    # another thread's id). LangGraph then starts fresh and its first put names the
    # caller's id as its parent: not this run's acknowledged work (review23).
    fresh: bool = False
    # An operator asked this run to stop (issue 25): learnt from a put (its rowcount) or
    # a renewal, acted on at the next step boundary (core.base.get_next_version).
    cancel: bool = False
    # The run persists only at its exit (durability="exit"): a cancel is not acted on
    # mid-run (core.base.get_next_version says why), the run finishes.
    exit_durability: bool = False
    cancel_ignored: bool = False  # its WARNING said once

    def acknowledged(self, checkpoint_id: str) -> bool:
        """Was ``checkpoint_id`` on the server for this run (loaded or acknowledged)?"""
        return checkpoint_id == self.checkpoint_id or checkpoint_id in self.acked.values()


# The lease of the root run executing in this context. LangGraph copies the context
# into every task and background put it submits (BackgroundExecutor uses
# copy_context(), asyncio tasks copy theirs), so puts, subgraph puts and
# get_next_version calls of a run see exactly that run's lease. A registry lookup by
# thread_id alone would hand a zombie run of this process the lease a newer run of the
# same process took after the zombie's expired, and its late writes would pass the fence.
_RUN_LEASE: ContextVar[Lease | None] = ContextVar("langgraph_durable_run_lease", default=None)


@dataclass(frozen=True)
class _Handoff:
    thread_id: str
    owner: str
    token: int


# The lease a recovery worker claimed, handed to the run it starts in this context (see
# claim_handoff). A ContextVar, never a configurable key: config is user input, and the
# owner string is public (ThreadBusyError.owner, `threads status`), so a key in config
# would let any caller take over a live lease. The fencing token must match too: a
# hand-off is good for the one acquisition that follows the claim.
_HANDOFF: ContextVar[_Handoff | None] = ContextVar("langgraph_durable_handoff", default=None)


@contextmanager
def claim_handoff(thread_id: str, owner: str, token: int) -> Iterator[None]:
    """Runs started in this block on ``thread_id`` take over the lease ``owner`` holds
    with ``token`` (the recovery worker's claim) instead of finding the thread busy."""
    reset = _HANDOFF.set(_Handoff(str(thread_id), str(owner), int(token)))
    try:
        yield
    finally:
        _HANDOFF.reset(reset)


class _RenewerSlot:
    """The lease renewer shared by a saver and its clones, and the lock guarding it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.renewer: _Renewer | None = None


class _LeaseRegistry:
    """Leases held by this process, shared by a saver and its ``with_allowlist`` clones."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_thread: dict[str, Lease] = {}
        # id(Runtime) -> (that Runtime, kept alive so its id is not reused, lease): the
        # run each LangGraph Runtime object belongs to (see bind_runtime).
        self.by_runtime: dict[int, tuple[Any, Lease]] = {}
        # id(Lease) -> the by_runtime keys bound to it: a release removes its own
        # bindings without walking every other run's (issue 14: remove() scanned the
        # whole map, under the lock, at every run end of every concurrent run).
        self.by_lease: dict[int, list[int]] = {}

    def get(self, thread_id: str) -> Lease | None:
        with self.lock:
            return self.by_thread.get(thread_id)

    def add(self, lease: Lease) -> None:
        with self.lock:
            self.by_thread[lease.thread_id] = lease

    def remove(self, lease: Lease) -> None:
        with self.lock:
            if self.by_thread.get(lease.thread_id) is lease:
                del self.by_thread[lease.thread_id]
            for key in self.by_lease.pop(id(lease), ()):
                entry = self.by_runtime.get(key)
                # A key rebound since to another lease is that lease's now.
                if entry is not None and entry[1] is lease:
                    del self.by_runtime[key]

    def bind_runtime(self, runtime: Any, lease: Lease) -> None:
        """Remember that writes whose config carries ``runtime`` are ``lease``'s run.
        LangGraph submits some writes from a finished task's done-callback, on an
        executor thread whose context is not the run's (so _RUN_LEASE is unset there);
        their config still carries the run's ``__pregel_runtime`` object, made anew for
        every invoke/stream call (and for every subgraph call, bound at its start). An
        object in memory, not a value a caller can put into a config from outside."""
        if runtime is None:
            return
        with self.lock:
            if not lease.released:
                self.by_runtime[id(runtime)] = (runtime, lease)
                self.by_lease.setdefault(id(lease), []).append(id(runtime))

    def for_runtime(self, runtime: Any, thread_id: str) -> Lease | None:
        if runtime is None:
            return None
        with self.lock:
            entry = self.by_runtime.get(id(runtime))
        if entry is None or entry[0] is not runtime:
            return None
        lease = entry[1]
        return None if lease.released or lease.thread_id != thread_id else lease

    def snapshot(self) -> list[Lease]:
        with self.lock:
            return [lease for lease in self.by_thread.values() if not lease.lost]
