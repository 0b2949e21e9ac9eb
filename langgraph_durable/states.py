"""One taxonomy of thread states, for every view of ``durable_threads`` (issue 13).

A thread's *status* is the ``durable_threads.status`` column the saver writes; its
*state* is what an operator needs to know, derived from the status and the lease:

* ``running``: a live lease (some process is executing it now), whatever the status;
* ``recoverable``: no live lease and a status in ``RESUMABLE_STATUSES`` (its worker
  died, it was cancelled, or it was submitted and waits for a worker) or ``error``
  (the last run raised; resumed until the poison limit quarantines it):
  ``invoke(None, config)`` or a recovery worker picks it up;
* ``waiting`` (interrupted, waits for ``Command(resume=...)``), ``quarantined``, ``done``:
  the status itself;
* ``untracked``: checkpoints written without this package's run tracking (no row).

The counts of the recovery view (``recovery.status_counts``, the queue-depth gauge)
refine ``recoverable`` into ``recoverable``, ``error`` (the last run raised) and
``orphaned`` (its run died before a first checkpoint: nothing to resume) and do not
look at untracked threads; ``inspection.thread_status_counts`` reports ``error`` as a
part of ``recoverable``. Both classify the statuses with the constants below.
"""

from __future__ import annotations

# The statuses the saver writes.
STATUSES = ("running", "stopped", "queued", "waiting", "done", "error", "quarantined")

# Statuses a worker resumes when no live lease holds the thread (``recover_stopped``
# decides about ``stopped``); ``error`` is resumed too, with backoff.
RESUMABLE_STATUSES = ("running", "stopped", "queued")
RECOVERABLE_STATUSES = (*RESUMABLE_STATUSES, "error")

# Terminal or waiting statuses: the state is the status.
SETTLED_STATUSES = ("waiting", "done", "quarantined")

# The operator's view: one state per thread (``threads list/show/status``).
STATES = ("running", "recoverable", "waiting", "quarantined", "done", "untracked")

# The recovery view's kinds (``status_counts``).
STATUS_KINDS = ("running", "recoverable", "waiting", "quarantined", "done", "error", "orphaned")


def state_of(status: str | None, live_lease: bool) -> str:
    """The state of a thread with this durable_threads status (``None``: no row)."""
    if status is None:
        return "untracked"
    if status == "quarantined":
        return "quarantined"
    if live_lease:
        return "running"
    if status in RECOVERABLE_STATUSES:
        return "recoverable"
    return status


def state_case_sql(alias: str = "t") -> str:
    """``state_of`` as a SQL CASE over ``durable_threads`` (``alias``; a NULL
    ``thread_id``: no row), so a status filter runs before LIMIT."""
    recoverable = ", ".join(f"'{s}'" for s in RECOVERABLE_STATUSES)
    return f"""
CASE
    WHEN {alias}.thread_id IS NULL THEN 'untracked'
    WHEN {alias}.status = 'quarantined' THEN 'quarantined'
    WHEN {alias}.lease_owner IS NOT NULL AND {alias}.lease_expires_at > now() THEN 'running'
    WHEN {alias}.status IN ({recoverable}) THEN 'recoverable'
    ELSE {alias}.status
END
"""


__all__ = [
    "RECOVERABLE_STATUSES",
    "RESUMABLE_STATUSES",
    "SETTLED_STATUSES",
    "STATES",
    "STATUSES",
    "STATUS_KINDS",
    "state_case_sql",
    "state_of",
]
