"""Read-only inspection of threads, checkpoints and storage: the data behind the CLI.

Every function takes a sync saver (``DurablePostgresSaver``) and returns plain,
JSON-able dicts and lists (timestamps as ISO strings), so scripts and notebooks can use
them as they are. Metadata-only questions (lists, counts, sizes) are answered with SQL
on the stock tables and ours; channel *values* are always decoded through the saver
(``saver.get_tuple``), so artifact references re-hydrate and integrity checks apply.
Nothing here takes a lease or writes a row.

Thread *state* is derived from ``durable_threads`` as ``langgraph_durable.states``
defines it for every view: ``running`` (a live lease), ``recoverable`` (no live lease;
status running, stopped, queued or error: ``invoke(None, config)`` or a recovery worker
picks it up), ``waiting``, ``quarantined``, ``done``, and ``untracked`` (checkpoints
written without this package's run tracking: by the stock saver, or with
``leases=False``).
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import orjson
import ormsgpack
from psycopg.rows import dict_row, tuple_row

from langgraph_durable import _sealing
from langgraph_durable.artifacts import (
    _CHUNK_REF,
    _ELEMENT_REF,
    _INLINE,
    _NESTED,
    REF_TYPE,
    _envelope_items,
    _payload_items,
)
from langgraph_durable.errors import (
    CheckpointLoadError,
    ConfigurationError,
    DecryptionError,
    InspectError,
)
from langgraph_durable.keyring import decryption_error
from langgraph_durable.leases.dead import dead_owner_note, dead_rows
from langgraph_durable.leases.dead import params as dead_params
from langgraph_durable.sql.inspection import (
    ARTIFACT_DATA_SQL,
    ARTIFACT_SIZES_SQL,
    ARTIFACT_TOTALS_SQL,
    ARTIFACT_USERS_SQL,
    BLOB_SIZES_SQL,
    CHECKPOINT_COUNT_SQL,
    CHECKPOINT_PREFIX_SQL,
    CHECKPOINT_VERSIONS_SQL,
    DATABASE_SIZE_SQL,
    HISTORY_SQL,
    LEDGER_BY_STATUS_SQL,
    NTH_CHECKPOINT_SQL,
    QUARANTINE_ROW_SQL,
    REF_BLOBS_SQL,
    REF_WRITES_SQL,
    TABLE_OID_SQL,
    TABLE_SIZES_SQL,
    THREAD_LIST_SQL,
    THREAD_ROW_SQL,
    THREAD_STATE_COUNTS_SQL,
    UNTRACKED_COUNT_SQL,
    WRITES_SQL,
    table_count_sql,
)
from langgraph_durable.sql.threads import LOCAL_LIVE_LEASES_SQL
from langgraph_durable.states import RECOVERABLE_STATUSES, STATES, STATUSES, state_of

if TYPE_CHECKING:
    from psycopg import Connection

    from langgraph_durable.saver import DurablePostgresSaver

__all__ = [
    "STATES",
    "InspectError",
    "diff_checkpoints",
    "is_internal",
    "open_last_errors",
    "next_nodes",
    "node_of",
    "preview",
    "list_threads",
    "mark_dead_owner",
    "resolve_checkpoint",
    "show_thread",
    "storage_stats",
    "takeover_pending",
    "thread_history",
    "thread_status_counts",
]

STOCK_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations")
DURABLE_TABLES = (
    "durable_threads",
    "durable_quarantine",
    "durable_artifacts",
    "durable_artifact_refs",
    "durable_ledger",
    "durable_migrations",
)
# Channels LangGraph uses for control flow rather than state.
_INTERNAL_PREFIXES = ("branch:to:", "join:", "__")
_PULL_PREFIX = "~__pregel_pull, "



# ------------------------------------------------------------------ helpers
def _rows(conn: Connection[Any], query: Any, params: Any = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def _plain(value: Any) -> Any:
    """JSON-able form of a row value (timestamps as ISO strings, bytes as hex)."""
    if isinstance(value, _dt.datetime | _dt.date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value


def _plain_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) for k, v in row.items()}


def node_of(task_path: str | None) -> str | None:
    """The node a task ran, from its stored task path (``~__pregel_pull, NODE``);
    None for push tasks (Send, @task), whose path does not name the node."""
    if task_path and task_path.startswith(_PULL_PREFIX):
        return task_path[len(_PULL_PREFIX) :]
    return None


def is_internal(channel: str) -> bool:
    return channel.startswith(_INTERNAL_PREFIXES)


def _size(saver: DurablePostgresSaver, value: Any) -> int | None:
    """Serialized size with the saver's serializer: what the stock saver would store."""
    try:
        return len(saver.serde.dumps_typed(value)[1])
    except Exception:  # an inspection never fails on one odd value
        return None


def preview(value: Any, width: int = 60) -> str:
    """A one-line human summary of a channel value."""
    if isinstance(value, str):
        text = (
            repr(value)
            if len(value) <= width
            else repr(value[:width]) + f"... ({len(value)} chars)"
        )
    elif isinstance(value, list | tuple | set | frozenset):
        text = f"{type(value).__name__}[{len(value)}]"
        if value:
            first = next(iter(value))
            text += " " + preview(first, max(10, width - len(text) - 1))
    elif isinstance(value, dict):
        keys = ", ".join(str(k) for k in list(value)[:6])
        text = f"dict[{len(value)}] {{{keys}{', ...' if len(value) > 6 else ''}}}"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _version_gt(a: Any, b: Any) -> bool:
    if b is None:
        return a is not None
    try:
        return bool(a > b)
    except TypeError:  # mixed int/str versions (never within one saver)
        return str(a) > str(b)


def next_nodes(checkpoint: Mapping[str, Any]) -> list[str]:
    """Nodes a resume would run, read off a StateGraph checkpoint without the graph.

    A node is triggered when one of its trigger channels (``branch:to:NODE``, or a
    complete ``join:A+B:NODE`` barrier) has a version newer than the one the node last
    saw; Send packets in ``__pregel_tasks`` name their target node. Exact for graphs
    built with ``StateGraph``; ``graph.get_state(config).next`` is the authority.
    """
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}
    seen: Mapping[str, Mapping[str, Any]] = checkpoint.get("versions_seen") or {}
    values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
    out: list[str] = []
    for channel, version in versions.items():
        node: str | None = None
        if channel.startswith("branch:to:"):
            node = channel[len("branch:to:") :]
        elif channel.startswith("join:"):
            _, _, rest = channel.partition(":")
            names, _, node = rest.rpartition(":")
            arrived = values.get(channel)
            if not isinstance(arrived, set | frozenset | list) or set(arrived) != set(
                names.split("+")
            ):
                node = None
        # Only an available channel triggers: a consumed trigger leaves channel_values
        # (its version still moves), exactly as LangGraph's own _triggers check.
        if (
            node
            and node not in out
            and channel in values
            and _version_gt(version, seen.get(node, {}).get(channel))
        ):
            out.append(node)
    for packet in values.get("__pregel_tasks") or ():
        node = getattr(packet, "node", None)
        if node and node not in out:
            out.append(str(node))
    return out


# ------------------------------------------------------------------ threads
def open_last_errors(saver: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows' ``last_error`` in the clear, in place (sealed with an encrypting
    serializer, issue 27): opened with the saver's keyring, ``"<encrypted>"`` when it
    has none that opens it. For listings that show the error beside each thread."""
    ring = _sealing.keyring_of(saver.serde)
    for row in rows:
        if row.get("last_error") is not None:
            row["last_error"] = _sealing.open_text(
                ring, row["last_error"], thread_id=row.get("thread_id"), where="last_error", strict=False,
                lenient=True,
            )
    return rows


def list_threads(
    saver: DurablePostgresSaver,
    *,
    status: str | None = None,
    prefix: str | None = None,
    limit: int = 100,
    after: str | None = None,
) -> list[dict[str, Any]]:
    """One page of threads in ``thread_id`` order, those after ``after`` (keyset
    pagination: pass the last ``thread_id`` of a page to get the next one). A page
    costs what it returns, whatever the history (see ``THREAD_LIST_SQL``).

    ``status`` filters on the derived state (running, recoverable, waiting,
    quarantined, done, untracked) or on the raw ``durable_threads.status`` (error,
    stopped...). ``row_bytes`` are the thread's own rows (checkpoints, blobs, writes);
    ``artifact_bytes`` the stored size of the artifacts it references, which other
    threads may share.
    """
    check_state_filter(status)
    with saver.connection() as conn:
        params = {"status": status, "prefix": prefix, "limit": int(limit), "after": after,
                  "dead": dead_owners(conn, status)}
        rows = _rows(conn, THREAD_LIST_SQL, params)
    out = []
    open_last_errors(saver, rows)
    for row in rows:
        item = mark_dead_owner(_plain_row(row))
        item["bytes"] = int(row["row_bytes"]) + int(row["artifact_bytes"])
        # A dead owner's lease is filtered in SQL (STATE_FILTER_SQL); one judged dead
        # between the two statements is still not shown as running.
        if status != "running" or item["state"] == "running":
            out.append(item)
    return out


def check_state_filter(status: str | None) -> None:
    """A state or raw status a page may be filtered on; anything else (a typo) is a
    ConfigurationError naming the choices, not an empty page (newcomer review)."""
    if status is not None and status not in STATES and status not in STATUSES:
        choices = ", ".join(dict.fromkeys((*STATES, *STATUSES)))
        raise ConfigurationError(f"unknown thread state {status!r}: use one of {choices}", status=status)


def dead_owners(conn: Any, status: str | None) -> list[str]:
    """The owners of this machine's live leases that are dead processes, for a page
    filtered on running or recoverable (``STATE_FILTER_SQL``'s ``dead``); [] for any
    other filter (nothing asked, no statement sent)."""
    if status not in ("running", "recoverable"):
        return []
    rows = dead_rows(_rows(conn, LOCAL_LIVE_LEASES_SQL, dead_params()))
    return sorted({str(r["lease_owner"]) for r in rows})


def mark_dead_owner(row: dict[str, Any]) -> dict[str, Any]:
    """A thread row (``state``, ``lease_owner``) as an operator must see it: a live
    lease whose owner is a provably dead process of this machine (the check ``invoke``
    makes before taking it over at once, ``owners.owner_is_dead``) is not ``running``
    but ``recoverable``, with ``note`` saying so ("owner pid N on host H is dead;
    takeover pending"). ``note`` is None otherwise. Judged on this machine only: a
    dead owner elsewhere shows as running until its lease expires."""
    row["note"] = None
    if row.get("state") == "running":
        note = dead_owner_note(row.get("lease_owner"))
        if note is not None:
            row["state"], row["note"] = "recoverable", note
    return row


def takeover_pending(saver: DurablePostgresSaver) -> list[dict[str, Any]]:
    """The live leases of this machine whose owner is a dead process: ``thread_id``,
    ``status``, ``lease_owner``, ``note``. One bounded, indexed statement
    (``LOCAL_LIVE_LEASES_SQL``, the recovery workers' look too)."""
    with saver.connection() as conn:
        rows = dead_rows(_rows(conn, LOCAL_LIVE_LEASES_SQL, dead_params()))
    return [{**r, "note": dead_owner_note(r["lease_owner"])} for r in rows]


def thread_status_counts(saver: DurablePostgresSaver, *, untracked: bool = True) -> dict[str, int]:
    """How many threads are in each state (the recovery view).

    Keys: every entry of ``STATES`` plus ``error`` (threads whose last run raised; they
    are counted in ``recoverable`` too) and ``total``. ``untracked=False`` skips the
    only part that grows with the number of threads (it then reports 0 untracked).
    """
    counts = dict.fromkeys(STATES, 0)
    counts["error"] = 0
    with saver.connection() as conn:
        rows = _rows(conn, THREAD_STATE_COUNTS_SQL)
        n_untracked = _rows(conn, UNTRACKED_COUNT_SQL)[0]["n"] if untracked else 0
    for row in rows:
        status, n, live = row["status"], int(row["n"]), int(row["live"])
        counts["running"] += live
        # The rest by status, as THREAD_STATE_CASE_SQL classifies a row without a live lease.
        state = state_of(status, live_lease=False)
        counts[state] = counts.get(state, 0) + n - live
        if status == "error":
            counts["error"] += n
    # Live leases whose owner is provably dead are recoverable, not running (see
    # mark_dead_owner).
    for r in takeover_pending(saver):
        if r["status"] in RECOVERABLE_STATUSES and counts["running"] > 0:
            counts["running"] -= 1
            counts["recoverable"] += 1
    counts["untracked"] = int(n_untracked)
    counts["total"] = sum(counts[s] for s in counts if s not in ("error", "total"))
    return counts


def _thread_row(conn: Connection[Any], thread_id: str) -> dict[str, Any] | None:
    rows = _rows(conn, THREAD_ROW_SQL, (thread_id,))
    return rows[0] if rows else None


def _state_of(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return state_of(None, live_lease=False)
    expires = row.get("lease_expires_in")
    live = bool(row.get("lease_owner")) and expires is not None and expires > 0
    if live and dead_owner_note(row.get("lease_owner")) is not None:
        live = False  # its owner is dead: recoverable (see mark_dead_owner)
    return state_of(str(row["status"]), live_lease=live)


def show_thread(
    saver: DurablePostgresSaver, thread_id: str, *, checkpoint_ns: str = "", values: bool = False
) -> dict[str, Any]:
    """The latest state of a thread: channels (type, logical and stored sizes, a
    preview), next nodes, tasks already finished in the current step (their writes are
    restored on resume, not re-run), interrupts, lease, quarantine and attempts.

    ``values``: also the decoded values (each channel's ``value``, each interrupt's and
    error's ``payload``), for a caller that renders them (the console); not JSON-able."""
    thread_id = str(thread_id)
    out = _thread_facts(saver, thread_id, checkpoint_ns)
    try:
        saved = saver.get_tuple(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns}}
        )
    except (CheckpointLoadError, DecryptionError) as exc:  # what SQL alone can tell, and why not more
        out["load_error"] = {
            "error": type(exc).__name__,
            "message": str(exc),
            "checkpoint_id": exc.fields.get("checkpoint_id"),
            # issue 27: encrypted and no (or another) key given, not damage
            "encrypted": isinstance(exc, DecryptionError),
        }
        out["checkpoint"] = {"id": exc.fields.get("checkpoint_id")}
        return out
    if saved is None:
        return out
    checkpoint = saved.checkpoint
    cid = saved.config["configurable"]["checkpoint_id"]
    md = dict(saved.metadata or {})
    out["graph_version"] = out["graph_version"] or md.get("graph_version")
    out["checkpoint"] = {
        "id": cid,
        "parent_id": (saved.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
        "step": md.get("step"),
        "source": md.get("source"),
        "graph_version": md.get("graph_version"),
        "ts": checkpoint.get("ts"),
    }
    with saver.connection() as conn:
        blob_rows = _rows(conn, BLOB_SIZES_SQL, (thread_id, checkpoint_ns))
        write_rows = _rows(conn, WRITES_SQL, (thread_id, checkpoint_ns, [cid]))
    out["channels"] = _channel_report(
        saver, cast(Mapping[str, Any], checkpoint), blob_rows, keep_values=values
    )
    _task_report(out, write_rows, saved.pending_writes or (), keep_values=values)
    # Like LangGraph's StateSnapshot.next: a task whose writes are saved will not run
    # again on resume, so it is listed as finished, not as next.
    finished = {t["node"] for t in out["finished_tasks"]}
    out["next"] = [
        n for n in next_nodes(cast(Mapping[str, Any], checkpoint)) if n not in finished
    ]
    return out


def _thread_facts(saver: DurablePostgresSaver, thread_id: str, checkpoint_ns: str) -> dict[str, Any]:
    """What SQL alone tells about a thread (its durable_threads row, quarantine,
    checkpoint count, ledger), as ``show_thread``'s report with the checkpoint parts
    empty. ``InspectError`` if there is no such thread."""
    with saver.connection() as conn:
        row = _thread_row(conn, thread_id)
        quarantine = _rows(conn, QUARANTINE_ROW_SQL, (thread_id,))
        count = _rows(conn, CHECKPOINT_COUNT_SQL, (thread_id, checkpoint_ns))[0]["n"]
        ledger = _rows(conn, LEDGER_BY_STATUS_SQL, (thread_id,))
    if row is None and count == 0:
        raise InspectError(f"thread {thread_id!r} not found", thread_id=thread_id)
    ring = _sealing.keyring_of(saver.serde)
    out: dict[str, Any] = {
        "thread_id": thread_id,
        "status": row["status"] if row else None,
        "state": _state_of(row),
        "graph_version": row["graph_version"] if row else None,
        "attempts": row["attempts"] if row else None,
        "attempts_checkpoint_id": row["attempts_checkpoint_id"] if row else None,
        # Opened with the saver's keyring (issue 27); "<encrypted>" without one.
        "last_error": _sealing.open_text(
            ring, row["last_error"], thread_id=thread_id, where="last_error", strict=False, lenient=True
        ) if row else None,
        "last_failure": _sealing.open_json(
            ring, row.get("last_failure"), thread_id=thread_id, where="last_failure", strict=False,
            lenient=True,
        ) if row else None,
        "created_at": _plain(row["created_at"]) if row else None,
        "updated_at": _plain(row["updated_at"]) if row else None,
        "lease": None,
        "quarantine": _plain_row(quarantine[0]) if quarantine else None,
        "checkpoints": count,
        "checkpoint": None,
        "channels": [],
        "next": [],
        "finished_tasks": [],
        "interrupts": [],
        "errors": [],
        "ledger": {r["status"]: r["n"] for r in ledger},
        "load_error": None,
    }
    if row and row["lease_owner"]:
        expires_in = row["lease_expires_in"]
        out["lease"] = {
            "owner": row["lease_owner"],
            "token": row["lease_token"],
            "expires_at": _plain(row["lease_expires_at"]),
            "expires_in": expires_in,
            "live": expires_in is not None and expires_in > 0,
            # "owner pid N on host H is dead; takeover pending" (see mark_dead_owner).
            "note": dead_owner_note(row["lease_owner"]),
        }
    return out


def _channel_report(
    saver: DurablePostgresSaver,
    checkpoint: Mapping[str, Any],
    blob_rows: list[dict[str, Any]],
    *,
    keep_values: bool = False,
) -> list[dict[str, Any]]:
    """One entry per channel: type, version, logical size, stored size and where."""
    stored = {(r["channel"], r["version"]): r for r in blob_rows}
    versions = checkpoint.get("channel_versions") or {}
    values = checkpoint.get("channel_values") or {}
    channels = []
    for channel in sorted(set(values) | {c for c in versions if not is_internal(c)}):
        value = values.get(channel)
        version = versions.get(channel)
        blob = stored.get((channel, str(version)))
        if blob is not None:
            stored_bytes, storage = (
                blob["bytes"],
                "artifact-ref" if blob["type"] == REF_TYPE else "blob",
            )
        else:
            stored_bytes, storage = len(orjson.dumps(value, default=str)), "inline"
        channels.append(
            {
                "channel": channel,
                "internal": is_internal(channel),
                "type": type(value).__name__,
                "version": version,
                "size": _size(saver, value),
                "stored": stored_bytes,
                "storage": storage,
                "preview": preview(value),
                **({"value": value} if keep_values else {}),
            }
        )
    return channels


def _task_report(
    out: dict[str, Any],
    write_rows: list[dict[str, Any]],
    pending_writes: Iterable[Any],
    *,
    keep_values: bool = False,
) -> None:
    """The current step's tasks from their pending writes: finished ones, interrupts,
    errors."""
    tasks: dict[str, dict[str, Any]] = {}
    for w in write_rows:
        task = tasks.setdefault(
            w["task_id"],
            {
                "task_id": w["task_id"],
                "node": node_of(w["task_path"]),
                "path": w["task_path"],
                "channels": [],
                "bytes": 0,
            },
        )
        task["channels"].append(w["channel"])
        task["bytes"] += w["bytes"] or 0
    for task_id, channel, value in pending_writes:
        node = tasks.get(task_id, {}).get("node")
        if channel == "__interrupt__":
            for intr in value if isinstance(value, list | tuple) else (value,):
                out["interrupts"].append(
                    {
                        "task_id": task_id,
                        "node": node,
                        "id": getattr(intr, "id", None),
                        "value": preview(getattr(intr, "value", intr), 120),
                        **({"payload": getattr(intr, "value", intr)} if keep_values else {}),
                    }
                )
        elif channel == "__error__":
            out["errors"].append(
                {
                    "task_id": task_id,
                    "node": node,
                    "error": preview(value, 200),
                    **({"payload": value} if keep_values else {}),
                }
            )
    out["finished_tasks"] = [
        t for t in tasks.values() if not set(t["channels"]) & {"__interrupt__", "__error__"}
    ]


def _updated(versions: Mapping[str, Any], parent: Mapping[str, Any] | None) -> list[str]:
    parent = parent or {}
    return sorted(c for c, v in versions.items() if parent.get(c) != v)


def thread_history(
    saver: DurablePostgresSaver,
    thread_id: str,
    *,
    limit: int = 50,
    checkpoint_ns: str = "",
) -> list[dict[str, Any]]:
    """Checkpoints of a thread, newest first: step, source, graph version, the
    channels each one updated (and the bytes stored for them), and the writes of the
    tasks that ran from it (node, channels, bytes). SQL only: no value is decoded."""
    thread_id = str(thread_id)
    with saver.connection() as conn:
        rows = _rows(conn, HISTORY_SQL, (thread_id, checkpoint_ns, int(limit) + 1))
        if not rows:
            if _thread_row(conn, thread_id) is None:
                raise InspectError(f"thread {thread_id!r} not found", thread_id=thread_id)
            return []
        ids = [r["checkpoint_id"] for r in rows[:limit]]
        writes = _rows(conn, WRITES_SQL, (thread_id, checkpoint_ns, ids))
        blobs = _rows(conn, BLOB_SIZES_SQL, (thread_id, checkpoint_ns))
        by_id = {r["checkpoint_id"]: r for r in rows}
        missing_parent = rows[-1]["parent_checkpoint_id"] if len(rows) <= limit else None
        if missing_parent and missing_parent not in by_id:
            extra = _rows(
                conn,
                CHECKPOINT_VERSIONS_SQL,
                (thread_id, checkpoint_ns, missing_parent),
            )
            for r in extra:
                by_id[r["checkpoint_id"]] = r
    blob_bytes = {(b["channel"], b["version"]): b["bytes"] for b in blobs}
    tasks_by_cp: dict[str, dict[str, dict[str, Any]]] = {}
    for w in writes:
        tasks = tasks_by_cp.setdefault(w["checkpoint_id"], {})
        task = tasks.setdefault(
            w["task_id"],
            {"task_id": w["task_id"], "node": node_of(w["task_path"]), "channels": [], "bytes": 0},
        )
        task["channels"].append(w["channel"])
        task["bytes"] += w["bytes"] or 0
    out = []
    for r in rows[:limit]:
        # A damaged row (JSON of the wrong shape) is listed, flagged, never fatal.
        versions = r["versions"] if isinstance(r["versions"], dict) else {}
        parent = by_id.get(r["parent_checkpoint_id"] or "")
        pv = parent["versions"] if parent and isinstance(parent["versions"], dict) else None
        updated = _updated(versions, pv)
        md = r["metadata"] if isinstance(r["metadata"], dict) else {}
        damaged = not isinstance(r["versions"], dict) or not isinstance(r["metadata"], dict)
        ran = list(tasks_by_cp.get(r["checkpoint_id"], {}).values())
        out.append(
            {
                "checkpoint_id": r["checkpoint_id"],
                "parent_id": r["parent_checkpoint_id"],
                "step": md.get("step"),
                "source": md.get("source"),
                "graph_version": md.get("graph_version"),
                "ts": r["ts"],
                "updated_channels": [c for c in updated if not is_internal(c)],
                "bytes": r["row_bytes"]
                + sum(blob_bytes.get((c, str(versions[c])), 0) for c in updated),
                "writes": ran,
                "write_bytes": sum(t["bytes"] for t in ran),
                "damaged": damaged,
            }
        )
    return out


def resolve_checkpoint(
    saver: DurablePostgresSaver, thread_id: str, ref: str, *, checkpoint_ns: str = ""
) -> str:
    """A checkpoint id from ``ref``: a full id, a unique prefix, ``latest``, or
    ``latest~N`` (N checkpoints before the latest)."""
    thread_id = str(thread_id)
    ref = ref.strip()
    with saver.connection() as conn:
        if ref == "latest" or ref.startswith("latest~"):
            back = int(ref.partition("~")[2] or 0)
            rows = _rows(
                conn,
                NTH_CHECKPOINT_SQL,
                (thread_id, checkpoint_ns, back),
            )
        else:
            # starts_with: the prefix is a value, never a LIKE pattern.
            rows = _rows(
                conn,
                CHECKPOINT_PREFIX_SQL,
                (thread_id, checkpoint_ns, ref),
            )
            exact = [r for r in rows if r["checkpoint_id"] == ref]
            rows = exact or rows
    if not rows:
        raise InspectError(
            f"no checkpoint {ref!r} in thread {thread_id!r}", thread_id=thread_id, ref=ref
        )
    if len(rows) > 1:
        raise InspectError(
            f"checkpoint prefix {ref!r} is ambiguous in thread {thread_id!r}",
            thread_id=thread_id,
            ref=ref,
        )
    return str(rows[0]["checkpoint_id"])


def _channel_diff(
    saver: DurablePostgresSaver,
    channel: str,
    va: Mapping[str, Any],
    vb: Mapping[str, Any],
    xa: Mapping[str, Any],
    xb: Mapping[str, Any],
) -> dict[str, Any]:
    """One channel of ``diff_checkpoints``: what changed (by version, then bytes), sizes
    and previews on both sides."""
    in_a, in_b = channel in xa, channel in xb
    size_a = _size(saver, xa[channel]) if in_a else None
    size_b = _size(saver, xb[channel]) if in_b else None
    if not in_a and not in_b:
        change = "same" if va.get(channel) == vb.get(channel) else "changed"
    elif not in_a:
        change = "added"
    elif not in_b:
        change = "removed"
    elif va.get(channel) == vb.get(channel):
        change = "same"
    else:
        same_bytes = saver.serde.dumps_typed(xa[channel]) == saver.serde.dumps_typed(xb[channel])
        change = "rewritten" if same_bytes else "changed"
    return {
        "channel": channel,
        "internal": is_internal(channel),
        "change": change,
        "version_a": va.get(channel),
        "version_b": vb.get(channel),
        "size_a": size_a,
        "size_b": size_b,
        "delta": (size_b or 0) - (size_a or 0),
        "before": preview(xa[channel]) if in_a else None,
        "after": preview(xb[channel]) if in_b else None,
    }


def diff_checkpoints(
    saver: DurablePostgresSaver,
    thread_id: str,
    a: str,
    b: str,
    *,
    checkpoint_ns: str = "",
    values: bool = False,
) -> dict[str, Any]:
    """Which channels differ between two checkpoints of a thread.

    Each channel is ``added``, ``removed``, ``changed`` (new version, different value),
    ``rewritten`` (new version, same serialized value) or ``same``; with sizes before
    and after (serialized with the saver's serializer) and short previews.
    """
    thread_id = str(thread_id)
    ids = [resolve_checkpoint(saver, thread_id, ref, checkpoint_ns=checkpoint_ns) for ref in (a, b)]
    tuples = []
    for cid in ids:
        saved = saver.get_tuple(
            {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": checkpoint_ns,
                    "checkpoint_id": cid,
                }
            }
        )
        assert saved is not None  # resolve_checkpoint found it
        tuples.append(saved)
    ca, cb = (t.checkpoint for t in tuples)
    va, vb = ca.get("channel_versions") or {}, cb.get("channel_versions") or {}
    xa, xb = ca.get("channel_values") or {}, cb.get("channel_values") or {}
    channels = [
        _channel_diff(saver, channel, va, vb, xa, xb)
        for channel in sorted(set(va) | set(vb) | set(xa) | set(xb))
    ]
    if values:  # the decoded values too (the console renders messages from them)
        for c in channels:
            c["value_a"], c["value_b"] = xa.get(c["channel"]), xb.get(c["channel"])
    meta = [dict(t.metadata or {}) for t in tuples]
    return {
        "thread_id": thread_id,
        "a": {
            "checkpoint_id": ids[0],
            "step": meta[0].get("step"),
            "graph_version": meta[0].get("graph_version"),
        },
        "b": {
            "checkpoint_id": ids[1],
            "step": meta[1].get("step"),
            "graph_version": meta[1].get("graph_version"),
        },
        "channels": channels,
        "changed": [c["channel"] for c in channels if c["change"] != "same" and not c["internal"]],
    }


# ------------------------------------------------------------------ storage
def _table_stats(conn: Connection[Any], names: Iterable[str]) -> list[dict[str, Any]]:
    out = []
    for name in names:
        found = _rows(conn, TABLE_OID_SQL, (name,))[0]["oid"]
        if found is None:
            continue
        size = _rows(
            conn,
            TABLE_SIZES_SQL,
            (found, found, found),
        )[0]
        # The name comes from a fixed list and is quoted as an identifier.
        count = _rows(
            conn, table_count_sql(name)
        )[0]["n"]
        out.append({"table": name, "rows": count, **size})
    return out


def _count_refs(
    items: Iterable[list[Any]], elements: Counter[bytes], chunks: Counter[bytes]
) -> int:
    """Add the artifact references among envelope/chunk items to the counters (one per
    occurrence, nested containers included); return the bytes stored inline."""
    inline = 0
    for item in items:
        kind = item[0]
        if kind == _INLINE:
            inline += len(item[2])
        elif kind == _ELEMENT_REF:
            elements[bytes(item[1])] += 1
        elif kind == _CHUNK_REF:
            chunks[bytes(item[1])] += 1
        elif kind == _NESTED:
            inline += _count_refs(_payload_items(item[1], item[2]), elements, chunks)
    return inline


def _artifact_stats(saver: DurablePostgresSaver, conn: Connection[Any]) -> dict[str, Any]:
    """Dedup figures computed from the tables alone (no in-process cache involved).

    logical bytes: the uncompressed content every reference in checkpoint_blobs and
    checkpoint_writes stands for, counted once per reference (a chunk counts its
    elements); unique bytes: the distinct content; stored bytes: what the artifact
    table holds (compressed). dedup_ratio = logical / stored.
    """
    damaged: list[dict[str, Any]] = []
    elements, chunks = _referenced_counts(conn, damaged)
    totals = _rows(conn, ARTIFACT_TOTALS_SQL)[0]
    expansion = _chunk_expansion(saver, conn, set(chunks), damaged)
    needed = set(elements) | {d for _, el, _ in expansion.values() for d in el}
    sizes: dict[bytes, int] = {}
    if needed:
        for r in _rows(conn, ARTIFACT_SIZES_SQL, (list(needed),)):
            sizes[bytes(r["digest"])] = int(r["size"])
    memo: dict[bytes, int] = {}

    def chunk_bytes(digest: bytes, depth: int = 0) -> int:
        if digest not in memo:
            inline, el, sub = expansion.get(digest, (0, Counter(), Counter()))
            total = inline + sum(sizes.get(d, 0) * n for d, n in el.items())
            if depth < 8:  # chunks nest one level today; the bound only guards a cycle
                total += sum(chunk_bytes(d, depth + 1) * n for d, n in sub.items())
            memo[digest] = total
        return memo[digest]

    logical = sum(sizes.get(d, 0) * n for d, n in elements.items())
    logical += sum(chunk_bytes(d) * n for d, n in chunks.items())
    stored = int(totals["stored_bytes"])
    return {
        "artifacts": int(totals["n"]),
        "references": sum(elements.values()) + sum(chunks.values()),
        "logical_bytes": logical,
        "unique_bytes": int(totals["unique_bytes"]),
        "stored_bytes": stored,
        "dedup_ratio": round(logical / stored, 3) if stored else None,
        "damaged": damaged,
    }


def _referenced_counts(
    conn: Connection[Any], damaged: list[dict[str, Any]]
) -> tuple[Counter[bytes], Counter[bytes]]:
    """How often each element and chunk artifact is referenced by the envelopes in
    checkpoint_blobs and checkpoint_writes (a damaged envelope is reported, not fatal)."""
    elements: Counter[bytes] = Counter()
    chunks: Counter[bytes] = Counter()
    for what, query in (("blob", REF_BLOBS_SQL), ("write", REF_WRITES_SQL)):
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(query, (REF_TYPE,))
            for blob, *where in cur:
                el: Counter[bytes] = Counter()
                ch: Counter[bytes] = Counter()
                try:
                    _count_refs(_envelope_items(bytes(blob)), el, ch)
                except Exception as exc:  # one damaged row is reported, not fatal
                    damaged.append(_damage(what, where, exc))
                    continue
                elements.update(el)
                chunks.update(ch)
    return elements, chunks


def _chunk_expansion(
    saver: DurablePostgresSaver, conn: Connection[Any], wanted: set[bytes], damaged: list[dict[str, Any]]
) -> dict[bytes, tuple[int, Counter[bytes], Counter[bytes]]]:
    """What each chunk holds: inline bytes, element refs and sub-chunk refs. Fetched
    level by level (a chunk may hold chunks), each chunk once."""
    expansion: dict[bytes, tuple[int, Counter[bytes], Counter[bytes]]] = {}
    while wanted:
        for r in _rows(conn, ARTIFACT_DATA_SQL, (list(wanted),)):
            inner_el: Counter[bytes] = Counter()
            inner_ch: Counter[bytes] = Counter()
            try:
                content = saver.codec.unseal(bytes(r["data"]), saver.serde)
                inline = _count_refs(ormsgpack.unpackb(content[1:]), inner_el, inner_ch)
            except Exception as exc:  # a damaged chunk artifact: reported, not fatal
                users = _rows(conn, ARTIFACT_USERS_SQL, (r["digest"],))
                item = {"artifact": bytes(r["digest"]).hex(), "error": f"{type(exc).__name__}: {exc}",
                        "encrypted": decryption_error(exc, thread_id=None, where="") is not None}
                damaged.append({**item, "thread_ids": [u["thread_id"] for u in users]})
                inline, inner_el, inner_ch = 0, Counter(), Counter()
            expansion[bytes(r["digest"])] = (inline, inner_el, inner_ch)
        wanted = {d for _, _, sub in expansion.values() for d in sub if d not in expansion} - wanted
    return expansion


def _damage(what: str, where: list[Any], exc: Exception) -> dict[str, Any]:
    """A damaged envelope row, as ``storage_stats`` reports it."""
    thread_id, checkpoint_ns, channel, *cid = where
    return {
        "row": what,
        "thread_id": thread_id,
        "checkpoint_ns": checkpoint_ns,
        "channel": channel,
        "checkpoint_id": cid[0] if cid else None,
        "error": f"{type(exc).__name__}: {exc}",
        "encrypted": decryption_error(exc, thread_id=None, where="") is not None,
    }


def storage_stats(saver: DurablePostgresSaver) -> dict[str, Any]:
    """Table sizes (stock and this package's), thread and checkpoint counts, and the
    artifact dedup ratio."""
    with saver.connection() as conn:
        tables = _table_stats(conn, (*STOCK_TABLES, *DURABLE_TABLES))
        artifacts = (
            _artifact_stats(saver, conn)
            if any(t["table"] == "durable_artifacts" for t in tables)
            else None
        )
        db = _rows(
            conn,
            DATABASE_SIZE_SQL,
        )[0]
    by_name = {t["table"]: t for t in tables}
    return {
        "database": db["name"],
        "database_bytes": db["bytes"],
        "tables": tables,
        "total_bytes": sum(t["total"] for t in tables),
        "checkpoint_bytes": sum(by_name[t]["total"] for t in STOCK_TABLES if t in by_name),
        "artifact_table_bytes": sum(
            by_name[t]["total"]
            for t in ("durable_artifacts", "durable_artifact_refs")
            if t in by_name
        ),
        "artifacts": artifacts,
    }
