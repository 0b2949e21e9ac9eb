"""Graph-version stamping, fingerprints and checkpoint migrations.

Vocabulary follows Temporal's worker versioning: a thread is *pinned* to the graph
version that wrote its latest checkpoint. Every run that starts on a thread with a
checkpoint (a resume with ``None`` or a ``Command``, and also a run with new input)
compares that version with the running graph's and applies the policy:

* ``"refuse"`` (default): raise ``GraphVersionMismatchError`` before any node runs,
  unless a migration path from the stored version to the current one is registered,
  in which case the checkpoint is migrated (atomically, in place) and the run goes on,
  or both versions are fingerprints and the difference is *compatible* for this
  thread (``compat.py``: e.g. an added state key), in which case it simply goes on.
* ``"strict"``: as ``"refuse"`` but any difference without a migration is refused.
* ``"warn"``: log a warning (naming pending work the new graph cannot run) and
  continue on the new graph (LangGraph's stock behaviour).
* ``"auto-upgrade"``: an operator's per-invoke override (``configurable.version_policy``)
  meaning "I accept the skew for this run": continue without warning.

A registered migration is always preferred to the policy. Threads written before
stamping existed carry no version: ``unversioned_policy`` (default ``"adopt"``) lets
them run and stamps them; ``"refuse"`` treats them as a mismatch.

Why in place (same checkpoint id): task ids hash the checkpoint id, so pending writes
(finished tasks of the paused step, interrupts, resume values) keep matching their
tasks. Channels whose value changes get a new version and a new blob; the old blobs
stay, so history and ``get_state_history`` are not rewritten, and the pre-migration
rows are copied into ``durable_migration_log`` first, so an operator can audit and
undo (``undo_migration``, ``langgraph-durable versions undo``).
"""

from __future__ import annotations

import binascii
import copy
import hashlib
import inspect
import logging
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import orjson

from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import Flow, Tx
from langgraph_durable._view import SaverView
from langgraph_durable.errors import (
    ConfigurationError,
    DurableError,
    MigrationError,
    OrphanedWorkError,
)

# The rewrite's SQL, imported from here by saver.py until it takes it from sql/.
from langgraph_durable.sql.threads_ops import LOCK_THREAD_LEASE_SQL as LOCK_THREAD_SQL
from langgraph_durable.sql.threads_ops import SET_THREAD_VERSION_SQL as SET_THREAD_VERSION_SQL
from langgraph_durable.sql.versions import INSERT_LOG_SQL as INSERT_LOG_SQL
from langgraph_durable.sql.versions import LOCK_CHECKPOINT_SQL as LOCK_CHECKPOINT_SQL
from langgraph_durable.sql.versions import WRITE_PATHS_SQL as WRITE_PATHS_SQL

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple

logger = logging.getLogger("langgraph_durable.versioning")

VersionPolicy = Literal["refuse", "strict", "warn", "auto-upgrade"]
UnversionedPolicy = Literal["adopt", "refuse"]
VERSION_POLICIES: tuple[str, ...] = ("refuse", "strict", "warn", "auto-upgrade")
VERSION_KEY = "graph_version"
POLICY_KEY = "version_policy"
MIGRATED_FROM_KEY = "migrated_from"
MIGRATION_ID_KEY = "migration_id"

# The graph of the run whose start is being checked. Set by the saver when it works
# out the running version and read when a migration needs the new graph's nodes
# (task ids, orphaned work); a ContextVar because one saver serves concurrent runs.
RUN_GRAPH: ContextVar[Any] = ContextVar("langgraph_durable_run_graph", default=None)

# LangGraph's reserved names (langgraph._internal._constants): kept literal so a
# private-module move does not break the import; tests compare them with the source.
_START = "__start__"
_END = "__end__"
_TASKS = "__pregel_tasks"
_INTERRUPT = "__interrupt__"
_PULL = "__pregel_pull"
_PUSH = "__pregel_push"

_fingerprint_cache: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


# --- fingerprint ---------------------------------------------------------------------


def graph_fingerprint(graph: Any, *, include_source: bool = False) -> str:
    """A stable hash of what resuming a checkpoint depends on.

    Accepts a ``StateGraph`` builder, a compiled graph, or any ``Pregel``. Covers node
    names, edges, join (waiting) edges, conditional-edge destinations, ``Command``
    destinations, error-handler routing, channel names and their reducer kinds, and
    subgraphs added as nodes (recursively). With ``include_source=True`` node source
    code is hashed too (as DBOS does), so any code edit changes the version.
    Independent of ``PYTHONHASHSEED``, of the order nodes were added in and of
    compile-time ``interrupt_before``/``interrupt_after`` (a pause policy, not
    topology: ``saver.bind(graph=builder)`` and the compiled graph agree).
    """
    from langgraph.pregel import Pregel

    # Only compiled graphs are cached: a builder can still gain nodes after a call.
    cacheable = not include_source and isinstance(graph, Pregel)
    if cacheable:
        cached = _fingerprint_cache.get(graph)
        if cached is not None:
            return cached
    desc = describe_graph(graph, include_source=include_source)
    digest = hashlib.sha256(orjson.dumps(desc, option=orjson.OPT_SORT_KEYS)).hexdigest()
    fp = f"fp-{digest[:16]}"
    if cacheable:
        try:
            _fingerprint_cache[graph] = fp
        except TypeError:  # an unhashable Pregel subclass: just don't cache
            pass
    return fp


def describe_graph(graph: Any, *, include_source: bool = False) -> dict[str, Any]:
    """The canonical, JSON-able description that ``graph_fingerprint`` hashes."""
    builder, compiled = _builder_and_compiled(graph)
    desc: dict[str, Any] = {"channels": _describe_channels(compiled.channels)}
    if builder is not None:
        nodes: dict[str, Any] = {}
        for name, spec in builder.nodes.items():
            entry: dict[str, Any] = {"run": _describe_runnable(spec.runnable, include_source)}
            ends = getattr(spec, "ends", None)
            if ends:
                entry["ends"] = sorted(ends.values() if isinstance(ends, Mapping) else ends)
            handler = getattr(spec, "error_handler_node", None)
            if handler:
                entry["error_handler"] = handler
            if getattr(spec, "is_error_handler", False):
                entry["is_error_handler"] = True
            nodes[name] = entry
        desc["nodes"] = nodes
        desc["edges"] = sorted([list(e) for e in builder.edges])
        desc["waiting_edges"] = sorted(
            [[sorted(starts), end] for starts, end in getattr(builder, "waiting_edges", set())]
        )
        branches: dict[str, Any] = {}
        for source, specs in builder.branches.items():
            # Only the destinations: the path function's body (and name) is logic, and
            # a branch without a path map can go anywhere ("dynamic").
            dests = [
                sorted(set(b.ends.values())) if b.ends else ["<dynamic>"] for b in specs.values()
            ]
            if dests:
                branches[source] = sorted(dests)
        desc["branches"] = branches
    else:
        nodes = {}
        for name, node in compiled.nodes.items():
            nodes[name] = {
                "triggers": sorted(node.triggers),
                "reads": sorted(node.channels) if isinstance(node.channels, list) else node.channels,
                "writes": sorted(_static_writes(node)),
                "run": _describe_runnable(node.bound, include_source),
            }
        desc["nodes"] = nodes
    return desc


def _builder_and_compiled(graph: Any) -> tuple[Any, Any]:
    from langgraph.graph.state import StateGraph
    from langgraph.pregel import Pregel

    if isinstance(graph, StateGraph):
        return graph, graph.compile()
    if isinstance(graph, Pregel):
        builder = getattr(graph, "builder", None)
        return (builder if isinstance(builder, StateGraph) else None), graph
    raise ConfigurationError(
        f"expected a StateGraph or a compiled graph, got {type(graph).__name__}",
        got=type(graph).__name__,
    )


def compiled_graph(graph: Any) -> Any:
    """The ``Pregel`` for a builder or compiled graph (its nodes name what can run)."""
    return _builder_and_compiled(graph)[1]


def _describe_channels(channels: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, chan in channels.items():
        entry: dict[str, Any] = {"kind": type(chan).__name__}
        op = getattr(chan, "operator", None)
        if op is not None:
            # module + qualname: stable across processes (never a repr with an address)
            qual = getattr(op, "__qualname__", None) or type(op).__qualname__
            entry["reducer"] = f"{getattr(op, '__module__', '') or ''}.{qual}"
        out[name] = entry
    return out


def _static_writes(node: Any) -> set[str]:
    found: set[str] = set()
    for w in getattr(node, "writers", ()):
        for entry in getattr(w, "writes", None) or ():
            chan = getattr(entry, "channel", None)
            if isinstance(chan, str):
                found.add(chan)
            for st in getattr(entry, "static", None) or ():
                if st and isinstance(st[0], str):
                    found.add(st[0])
    return found


def _describe_runnable(runnable: Any, include_source: bool) -> Any:
    from langgraph.pregel import Pregel

    sub = _find_subgraph(runnable)
    if sub is not None and isinstance(sub, Pregel):
        return {"subgraph": graph_fingerprint(sub, include_source=include_source)}
    if not include_source:
        return "node"
    func = getattr(runnable, "func", None) or getattr(runnable, "afunc", None) or runnable
    try:
        src = inspect.getsource(func)
    except (OSError, TypeError):
        src = getattr(func, "__qualname__", type(func).__qualname__)
    return {"source": hashlib.sha256(src.encode()).hexdigest()[:16]}


def _find_subgraph(runnable: Any) -> Any:
    from langgraph.pregel import Pregel

    if isinstance(runnable, Pregel):
        return runnable
    for step in getattr(runnable, "steps", None) or ():
        if isinstance(step, Pregel):
            return step
    bound = getattr(runnable, "bound", None)
    if isinstance(bound, Pregel):
        return bound
    return None


# --- migrations ----------------------------------------------------------------------

MigrationFn = Callable[[dict[str, Any]], dict[str, Any]]
F = TypeVar("F", bound=MigrationFn)


def is_routing_channel(name: str) -> bool:
    """LangGraph's own channels (triggers, Sends, input): never handed to a migration fn."""
    return name.startswith(("branch:", "join:", "start:", "__"))


@dataclass(frozen=True)
class Migration:
    """One step ``from_version -> to_version``.

    ``fn`` rewrites the state: it receives a deep copy of the state channels (your
    state keys, after ``rename_channels``; LangGraph's routing channels are left out)
    and returns the new ones.
    ``rename_nodes`` maps old node names to new ones for pending work (triggers,
    Sends, finished-task writes, interrupts); ``drop_nodes`` discards the pending work
    of removed nodes on purpose; ``rename_channels`` renames state keys (values,
    versions and pending writes)."""

    from_version: str
    to_version: str
    fn: MigrationFn | None = None
    rename_nodes: Mapping[str, str] = field(default_factory=dict)
    drop_nodes: frozenset[str] = frozenset()
    rename_channels: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.from_version}->{self.to_version}"


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty string, got {value!r}", value=value)
    return value


class MigrationRegistry:
    """Registered migrations; finds the shortest chain between two versions.

    ``registry.register("v1", "v2", fn, rename_nodes={"review": "approve"})``, or as a
    decorator ``@registry.register("v1", "v2")``. ``registry.register("v1", "v2")``
    alone declares v2 able to run v1 checkpoints as they are (an identity migration).
    """

    def __init__(self) -> None:
        self._edges: dict[str, list[Migration]] = {}

    @overload
    def register(
        self,
        from_version: str,
        to_version: str,
        fn: F,
        *,
        rename_nodes: Mapping[str, str] | None = ...,
        drop_nodes: Iterable[str] | None = ...,
        rename_channels: Mapping[str, str] | None = ...,
    ) -> F: ...

    @overload
    def register(
        self,
        from_version: str,
        to_version: str,
        fn: None = ...,
        *,
        rename_nodes: Mapping[str, str] | None = ...,
        drop_nodes: Iterable[str] | None = ...,
        rename_channels: Mapping[str, str] | None = ...,
    ) -> Callable[[F], F]: ...

    def register(
        self,
        from_version: str,
        to_version: str,
        fn: MigrationFn | None = None,
        *,
        rename_nodes: Mapping[str, str] | None = None,
        drop_nodes: Iterable[str] | None = None,
        rename_channels: Mapping[str, str] | None = None,
    ) -> Any:
        """Register a migration. Without ``fn`` it is registered at once as an identity
        (plus renames) and the return value is a decorator that sets ``fn``."""
        _check_name(from_version, "from_version")
        _check_name(to_version, "to_version")
        if from_version == to_version:
            raise ConfigurationError("a migration must change the version", version=from_version)
        if fn is not None and not callable(fn):
            raise ConfigurationError(f"migration fn must be callable, got {type(fn).__name__}")
        renames = dict(rename_nodes or {})
        drops = frozenset(drop_nodes or ())
        channel_renames = dict(rename_channels or {})
        for old, new in renames.items():
            _check_name(old, "rename_nodes key")
            _check_name(new, "rename_nodes value")
            if old == new or old in (_START, _END) or new in (_START, _END):
                raise ConfigurationError(f"cannot rename node {old!r} to {new!r}", node=old)
        for name in drops:
            _check_name(name, "drop_nodes entry")
            if name in (_START, _END):
                raise ConfigurationError(f"cannot drop node {name!r}", node=name)
        if clash := sorted(drops & (set(renames) | set(renames.values()))):
            raise ConfigurationError(
                f"node(s) {clash} are both renamed and dropped in {from_version}->{to_version}",
                nodes=clash,
            )
        for old, new in channel_renames.items():
            _check_name(old, "rename_channels key")
            _check_name(new, "rename_channels value")
            if is_routing_channel(old) or is_routing_channel(new):
                raise ConfigurationError(
                    f"rename_channels renames state keys only, not {old!r} -> {new!r} "
                    "(use rename_nodes for routing)",
                    channel=old,
                )
        migration = Migration(from_version, to_version, fn, renames, drops, channel_renames)
        self._add(migration)
        if fn is not None:
            return fn

        def decorator(f: F) -> F:
            if not callable(f):
                raise ConfigurationError(f"migration fn must be callable, got {type(f).__name__}")
            self._add(replace(migration, fn=f))
            return f

        return decorator

    def _add(self, m: Migration) -> None:
        edges = self._edges.setdefault(m.from_version, [])
        edges[:] = [e for e in edges if e.to_version != m.to_version] + [m]

    def path(self, from_version: str, to_version: str) -> list[Migration] | None:
        """The shortest chain of migrations, ``[]`` for equal versions, else ``None``."""
        if from_version == to_version:
            return []
        seen = {from_version}
        queue: deque[tuple[str, list[Migration]]] = deque([(from_version, [])])
        while queue:
            version, chain = queue.popleft()
            for m in self._edges.get(version, []):
                if m.to_version in seen:
                    continue
                nxt = [*chain, m]
                if m.to_version == to_version:
                    return nxt
                seen.add(m.to_version)
                queue.append((m.to_version, nxt))
        return None

    def versions(self) -> set[str]:
        """Every version a registered migration starts from or leads to."""
        return set(self._edges) | {m.to_version for ms in self._edges.values() for m in ms}

    def sources(self, to_version: str) -> set[str]:
        """Stored versions a graph at ``to_version`` can run after migrating (itself included)."""
        return {to_version} | {v for v in self.versions() if self.path(v, to_version) is not None}

    def __iter__(self) -> Iterator[Migration]:
        for edges in self._edges.values():
            yield from edges

    def __bool__(self) -> bool:
        return bool(self._edges)

    def __len__(self) -> int:
        return sum(len(v) for v in self._edges.values())

    def __repr__(self) -> str:
        return f"MigrationRegistry({[m.label for m in self]})"


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


# --- migrating stored threads ----------------------------------------------------------

@_telemetry.instrument("migration")
def flow_migrate(
    saver: SaverView,
    saved: CheckpointTuple,
    stored: str,
    current: str,
    chain: Sequence[Migration],
    *,
    graph: Any = None,
    origin: str = "run",
    dry_run: bool = False,
) -> Flow[Any]:
    """Apply ``chain`` to ``saved`` and write the result in place (one transaction,
    backup in ``durable_migration_log``). Returns the reloaded tuple, or the
    ``MigrationResult`` when ``dry_run``. Raises ``MigrationError`` / ``OrphanedWorkError``
    with the stored rows untouched."""
    thread_id = str(saved.config["configurable"]["thread_id"])
    try:
        result = apply_migrations(
            chain,
            saved.checkpoint,
            list(saved.pending_writes or []),
            next_version=lambda v: saver.get_next_version(v, None),
            metadata=saved.metadata,
            graph=graph,
        )
    except _OrphanedWork as exc:
        raise OrphanedWorkError(
            thread_id=thread_id, from_version=stored, to_version=current, nodes=exc.nodes
        ) from None
    except Exception as exc:
        raise MigrationError(
            f"migration {stored!r} -> {current!r} ({' then '.join(m.label for m in chain)}) of "
            f"thread {thread_id!r} failed: {type(exc).__name__}: {exc}; the stored checkpoint "
            "is untouched",
            thread_id=thread_id,
            from_version=stored,
            to_version=current,
        ) from exc
    if dry_run:
        return result
    md = dict(saved.metadata or {})
    md[VERSION_KEY] = current
    md[MIGRATED_FROM_KEY] = stored
    yield Tx(lambda: saver._op_rewrite(saved, result, md, expected=stored, origin=origin))
    logger.info(
        "thread %s migrated from graph version %s to %s (%s)",
        thread_id, stored, current, ", ".join(result.steps),
    )
    reloaded = yield Tx(lambda: saver._op_get_tuple(saved.config))
    return reloaded


__all__ = [
    "POLICY_KEY",
    "LOCK_THREAD_SQL",
    "RUN_GRAPH",
    "VERSION_KEY",
    "Migration",
    "MigrationRegistry",
    "MigrationResult",
    "UnversionedPolicy",
    "VersionPolicy",
    "apply_migrations",
    "describe_graph",
    "flow_migrate",
    "graph_fingerprint",
    "pending_orphans",
]
