"""Whether a thread has work left, judged from its stored head checkpoint alone.

Retention needs to know whether a thread is finished. ``durable_threads.status`` says
so for threads this package ran with leases; a thread without a row (written by the
stock ``PostgresSaver`` before the package adopted the database, or by a saver with
``leases=False``) used to count as finished, so retention deleted threads that were
waiting on a human or had been killed mid-run (issue 11, defect 4). Here the status is
inferred from what LangGraph itself stores, without the graph:

* pending writes at the head checkpoint: an ``__interrupt__`` write means the thread
  waits on a human ('waiting'); an ``__error__`` write, a failed run ('error'); any
  other write, a step that was cut short ('running': work left);
* next tasks: LangGraph records in ``updated_channels`` the channels the last step
  updated, and the next step runs the nodes those channels trigger. Trigger channels
  are recognised by LangGraph's own names (``branch:to:<node>``, ``join:...``,
  ``__start__``, ``__pregel_tasks`` for ``Send``, the older ``start:``/``branch:``)
  and by having triggered a node before (they are the keys of ``versions_seen``); a
  trigger triggers only when it holds a value (it is stored inline or in a non-empty
  blob). Checkpoints older than ``updated_channels`` fall back on the channels that
  carry the checkpoint's newest version (one version per step), which can only err on
  the side of "work left".

Anything that cannot be read this way (no root checkpoint) counts as work left: a
thread is never deleted because it was not understood.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

INTERRUPT_CHANNEL = "__interrupt__"
ERROR_CHANNEL = "__error__"
_TRIGGER_NAMES = frozenset({"__start__", "__pregel_tasks"})
_TRIGGER_PREFIXES = ("branch:", "join:", "start:")

# The head (latest root checkpoint) of each thread: what decides whether work is left,
# without the channel values themselves (only which channels hold one). A field that
# is not a JSON object (a damaged row) yields no keys instead of failing the whole
# query; has_next_tasks counts unreadable versions as work left.
HEADS_SQL = """
WITH heads AS (
    -- One backward primary-key probe per thread (LIMIT 1), so the arrays below are
    -- computed for the heads only, not for every checkpoint of every thread.
    SELECT h.* FROM unnest(%s::text[]) AS t(thread_id)
    CROSS JOIN LATERAL (
        SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.checkpoint
        FROM checkpoints c
        WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = ''
        ORDER BY c.checkpoint_id DESC LIMIT 1
    ) AS h
)
SELECT c.thread_id, c.checkpoint_id,
       c.checkpoint -> 'channel_versions' AS channel_versions,
       c.checkpoint -> 'versions_seen' AS versions_seen,
       c.checkpoint -> 'updated_channels' AS updated_channels,
       ARRAY(SELECT jsonb_object_keys(c.checkpoint -> 'channel_values')
             WHERE jsonb_typeof(c.checkpoint -> 'channel_values') = 'object') AS inline_channels,
       ARRAY(SELECT b.channel FROM checkpoint_blobs b,
                    jsonb_each_text(c.checkpoint -> 'channel_versions') AS v
             WHERE jsonb_typeof(c.checkpoint -> 'channel_versions') = 'object'
               AND b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
               AND b.channel = v.key AND b.version = v.value AND b.type <> 'empty')
           AS blob_channels,
       ARRAY(SELECT DISTINCT w.channel FROM checkpoint_writes w
             WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
               AND w.checkpoint_id = c.checkpoint_id) AS write_channels
FROM heads c
"""


def _newest(versions: Iterable[Any]) -> Any:
    vals = [v for v in versions if v is not None]
    if not vals:
        return None
    if all(isinstance(v, int | float) for v in vals):
        return max(vals)
    return max(str(v) for v in vals)


def _node_seen(seen: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The nodes' entries of ``versions_seen``. LangGraph also keeps one under
    ``__interrupt__``: the versions of *every* channel when it last checked for an
    interrupt, not a node's triggers. Counted as one, it made every channel (``messages``,
    any state key) a trigger, so a finished thread that had ever been interrupted looked
    unfinished and retention kept it forever (found by tests/test_edges_machine.py)."""
    return [(n, s) for n, s in seen.items() if n != INTERRUPT_CHANNEL and isinstance(s, Mapping)]


def has_next_tasks(head: Mapping[str, Any]) -> bool:
    """Whether the next step of this head checkpoint would run a node (True when the
    checkpoint cannot be read this way: never delete what is not understood)."""
    versions = head.get("channel_versions")
    seen = head.get("versions_seen") or {}
    if not isinstance(versions, Mapping) or not isinstance(seen, Mapping):
        return True
    known = {c for n, s in _node_seen(seen) for c in s}
    holding = set(head.get("inline_channels") or ()) | set(head.get("blob_channels") or ())
    updated = head.get("updated_channels")
    if not isinstance(updated, list) or not updated:
        # Not recorded (update_state's checkpoints, older LangGraph), or empty, which
        # LangGraph reads the same way (it then checks every node). An empty list is
        # also what a migration wrote for a head that had none, and the migration bumps
        # the versions of the channels it changed, so "the channels at the newest
        # version" then names those instead of the pending trigger: retain deleted a
        # thread whose next node had not run (found by the chaos test's long run).
        # LangGraph's own rule decides too: a trigger holding a version a node it
        # triggers has not seen.
        if _unseen_trigger(versions, seen, holding, known):
            return True
        top = _newest(versions.values())
        updated = [c for c, v in versions.items() if top is not None and str(v) == str(top)]
    return any(
        (c in _TRIGGER_NAMES or c.startswith(_TRIGGER_PREFIXES) or c in known) and c in holding
        for c in updated
        if isinstance(c, str)
    )


def _unseen_trigger(
    versions: Mapping[str, Any], seen: Mapping[str, Any], holding: set[str], known: set[str]
) -> bool:
    """Whether a trigger channel holds a version one of the nodes it triggers has not
    seen (LangGraph's test when a checkpoint records no ``updated_channels``). The
    nodes a channel triggers are known from their ``versions_seen`` and, for
    ``branch:to:<node>`` and ``__start__``, from the name; a trigger none is known for
    counts as work left."""
    for c, version in versions.items():
        if not isinstance(c, str) or c not in holding:
            continue
        if not (c in _TRIGGER_NAMES or c.startswith(_TRIGGER_PREFIXES) or c in known):
            continue
        nodes = {n for n, s in _node_seen(seen) if c in s}
        if c.startswith("branch:to:"):
            nodes.add(c[len("branch:to:") :])
        if c == "__start__":
            nodes.add("__start__")
        if c == "__pregel_tasks" or not nodes:
            return True
        for n in nodes:
            got = seen.get(n)
            if not isinstance(got, Mapping) or got.get(c) is None or str(got[c]) != str(version):
                return True
    return False


def inferred_status(head: Mapping[str, Any] | None) -> str:
    """'done', 'waiting', 'error' or 'running' (work left) for a head row of HEADS_SQL."""
    if head is None:
        return "running"
    writes = set(head.get("write_channels") or ())
    if INTERRUPT_CHANNEL in writes:
        return "waiting"
    if ERROR_CHANNEL in writes:
        return "error"
    if writes or has_next_tasks(head):
        return "running"
    return "done"


def effective_status(row_status: str | None, head: Mapping[str, Any] | None) -> str:
    """The status retention acts on. No row: the checkpoint decides. A row saying
    'done' whose head shows work left (a run without leases, an edit with
    ``update_state`` since) is not done either. Any other row status stands."""
    if row_status is None or row_status == "done":
        return inferred_status(head)
    return row_status


__all__ = ["HEADS_SQL", "effective_status", "has_next_tasks", "inferred_status"]
