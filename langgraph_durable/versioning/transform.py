"""Applying a chain of migrations to a checkpoint and its pending writes (pure: nothing
is stored), and the orphaned-work check."""

from __future__ import annotations

import binascii
import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langgraph_durable.errors import (
    DurableError,
)

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple
from langgraph_durable.versioning.fingerprint import (
    compiled_graph,
)
from langgraph_durable.versioning.keys import (
    _END,
    _INTERRUPT,
    _PULL,
    _PUSH,
    _TASKS,
)
from langgraph_durable.versioning.registry import (
    Migration,
    is_routing_channel,
)

# --- applying a chain (pure) -----------------------------------------------------------


class _OrphanedWork(ValueError):
    def __init__(self, nodes: list[str]) -> None:
        super().__init__(f"pending work for unknown node(s) {nodes}")
        self.nodes = nodes


@dataclass
class MigrationResult:
    """What ``apply_migrations`` produced. Nothing is written by it."""

    checkpoint: dict[str, Any]
    writes: list[tuple[str, str, Any]]
    # Channels whose value changed (state, Sends, barriers): they were re-versioned.
    changed: set[str]
    # Whether the pending writes differ from the stored ones (else they are kept as is).
    writes_changed: bool
    # Old task id -> new task id, for tasks of renamed nodes / re-indexed Sends.
    task_ids: dict[str, str]
    # New task id -> its task_path string (ordering key of stored writes).
    task_paths: dict[str, str]
    # Task ids whose pending writes were discarded (dropped nodes).
    dropped_tasks: set[str]
    steps: list[str]


def rename_channel(name: str, renames: Mapping[str, str]) -> str:
    """Map a node-specific channel (``branch:to:old``, ``join:a+old:c``) to new names."""
    if name.startswith("branch:to:"):
        node = name[len("branch:to:") :]
        return f"branch:to:{renames.get(node, node)}"
    if name.startswith("join:"):
        starts, sep, end = name[len("join:") :].rpartition(":")
        if sep:
            mapped = "+".join(renames.get(s, s) for s in starts.split("+"))
            return f"join:{mapped}:{renames.get(end, end)}"
    return name


def _target_node(name: str) -> str | None:
    """The node a routing channel triggers, if it is one."""
    if name.startswith("branch:to:"):
        return name[len("branch:to:") :]
    if name.startswith("join:"):
        _, sep, end = name[len("join:") :].rpartition(":")
        return end if sep else None
    return None


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays whose == is elementwise: count as changed
        return False


def _max_version(versions: Iterable[Any]) -> Any:
    vals = [v for v in versions if v is not None]
    return max(vals) if vals else None


def _task_id_fn(checkpoint: Mapping[str, Any]) -> Callable[..., str] | None:
    try:
        from langgraph.pregel._algo import _uuid5_str, _xxhash_str
    except ImportError:  # pragma: no cover - depends on the LangGraph release
        return None
    return _xxhash_str if int(checkpoint.get("v", 1)) > 1 else _uuid5_str


def _task_path(*parts: Any) -> str:
    try:
        from langgraph.pregel._algo import task_path_str
    except ImportError:  # pragma: no cover
        return ""
    return task_path_str(parts)


def _interrupt_id(ns: str, answered: int) -> str:
    from xxhash import xxh3_128_hexdigest

    # Same as langgraph.types._interrupt_id: the task namespace, plus "|n" once n
    # answers were given.
    return xxh3_128_hexdigest((f"{ns}|{answered}" if answered else ns).encode())


@dataclass
class _Work:
    """The checkpoint being migrated, as the steps of ``apply_migrations`` change it
    (copies: nothing stored or passed in is modified)."""

    values: dict[str, Any]
    versions: dict[str, Any]
    seen: dict[str, dict[str, Any]]
    updated: list[str]
    writes: list[tuple[str, str, Any]]
    send_pos: list[int | None]  # original Send index -> current index (None: dropped)
    current_of: dict[str, str | None] = field(default_factory=dict)  # original node -> current
    changed: set[str] = field(default_factory=set)
    merged: set[str] = field(default_factory=set)


@dataclass
class _TaskMoves:
    """Pending writes that change task: old id -> new id (and its path), dropped ids,
    and the interrupt namespaces that move with them."""

    task_ids: dict[str, str] = field(default_factory=dict)
    task_paths: dict[str, str] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    interrupt_ns: dict[str, tuple[str, str]] = field(default_factory=dict)


def apply_migrations(
    chain: Sequence[Migration],
    checkpoint: Mapping[str, Any],
    pending_writes: Sequence[tuple[str, str, Any]],
    *,
    next_version: Callable[[Any], Any],
    metadata: Mapping[str, Any] | None = None,
    graph: Any = None,
) -> MigrationResult:
    """Run ``chain`` on a copy of ``checkpoint`` and its pending writes.

    Pure: nothing stored (or passed in) is modified, so a failing migration leaves
    nothing behind. With ``graph`` (the new graph) task ids use its node triggers and
    pending work left for nodes it lacks raises; ``metadata["step"]`` locates the tasks
    of the paused step. Raises ``_OrphanedWork`` or whatever a migration fn raises.
    """
    from langgraph.types import Send

    values: dict[str, Any] = dict(checkpoint.get("channel_values") or {})
    writes: list[tuple[str, str, Any]] = [(str(t), c, v) for t, c, v in pending_writes]
    orig_writes = list(writes)
    orig_sends = list(values.get(_TASKS) or []) if isinstance(values.get(_TASKS), list) else []
    w = _Work(
        values=values,
        versions=dict(checkpoint.get("channel_versions") or {}),
        seen={n: dict(s) for n, s in (checkpoint.get("versions_seen") or {}).items()},
        updated=list(checkpoint.get("updated_channels") or []),
        writes=writes,
        send_pos=list(range(len(orig_sends))),
    )
    for m in chain:
        if m.rename_channels:
            _rename_state_keys(w, m)
        if m.rename_nodes or m.drop_nodes:
            _rename_nodes(w, m)
        if m.fn is not None:
            _apply_fn(w, m)
    _reversion(w, next_version)
    compiled = compiled_graph(graph) if graph is not None else None
    moves = _task_moves(w, checkpoint, metadata, compiled, orig_writes, orig_sends)
    if moves.task_ids or moves.dropped:
        _move_writes(w, moves)
    if compiled is not None:
        orphans = _orphaned_nodes(w.values, w.writes, set(compiled.nodes), Send)
        if orphans:
            raise _OrphanedWork(orphans)

    cp: dict[str, Any] = dict(checkpoint)
    cp["channel_values"] = w.values
    cp["channel_versions"] = w.versions
    cp["versions_seen"] = w.seen
    if "updated_channels" in checkpoint:
        cp["updated_channels"] = w.updated
    writes_changed = len(w.writes) != len(orig_writes) or any(
        a[0] != b[0] or a[1] != b[1] or a[2] is not b[2] for a, b in zip(w.writes, orig_writes, strict=False)
    )
    return MigrationResult(
        checkpoint=cp,
        writes=w.writes,
        changed=w.changed,
        writes_changed=writes_changed,
        task_ids=moves.task_ids,
        task_paths=moves.task_paths,
        dropped_tasks=moves.dropped,
        steps=[m.label for m in chain],
    )


def _rename_state_keys(w: _Work, m: Migration) -> None:
    """Step 1 of a migration: state key renames."""
    rc = m.rename_channels
    for old, new in rc.items():
        if new in w.versions and new not in rc and (old in w.versions or old in w.values):
            raise ValueError(f"migration {m.label}: cannot rename {old!r} onto existing {new!r}")
    w.values = {rc.get(k, k): v for k, v in w.values.items()}
    w.versions = {rc.get(k, k): v for k, v in w.versions.items()}
    w.seen = {n: {rc.get(c, c): v for c, v in s.items()} for n, s in w.seen.items()}
    w.updated = [rc.get(c, c) for c in w.updated]
    w.writes = [(t, rc.get(c, c), v) for t, c, v in w.writes]
    w.changed = {rc.get(c, c) for c in w.changed}


def _rename_nodes(w: _Work, m: Migration) -> None:
    """Step 2: node renames / drops: routing channels, versions_seen, Sends, writes."""
    r, drop = m.rename_nodes, m.drop_nodes
    tracked = {c for c in w.current_of.values() if c is not None}
    for orig, cur in list(w.current_of.items()):
        if cur is not None and cur in drop:
            w.current_of[orig] = None
        elif cur is not None and cur in r:
            w.current_of[orig] = r[cur]
    for name in set(r) | drop:
        if name not in tracked and name not in w.current_of:
            w.current_of[name] = None if name in drop else r[name]

    def dropped(ch: str, drop: frozenset[str] = drop) -> bool:
        target = _target_node(ch)
        return target is not None and target in drop

    _rename_node_values(w, r, drop, dropped)
    new_versions: dict[str, Any] = {}
    for k, v in w.versions.items():
        if dropped(k):
            continue
        nk = rename_channel(k, r)
        if nk in new_versions:
            w.merged.add(nk)
            v = _max_version([v, new_versions[nk]])
        new_versions[nk] = v
    w.versions = new_versions
    new_seen: dict[str, dict[str, Any]] = {}
    for n, s in w.seen.items():
        if n in drop:
            continue
        renamed = {rename_channel(c, r): v for c, v in s.items() if not dropped(c)}
        target = r.get(n, n)
        if target in new_seen:
            for c, v in renamed.items():
                prev = new_seen[target].get(c)
                new_seen[target][c] = v if prev is None else min(prev, v)
        else:
            new_seen[target] = renamed
    w.seen = new_seen
    w.updated = [rename_channel(c, r) for c in w.updated if not dropped(c)]
    _rename_node_writes(w, r, drop, dropped)


def _rename_node_values(
    w: _Work, r: Mapping[str, str], drop: frozenset[str], dropped: Callable[[str], bool]
) -> None:
    """Channel values under the renamed nodes' channels: barrier sets and Sends renamed
    (a changed value is re-versioned), merged channels united."""
    from langgraph.types import Send

    new_values: dict[str, Any] = {}
    for k, v in w.values.items():
        if dropped(k):
            continue
        nk = rename_channel(k, r)
        if nk.startswith("join:") and isinstance(v, set | frozenset):
            renamed_set = type(v)(r.get(x, x) for x in v)
            if renamed_set != v:
                w.changed.add(nk)  # a new value: stored under a new version
            v = renamed_set
        if k == _TASKS and isinstance(v, list):
            sends = _rename_sends(v, r, drop, w.send_pos, Send)
            if sends != v:
                w.changed.add(nk)
            v = sends
        if nk in new_values:
            # Two nodes merged into one (e.g. a removed node's work mapped onto
            # an existing node): the channel is re-versioned below so it fires.
            w.merged.add(nk)
            prev = new_values[nk]
            if isinstance(v, set | frozenset) and isinstance(prev, set | frozenset):
                v = prev | v
        new_values[nk] = v
    w.values = new_values


def _rename_node_writes(
    w: _Work, r: Mapping[str, str], drop: frozenset[str], dropped: Callable[[str], bool]
) -> None:
    """Pending writes: Sends to a dropped node go, to a renamed one follow it; barrier
    writes name the node that finished."""
    from langgraph.types import Send

    new_writes = []
    for t, c, v in w.writes:
        if dropped(c):
            continue
        if c == _TASKS and isinstance(v, Send):
            if v.node in drop:
                continue
            if v.node in r:
                v = Send(r[v.node], v.arg)
        if c.startswith("join:") and isinstance(v, str):
            v = r.get(v, v)  # a barrier write names the node that finished
        new_writes.append((t, rename_channel(c, r), v))
    w.writes = new_writes


def _apply_fn(w: _Work, m: Migration) -> None:
    """Step 3: state. The user's fn sees only state channels (after rename_channels),
    as a deep copy."""
    assert m.fn is not None
    state = {k: v for k, v in w.values.items() if not is_routing_channel(k)}
    new_state = m.fn(copy.deepcopy(state))
    if not isinstance(new_state, dict):
        raise TypeError(
            f"migration {m.label} must return a dict of state values, "
            f"got {type(new_state).__name__}"
        )
    if bad := sorted(k for k in new_state if not isinstance(k, str) or is_routing_channel(k)):
        raise ValueError(f"migration {m.label} returned LangGraph channel(s) {bad}")
    for k in set(state) | set(new_state):
        if k not in new_state or k not in state or not _same(state[k], new_state[k]):
            w.changed.add(k)
    w.values = {k: v for k, v in w.values.items() if is_routing_channel(k)} | new_state
    for k in set(state) - set(new_state):
        w.versions.pop(k, None)


def _reversion(w: _Work, next_version: Callable[[Any], Any]) -> None:
    """Re-version what changed: a version above every other one, and versions_seen
    entries that had seen the old version move along, so no node triggers on a
    migrated value it had already consumed."""
    bump = sorted((w.changed & set(w.values)) | w.merged)
    if bump:
        base = _max_version(w.versions.values())
        for k in bump:
            old_v = w.versions.get(k)
            new_v = next_version(base)
            base = new_v
            w.versions[k] = new_v
            if k in w.changed:
                for s in w.seen.values():
                    if old_v is not None and s.get(k) == old_v:
                        s[k] = new_v
    for k in w.changed - set(w.values):
        w.versions.pop(k, None)


def _task_moves(
    w: _Work,
    checkpoint: Mapping[str, Any],
    metadata: Mapping[str, Any] | None,
    compiled: Any,
    orig_writes: list[tuple[str, str, Any]],
    orig_sends: list[Any],
) -> _TaskMoves:
    """Task ids of the paused step: hash(checkpoint id, ns, step, node, triggers) for
    pulled nodes, (..., node, PUSH, index) for Sends. Renamed nodes and re-indexed
    Sends get new ids; their stored writes (finished work, interrupts, resume
    values) move to them so they are handed back instead of being re-run."""
    moves = _TaskMoves()
    id_fn = _task_id_fn(checkpoint)
    step = (metadata or {}).get("step")
    cid = checkpoint.get("id")
    write_tids = {t for t, _, _ in orig_writes}
    if id_fn is None or not isinstance(step, int) or not isinstance(cid, str) or not write_tids:
        return moves
    cid_bytes = binascii.unhexlify(cid.replace("-", ""))
    step_s = str(step + 1)
    old_joins = [k for k in (checkpoint.get("channel_versions") or {}) if k.startswith("join:")]
    for orig, final in w.current_of.items():
        if final == orig:
            continue
        own_joins = sorted(j for j in old_joins if _target_node(j) == orig)
        candidates = [[f"branch:to:{orig}"]]
        if own_joins:
            candidates.append(sorted([f"branch:to:{orig}", *own_joins]))
        for trig in candidates:
            old_tid = id_fn(cid_bytes, orig, step_s, orig, _PULL, *trig)
            if old_tid not in write_tids:
                continue
            if final is None:
                moves.dropped.add(old_tid)
                break
            if compiled is not None and final in compiled.nodes:
                new_trig = sorted(compiled.nodes[final].triggers)
            else:
                composed = {o: c for o, c in w.current_of.items() if c is not None}
                new_trig = sorted(rename_channel(t, composed) for t in trig)
            new_tid = id_fn(cid_bytes, final, step_s, final, _PULL, *new_trig)
            moves.task_ids[old_tid] = new_tid
            moves.task_paths[new_tid] = _task_path(_PULL, final)
            moves.interrupt_ns[old_tid] = (f"{orig}:{old_tid}", f"{final}:{new_tid}")
            break
    _send_moves(w, moves, orig_sends, id_fn, cid_bytes, step_s, write_tids)
    return moves


def _send_moves(
    w: _Work,
    moves: _TaskMoves,
    orig_sends: list[Any],
    id_fn: Callable[..., str],
    cid_bytes: bytes,
    step_s: str,
    write_tids: set[str],
) -> None:
    """The pushed tasks (Sends) of the paused step whose node or index changed."""
    from langgraph.types import Send

    tasks_now = w.values.get(_TASKS)
    cur_sends: list[Any] = tasks_now if isinstance(tasks_now, list) else []
    for i, send in enumerate(orig_sends):
        if not isinstance(send, Send):
            continue
        old_tid = id_fn(cid_bytes, send.node, step_s, send.node, _PUSH, str(i))
        if old_tid not in write_tids:
            continue
        j = w.send_pos[i]
        if j is None:
            moves.dropped.add(old_tid)
            continue
        new_node = cur_sends[j].node
        if (new_node, j) == (send.node, i):
            continue
        new_tid = id_fn(cid_bytes, new_node, step_s, new_node, _PUSH, str(j))
        moves.task_ids[old_tid] = new_tid
        moves.task_paths[new_tid] = _task_path(_PUSH, j, False)
        moves.interrupt_ns[old_tid] = (f"{send.node}:{old_tid}", f"{new_node}:{new_tid}")


def _move_writes(w: _Work, moves: _TaskMoves) -> None:
    """Pending writes follow their task to its new id (interrupt ids with it); the
    writes of dropped tasks go."""
    from langgraph.types import Interrupt

    remapped = []
    for t, c, v in w.writes:
        if t in moves.dropped:
            continue
        if t in moves.task_ids:
            if c == _INTERRUPT and isinstance(v, list | tuple):
                old_ns, new_ns = moves.interrupt_ns[t]
                v = type(v)(_remap_interrupt(i, old_ns, new_ns, Interrupt) for i in v)
            t = moves.task_ids[t]
        remapped.append((t, c, v))
    w.writes = remapped


def _rename_sends(
    sends: list[Any], r: Mapping[str, str], drop: frozenset[str], send_pos: list[int | None], send_cls: Any
) -> list[Any]:
    out: list[Any] = []
    new_index: dict[int, int] = {}
    for idx, s in enumerate(sends):
        if isinstance(s, send_cls) and s.node in drop:
            continue
        if isinstance(s, send_cls) and s.node in r:
            s = send_cls(r[s.node], s.arg)
        new_index[idx] = len(out)
        out.append(s)
    for i, pos in enumerate(send_pos):
        send_pos[i] = None if pos is None else new_index.get(pos)
    return out


def _remap_interrupt(intr: Any, old_ns: str, new_ns: str, interrupt_cls: Any) -> Any:
    if not isinstance(intr, interrupt_cls):
        return intr
    for answered in range(64):
        if _interrupt_id(old_ns, answered) == intr.id:
            return interrupt_cls(
                intr.value,
                _interrupt_id(new_ns, answered),
                response_schema=getattr(intr, "response_schema", None),
            )
    return intr


def _orphaned_nodes(
    values: Mapping[str, Any], writes: Sequence[tuple[str, str, Any]], nodes: set[str], send_cls: Any
) -> list[str]:
    """Nodes that pending work targets but ``nodes`` lacks (LangGraph would skip it)."""
    missing: set[str] = set()
    for k, v in values.items():
        target = _target_node(k)
        if target is not None and target not in nodes and target != _END:
            missing.add(target)
        if k == _TASKS and isinstance(v, list):
            missing.update(s.node for s in v if isinstance(s, send_cls) and s.node not in nodes)
    for _, c, v in writes:
        target = _target_node(c)
        if target is not None and target not in nodes and target != _END:
            missing.add(target)
        if c == _TASKS and isinstance(v, send_cls) and v.node not in nodes:
            missing.add(v.node)
    return sorted(missing)


def pending_orphans(saved: CheckpointTuple, graph: Any) -> list[str]:
    """Nodes the pending work of ``saved`` targets that ``graph`` does not have."""
    from langgraph.types import Send

    try:
        nodes = set(compiled_graph(graph).nodes)
    except DurableError:
        return []
    return _orphaned_nodes(
        saved.checkpoint.get("channel_values") or {}, list(saved.pending_writes or []), nodes, Send
    )
