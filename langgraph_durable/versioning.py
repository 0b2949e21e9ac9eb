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
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast, overload

import orjson

from langgraph_durable import audit as _audit
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import Batch, Flow, Hook, Op, Stmt, Tx, op_memo
from langgraph_durable.errors import (
    ConfigurationError,
    DurableError,
    MigrationBackupError,
    MigrationError,
    OrphanedWorkError,
    ThreadBusyError,
)

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
_NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"

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
    from langgraph.types import Interrupt, Send

    cp: dict[str, Any] = dict(checkpoint)
    values: dict[str, Any] = dict(checkpoint.get("channel_values") or {})
    versions: dict[str, Any] = dict(checkpoint.get("channel_versions") or {})
    seen: dict[str, dict[str, Any]] = {
        n: dict(s) for n, s in (checkpoint.get("versions_seen") or {}).items()
    }
    updated = list(checkpoint.get("updated_channels") or [])
    writes: list[tuple[str, str, Any]] = [(str(t), c, v) for t, c, v in pending_writes]
    orig_writes = list(writes)
    orig_sends = list(values.get(_TASKS) or []) if isinstance(values.get(_TASKS), list) else []
    send_pos: list[int | None] = list(range(len(orig_sends)))  # original idx -> current idx
    current_of: dict[str, str | None] = {}  # original node -> current name (None: dropped)
    changed: set[str] = set()
    merged: set[str] = set()

    for m in chain:
        # 1. State key renames.
        if m.rename_channels:
            rc = m.rename_channels
            for old, new in rc.items():
                if new in versions and new not in rc and (old in versions or old in values):
                    raise ValueError(f"migration {m.label}: cannot rename {old!r} onto existing {new!r}")
            values = {rc.get(k, k): v for k, v in values.items()}
            versions = {rc.get(k, k): v for k, v in versions.items()}
            seen = {n: {rc.get(c, c): v for c, v in s.items()} for n, s in seen.items()}
            updated = [rc.get(c, c) for c in updated]
            writes = [(t, rc.get(c, c), v) for t, c, v in writes]
            changed = {rc.get(c, c) for c in changed}

        # 2. Node renames / drops: routing channels, versions_seen, Sends, writes.
        if m.rename_nodes or m.drop_nodes:
            r, drop = m.rename_nodes, m.drop_nodes
            tracked = {c for c in current_of.values() if c is not None}
            for orig, cur in list(current_of.items()):
                if cur is not None and cur in drop:
                    current_of[orig] = None
                elif cur is not None and cur in r:
                    current_of[orig] = r[cur]
            for name in set(r) | drop:
                if name not in tracked and name not in current_of:
                    current_of[name] = None if name in drop else r[name]

            def dropped(ch: str, drop: frozenset[str] = drop) -> bool:
                target = _target_node(ch)
                return target is not None and target in drop

            new_values: dict[str, Any] = {}
            for k, v in values.items():
                if dropped(k):
                    continue
                nk = rename_channel(k, r)
                if nk.startswith("join:") and isinstance(v, set | frozenset):
                    renamed_set = type(v)(r.get(x, x) for x in v)
                    if renamed_set != v:
                        changed.add(nk)  # a new value: stored under a new version
                    v = renamed_set
                if k == _TASKS and isinstance(v, list):
                    sends = _rename_sends(v, r, drop, send_pos, Send)
                    if sends != v:
                        changed.add(nk)
                    v = sends
                if nk in new_values:
                    # Two nodes merged into one (e.g. a removed node's work mapped onto
                    # an existing node): the channel is re-versioned below so it fires.
                    merged.add(nk)
                    prev = new_values[nk]
                    if isinstance(v, set | frozenset) and isinstance(prev, set | frozenset):
                        v = prev | v
                new_values[nk] = v
            values = new_values
            new_versions: dict[str, Any] = {}
            for k, v in versions.items():
                if dropped(k):
                    continue
                nk = rename_channel(k, r)
                if nk in new_versions:
                    merged.add(nk)
                    v = _max_version([v, new_versions[nk]])
                new_versions[nk] = v
            versions = new_versions
            new_seen: dict[str, dict[str, Any]] = {}
            for n, s in seen.items():
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
            seen = new_seen
            updated = [rename_channel(c, r) for c in updated if not dropped(c)]
            new_writes = []
            for t, c, v in writes:
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
            writes = new_writes

        # 3. State: the user's fn sees only state channels (after rename_channels), as
        #    a deep copy.
        if m.fn is not None:
            state = {k: v for k, v in values.items() if not is_routing_channel(k)}
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
                    changed.add(k)
            values = {k: v for k, v in values.items() if is_routing_channel(k)} | new_state
            for k in set(state) - set(new_state):
                versions.pop(k, None)

    # Re-version what changed: a version above every other one, and versions_seen
    # entries that had seen the old version move along, so no node triggers on a
    # migrated value it had already consumed.
    bump = sorted((changed & set(values)) | merged)
    if bump:
        base = _max_version(versions.values())
        for k in bump:
            old_v = versions.get(k)
            new_v = next_version(base)
            base = new_v
            versions[k] = new_v
            if k in changed:
                for s in seen.values():
                    if old_v is not None and s.get(k) == old_v:
                        s[k] = new_v
    for k in changed - set(values):
        versions.pop(k, None)

    # Task ids of the paused step: hash(checkpoint id, ns, step, node, triggers) for
    # pulled nodes, (..., node, PUSH, index) for Sends. Renamed nodes and re-indexed
    # Sends get new ids; their stored writes (finished work, interrupts, resume
    # values) move to them so they are handed back instead of being re-run.
    task_ids: dict[str, str] = {}
    task_paths: dict[str, str] = {}
    dropped_tasks: set[str] = set()
    interrupt_ns: dict[str, tuple[str, str]] = {}
    id_fn = _task_id_fn(checkpoint)
    step = (metadata or {}).get("step")
    cid = checkpoint.get("id")
    compiled = compiled_graph(graph) if graph is not None else None
    write_tids = {t for t, _, _ in orig_writes}
    if id_fn is not None and isinstance(step, int) and isinstance(cid, str) and write_tids:
        cid_bytes = binascii.unhexlify(cid.replace("-", ""))
        step_s = str(step + 1)
        old_joins = [k for k in (checkpoint.get("channel_versions") or {}) if k.startswith("join:")]
        for orig, final in current_of.items():
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
                    dropped_tasks.add(old_tid)
                    break
                if compiled is not None and final in compiled.nodes:
                    new_trig = sorted(compiled.nodes[final].triggers)
                else:
                    composed = {o: c for o, c in current_of.items() if c is not None}
                    new_trig = sorted(rename_channel(t, composed) for t in trig)
                new_tid = id_fn(cid_bytes, final, step_s, final, _PULL, *new_trig)
                task_ids[old_tid] = new_tid
                task_paths[new_tid] = _task_path(_PULL, final)
                interrupt_ns[old_tid] = (f"{orig}:{old_tid}", f"{final}:{new_tid}")
                break
        tasks_now = values.get(_TASKS)
        cur_sends: list[Any] = tasks_now if isinstance(tasks_now, list) else []
        for i, send in enumerate(orig_sends):
            if not isinstance(send, Send):
                continue
            old_tid = id_fn(cid_bytes, send.node, step_s, send.node, _PUSH, str(i))
            if old_tid not in write_tids:
                continue
            j = send_pos[i]
            if j is None:
                dropped_tasks.add(old_tid)
                continue
            new_node = cur_sends[j].node
            if (new_node, j) == (send.node, i):
                continue
            new_tid = id_fn(cid_bytes, new_node, step_s, new_node, _PUSH, str(j))
            task_ids[old_tid] = new_tid
            task_paths[new_tid] = _task_path(_PUSH, j, False)
            interrupt_ns[old_tid] = (f"{send.node}:{old_tid}", f"{new_node}:{new_tid}")

    if task_ids or dropped_tasks:
        remapped = []
        for t, c, v in writes:
            if t in dropped_tasks:
                continue
            if t in task_ids:
                if c == _INTERRUPT and isinstance(v, list | tuple):
                    old_ns, new_ns = interrupt_ns[t]
                    v = type(v)(_remap_interrupt(i, old_ns, new_ns, Interrupt) for i in v)
                t = task_ids[t]
            remapped.append((t, c, v))
        writes = remapped

    if compiled is not None:
        orphans = _orphaned_nodes(values, writes, set(compiled.nodes), Send)
        if orphans:
            raise _OrphanedWork(orphans)

    cp["channel_values"] = values
    cp["channel_versions"] = versions
    cp["versions_seen"] = seen
    if "updated_channels" in checkpoint:
        cp["updated_channels"] = updated
    writes_changed = len(writes) != len(orig_writes) or any(
        a[0] != b[0] or a[1] != b[1] or a[2] is not b[2] for a, b in zip(writes, orig_writes, strict=False)
    )
    return MigrationResult(
        checkpoint=cp,
        writes=writes,
        changed=changed,
        writes_changed=writes_changed,
        task_ids=task_ids,
        task_paths=task_paths,
        dropped_tasks=dropped_tasks,
        steps=[m.label for m in chain],
    )


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

# The pre-migration rows, copied server side (exact bytes) in the migration's own
# transaction: the checkpoint JSON, its metadata, its pending writes, and the blobs the
# migrated checkpoint no longer references (prune may delete those later).
INSERT_LOG_SQL = """
INSERT INTO durable_migration_log (
    thread_id, checkpoint_ns, checkpoint_id, from_version, to_version, steps, origin,
    old_checkpoint, old_metadata, old_writes, old_blobs)
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, %(from)s, %(to)s, %(steps)s, %(origin)s,
       c.checkpoint, c.metadata,
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                    'task_id', w.task_id, 'task_path', w.task_path, 'idx', w.idx,
                    'channel', w.channel, 'type', w.type, 'blob', encode(w.blob, 'base64'))
                    ORDER BY w.task_id, w.idx)
                 FROM checkpoint_writes w
                 WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
                   AND w.checkpoint_id = c.checkpoint_id), '[]'::jsonb),
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
                    'channel', b.channel, 'version', b.version, 'type', b.type,
                    'blob', encode(b.blob, 'base64')))
                 FROM checkpoint_blobs b
                 JOIN unnest(%(channels)s::text[], %(versions)s::text[]) AS o(channel, version)
                   ON b.channel = o.channel AND b.version = o.version
                 WHERE b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns), '[]'::jsonb)
FROM checkpoints c
WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = %(ns)s AND c.checkpoint_id = %(cid)s
RETURNING id
"""

# The migration's own transaction locks the checkpoint row and re-reads its version:
# a concurrent migration (another worker, the CLI) is detected, never interleaved.
LOCK_CHECKPOINT_SQL = """
SELECT metadata ->> 'graph_version' AS graph_version,
       checkpoint -> 'channel_values' AS inline_values
FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s
FOR UPDATE
"""

# Outside a run (CLI, batch): lock the thread row so no run can take the lease (and
# read the checkpoint) until this transaction commits; the lease columns say whether
# a live run holds it now.
LOCK_THREAD_SQL = """
SELECT lease_owner, EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS expires_in
FROM durable_threads WHERE thread_id = %s FOR UPDATE
"""

WRITE_PATHS_SQL = """
SELECT DISTINCT task_id, task_path FROM checkpoint_writes
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s
"""

SET_THREAD_VERSION_SQL = "UPDATE durable_threads SET graph_version = %s WHERE thread_id = %s"

# A checkpoint written outside a run with no version known (update_state from a
# script) inherits its parent's, so editing a thread never launders it to unversioned.
INHERIT_VERSION_SQL = """
UPDATE checkpoints c
SET metadata = c.metadata || jsonb_build_object('graph_version', p.metadata -> 'graph_version')
FROM checkpoints p
WHERE p.thread_id = %s AND p.checkpoint_ns = %s AND p.checkpoint_id = %s
  AND p.metadata ? 'graph_version'
  AND c.thread_id = %s AND c.checkpoint_ns = %s AND c.checkpoint_id = %s
  AND NOT (c.metadata ? 'graph_version')
"""

# Latest root checkpoint of every thread, with its version and time.
_LATEST_CTE = """
WITH latest AS (
    SELECT DISTINCT ON (c.thread_id)
           c.thread_id, c.checkpoint_id, c.metadata ->> 'graph_version' AS graph_version,
           c.metadata ->> 'migrated_from' AS migrated_from,
           (c.metadata ->> 'step')::int AS step,
           (c.checkpoint ->> 'ts')::timestamptz AS ts
    FROM checkpoints c
    WHERE c.checkpoint_ns = ''
    ORDER BY c.thread_id, c.checkpoint_id DESC
)
"""

SUMMARY_SQL = (
    _LATEST_CTE
    + """
SELECT l.graph_version, COALESCE(t.status, 'unknown') AS status, count(*)::int AS threads,
       max(GREATEST(l.ts, t.updated_at)) AS last_activity
FROM latest l LEFT JOIN durable_threads t ON t.thread_id = l.thread_id
GROUP BY 1, 2
"""
)

THREADS_SQL = (
    _LATEST_CTE
    + """
SELECT l.thread_id, l.graph_version, COALESCE(t.status, 'unknown') AS status,
       l.checkpoint_id, l.step, l.migrated_from,
       GREATEST(l.ts, t.updated_at) AS last_activity
FROM latest l LEFT JOIN durable_threads t ON t.thread_id = l.thread_id
WHERE (%(any_version)s OR l.graph_version IS NOT DISTINCT FROM %(version)s)
  AND (%(status)s::text IS NULL OR COALESCE(t.status, 'unknown') = %(status)s)
  AND (%(thread_ids)s::text[] IS NULL OR l.thread_id = ANY(%(thread_ids)s))
ORDER BY GREATEST(l.ts, t.updated_at) DESC NULLS LAST, l.thread_id
LIMIT %(limit)s
"""
)

LOG_SQL = """
SELECT id, thread_id, checkpoint_ns, checkpoint_id, from_version, to_version, steps, origin,
       migrated_at, undone_at, jsonb_array_length(old_writes) AS old_writes,
       jsonb_array_length(old_blobs) AS old_blobs
FROM durable_migration_log
WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
ORDER BY id DESC
LIMIT %(limit)s
"""


@_telemetry.instrument("migration")
def flow_migrate(
    saver: Any,
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


@dataclass
class MigrationReport:
    """Outcome of ``migrate_threads``: thread ids per outcome, errors by thread."""

    from_version: str
    to_version: str
    dry_run: bool
    steps: list[str]
    migrated: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.busy

    def as_dict(self) -> dict[str, Any]:
        return {
            "from_version": self.from_version,
            "to_version": self.to_version,
            "dry_run": self.dry_run,
            "steps": self.steps,
            "migrated": self.migrated,
            "failed": self.failed,
            "busy": self.busy,
            "skipped": self.skipped,
        }


def _flow_migrate_thread(
    saver: Any,
    thread_id: str,
    from_version: str,
    to_version: str,
    chain: Sequence[Migration],
    graph: Any,
    dry_run: bool,
) -> Flow[str]:
    cfg = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    saved = yield Tx(lambda: saver._op_get_tuple(cfg))
    if saved is None or (saved.metadata or {}).get(VERSION_KEY) != from_version:
        return "skipped"  # moved on (a run migrated or finished it) since the listing
    yield from flow_migrate(
        saver, saved, from_version, to_version, chain, graph=graph, origin="batch", dry_run=dry_run
    )
    return "migrated"


@_audit.audited_flow("versions.migrate", _audit.describe_migrate)
def _flow_migrate_threads(
    saver: Any,
    from_version: str,
    to_version: str,
    chain: Sequence[Migration],
    graph: Any,
    dry_run: bool,
    thread_ids: Sequence[str] | None,
    limit: int | None,
    on_progress: Callable[[str, str], Any] | None,
) -> Flow[MigrationReport]:
    """The batch migration, written once for both savers: each thread in its own
    transaction(s); a busy or failing thread is reported, never fatal."""
    report = MigrationReport(from_version, to_version, dry_run, [m.label for m in chain])
    rows = yield Tx(lambda: _op_threads(from_version, False, None, thread_ids, limit))
    for row in rows:
        tid = row["thread_id"]
        try:
            outcome = yield from _flow_migrate_thread(
                saver, tid, from_version, to_version, chain, graph, dry_run
            )
        except ThreadBusyError:
            outcome = "busy"
        except DurableError as exc:
            outcome = "failed"
            report.failed[tid] = str(exc)
        _record(report, tid, outcome)
        if on_progress is not None:
            yield Hook(on_progress, (tid, outcome))
    return report


def migrate_threads(
    saver: Any,
    from_version: str,
    to_version: str | None = None,
    *,
    graph: Any = None,
    registry: MigrationRegistry | None = None,
    dry_run: bool = False,
    thread_ids: Sequence[str] | None = None,
    limit: int | None = None,
    on_progress: Callable[[str, str], Any] | None = None,
) -> MigrationReport:
    """Migrate every thread whose latest checkpoint is ``from_version`` (sync saver).

    ``to_version`` defaults to ``graph_fingerprint(graph)``; ``registry`` to
    ``saver.migrations``. Each thread is migrated in its own transaction; a thread a
    live run holds is reported ``busy`` and left alone; a failing one is reported in
    ``failed`` with its stored rows untouched. ``dry_run`` runs the migration functions
    and the orphaned-work check without writing. ``on_progress(thread_id, outcome)``
    is called after each thread."""
    to_version, chain = _resolve(saver, from_version, to_version, graph, registry)
    return cast(
        MigrationReport,
        saver.run_flow(
            _flow_migrate_threads(
                saver, from_version, to_version, chain, graph, dry_run, thread_ids, limit, on_progress
            )
        ),
    )


async def amigrate_threads(
    saver: Any,
    from_version: str,
    to_version: str | None = None,
    *,
    graph: Any = None,
    registry: MigrationRegistry | None = None,
    dry_run: bool = False,
    thread_ids: Sequence[str] | None = None,
    limit: int | None = None,
    on_progress: Callable[[str, str], Any] | None = None,
) -> MigrationReport:
    """``migrate_threads`` for an ``AsyncDurablePostgresSaver``."""
    to_version, chain = _resolve(saver, from_version, to_version, graph, registry)
    return cast(
        MigrationReport,
        await saver.arun_flow(
            _flow_migrate_threads(
                saver, from_version, to_version, chain, graph, dry_run, thread_ids, limit, on_progress
            )
        ),
    )


def _resolve(
    saver: Any, from_version: str, to_version: str | None, graph: Any, registry: MigrationRegistry | None
) -> tuple[str, list[Migration]]:
    _check_name(from_version, "from_version")
    if to_version is None:
        if graph is None:
            raise ConfigurationError("give to_version or the new graph (its fingerprint is the version)")
        to_version = graph_fingerprint(graph)
    reg = registry if registry is not None else saver.migrations
    chain = reg.path(from_version, to_version)
    if not chain:
        raise ConfigurationError(
            f"no registered migration path from {from_version!r} to {to_version!r} "
            f"(registered: {[m.label for m in reg]})",
            from_version=from_version,
            to_version=to_version,
        )
    return to_version, chain


def _record(report: MigrationReport, tid: str, outcome: str) -> None:
    if outcome == "migrated":
        report.migrated.append(tid)
    elif outcome == "busy":
        report.busy.append(tid)
    elif outcome == "skipped":
        report.skipped.append(tid)


def _op_threads(
    version: str | None,
    any_version: bool,
    status: str | None,
    thread_ids: Sequence[str] | None,
    limit: int | None,
) -> Op[list[dict[str, Any]]]:
    params = {
        "any_version": any_version,
        "version": version,
        "status": status,
        "thread_ids": list(thread_ids) if thread_ids is not None else None,
        "limit": limit,
    }
    rows = yield Batch([Stmt(THREADS_SQL, params, fetch=True, prepare=False)])
    return [dict(r) for r in rows[0]]


def thread_ids_at(
    saver: Any, version: str | None, *, thread_ids: Sequence[str] | None = None, limit: int | None = None
) -> list[str]:
    """Threads whose latest checkpoint carries ``version`` (``None``: unversioned)."""
    rows = saver.run_op(lambda: _op_threads(version, False, None, thread_ids, limit))
    return [r["thread_id"] for r in rows]


def list_threads(
    saver: Any,
    *,
    version: str | None = None,
    any_version: bool = True,
    status: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Per-thread rows: thread_id, graph_version, status, checkpoint_id, step,
    migrated_from, last_activity (newest first)."""
    return list(saver.run_op(lambda: _op_threads(version, any_version, status, None, limit)))


def version_summary(saver: Any) -> list[dict[str, Any]]:
    """Threads grouped by the graph version of their latest checkpoint: count, count
    per status (``durable_threads.status``; ``unknown`` when never run by this saver)
    and last activity, most recent version first."""

    def op() -> Op[list[dict[str, Any]]]:
        rows = yield Batch([Stmt(SUMMARY_SQL, None, fetch=True, prepare=False)])
        return [dict(r) for r in rows[0]]

    groups: dict[str | None, dict[str, Any]] = {}
    for row in saver.run_op(op):
        g = groups.setdefault(
            row["graph_version"],
            {"graph_version": row["graph_version"], "threads": 0, "by_status": {}, "last_activity": None},
        )
        g["threads"] += row["threads"]
        g["by_status"][row["status"]] = row["threads"]
        if row["last_activity"] is not None and (
            g["last_activity"] is None or row["last_activity"] > g["last_activity"]
        ):
            g["last_activity"] = row["last_activity"]
    for g in groups.values():
        g["unfinished"] = g["threads"] - g["by_status"].get("done", 0)
    return sorted(
        groups.values(),
        key=lambda g: (g["last_activity"] is not None, g["last_activity"] or 0),
        reverse=True,
    )


def migration_log(saver: Any, *, thread_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Rows of ``durable_migration_log`` (newest first), without the backup payloads."""

    def op() -> Op[list[dict[str, Any]]]:
        rows = yield Batch(
            [Stmt(LOG_SQL, {"thread_id": thread_id, "limit": limit}, fetch=True, prepare=False)]
        )
        return [dict(r) for r in rows[0]]

    return list(saver.run_op(op))


# The envelopes (artifact references) among a backup's blobs and writes.
_BACKUP_ENVELOPES_SQL = """
SELECT decode(e.blob, 'base64') AS blob FROM durable_migration_log l,
       jsonb_to_recordset(l.old_blobs || l.old_writes) AS e(type text, blob text)
WHERE l.id = %s AND e.type = %s AND e.blob IS NOT NULL
"""
# Which of them are stored, locked against GC until the undo commits (GC deletes an
# artifact only with FOR UPDATE; a key-share lock makes it wait or skip the row).
_LOCK_ARTIFACTS_SQL = "SELECT digest FROM durable_artifacts WHERE digest = ANY(%b) FOR KEY SHARE"


def _op_verify_backup(saver: Any, tid: str, log: Mapping[str, Any]) -> Op[list[bytes]]:
    """Every artifact the backup's envelopes need (chunk children included) is stored
    and now locked; returns their digests. Else ``MigrationBackupError``, nothing done."""
    from langgraph_durable.artifacts import REF_TYPE
    from langgraph_durable.retention import _op_closure

    rows = yield Batch([Stmt(_BACKUP_ENVELOPES_SQL, (log["id"], REF_TYPE), fetch=True, prepare=False)])
    pairs = [(REF_TYPE, bytes(r["blob"])) for r in rows[0]]
    if not pairs:
        return []
    where = {"thread_id": tid, "checkpoint_ns": log["checkpoint_ns"], "checkpoint_id": log["checkpoint_id"]}
    need = sorted((yield from _op_closure(saver, pairs, where)))
    found = yield Batch([Stmt(_LOCK_ARTIFACTS_SQL, (need,), fetch=True, prepare=False)])
    missing = sorted(set(need) - {bytes(r["digest"]) for r in found[0]})
    if missing:
        from langgraph_durable.errors import ArtifactNotFoundError

        cause = ArtifactNotFoundError(missing[0].hex(), **where)
        raise MigrationBackupError(
            thread_id=tid,
            checkpoint_id=log["checkpoint_id"],
            migration_id=int(log["id"]),
            from_version=log["from_version"],
            to_version=log["to_version"],
            missing=[d.hex() for d in missing],
        ) from cause
    return need


@_audit.audited("versions.undo", _audit.describe_undo)
def op_undo(
    thread_id: str,
    migration_id: int | None = None,
    *,
    saver: Any = None,
    attempt: dict[str, Any] | None = None,
) -> Op[dict[str, Any]]:
    """Restore the rows a migration replaced, if the thread has not moved on since.

    With ``saver`` (``undo_migration`` always passes it) the backup is verified first:
    every artifact its blobs and writes reference must still be stored, else
    ``MigrationBackupError`` and nothing is touched; the thread's reference rows are
    then re-added for them, so a later GC keeps what the restored rows use.

    ``attempt``: a dict shared by the attempts of one call; by default the driver's
    op memo (``_io.op_memo``), which survives its retries after a lost connection."""
    from langgraph_durable.sql.artifacts import (
        ARTIFACT_LOCK_CLASS,
        ARTIFACT_LOCK_SHARED_SQL,
        INSERT_ARTIFACT_REF_SQL,
    )

    tid = str(thread_id)
    # The memo survives the driver's retries of this op (_io.op_memo): the first attempt
    # records the migration it undoes, so a retry after a lost COMMIT reply finds that
    # one (undone) instead of undoing the migration before it too.
    memo = attempt if attempt is not None else op_memo()
    if "id" in memo:
        migration_id = int(memo["id"])
    rows = yield Batch(
        [
            # The thread's artifact lock (shared, as a put takes it), before the row lock
            # below: the order every writer takes them in.
            Stmt(ARTIFACT_LOCK_SHARED_SQL, (ARTIFACT_LOCK_CLASS, tid)),
            Stmt(LOCK_THREAD_SQL, (tid,), fetch=True),
            Stmt(
                "SELECT id, checkpoint_ns, checkpoint_id, from_version, to_version, "
                "undone_at IS NOT NULL AS undone "
                "FROM durable_migration_log WHERE thread_id = %s "
                "AND (undone_at IS NULL OR %s) "
                "AND (%s::bigint IS NULL OR id = %s) ORDER BY id DESC LIMIT 1 FOR UPDATE",
                (tid, "id" in memo, migration_id, migration_id),
                fetch=True,
            ),
        ]
    )
    rows = rows[1:]
    lease = rows[0][0] if rows[0] else None
    if lease and lease["lease_owner"] and (lease["expires_in"] or 0) > 0:
        raise ThreadBusyError(tid, lease["lease_owner"], lease["expires_in"])
    if not rows[1]:
        raise MigrationError(
            f"thread {tid!r} has no migration to undo"
            + (f" with id {migration_id}" if migration_id is not None else ""),
            thread_id=tid,
            from_version=None,
            to_version=None,
        )
    log = rows[1][0]
    result = {
        "migration_id": log["id"],
        "thread_id": tid,
        "checkpoint_id": log["checkpoint_id"],
        "restored_version": log["from_version"],
        "undone_version": log["to_version"],
    }
    if log["undone"]:  # this call's own earlier attempt committed
        return result
    memo["id"] = log["id"]
    head = yield Batch(
        [
            Stmt(
                "SELECT checkpoint_id, metadata ->> %s AS migration_id FROM checkpoints "
                "WHERE thread_id = %s AND checkpoint_ns = %s ORDER BY checkpoint_id DESC LIMIT 1 "
                "FOR UPDATE",
                (MIGRATION_ID_KEY, tid, log["checkpoint_ns"]),
                fetch=True,
            )
        ]
    )
    cur = head[0][0] if head[0] else None
    if cur is None or cur["checkpoint_id"] != log["checkpoint_id"] or cur["migration_id"] != str(log["id"]):
        raise MigrationError(
            f"thread {tid!r} has moved on since migration {log['id']} "
            f"({log['from_version']} -> {log['to_version']}): its latest checkpoint is no longer "
            "the migrated one, so undoing would discard later work; fork from the backup instead",
            thread_id=tid,
            from_version=log["from_version"],
            to_version=log["to_version"],
        )
    digests: list[bytes] = []
    if saver is not None:
        digests = yield from _op_verify_backup(saver, tid, log)
    where = (tid, log["checkpoint_ns"], log["checkpoint_id"])
    refs = [Stmt(INSERT_ARTIFACT_REF_SQL, (tid, digests))] if digests else []
    yield Batch(
        [
            *refs,
            Stmt(
                "UPDATE checkpoints c SET checkpoint = l.old_checkpoint, metadata = l.old_metadata "
                "FROM durable_migration_log l WHERE l.id = %s "
                "AND c.thread_id = %s AND c.checkpoint_ns = %s AND c.checkpoint_id = %s",
                (log["id"], *where),
            ),
            Stmt(
                "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_ns = %s "
                "AND checkpoint_id = %s",
                where,
            ),
            Stmt(
                "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, "
                "task_path, idx, channel, type, blob) "
                "SELECT l.thread_id, l.checkpoint_ns, l.checkpoint_id, w.task_id, w.task_path, w.idx, "
                "w.channel, w.type, decode(w.blob, 'base64') "
                "FROM durable_migration_log l, jsonb_to_recordset(l.old_writes) AS "
                "w(task_id text, task_path text, idx int, channel text, type text, blob text) "
                "WHERE l.id = %s",
                (log["id"],),
            ),
            Stmt(
                "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
                "SELECT l.thread_id, l.checkpoint_ns, b.channel, b.version, b.type, "
                "decode(b.blob, 'base64') "
                "FROM durable_migration_log l, jsonb_to_recordset(l.old_blobs) AS "
                "b(channel text, version text, type text, blob text) "
                "WHERE l.id = %s ON CONFLICT DO NOTHING",
                (log["id"],),
            ),
            Stmt("UPDATE durable_migration_log SET undone_at = now() WHERE id = %s", (log["id"],)),
            Stmt(SET_THREAD_VERSION_SQL, (log["from_version"], tid)),
        ]
    )
    return result


def undo_migration(saver: Any, thread_id: str, migration_id: int | None = None) -> dict[str, Any]:
    """Put back the checkpoint a migration rewrote (latest migration of the thread, or
    ``migration_id``), byte for byte, provided the thread has not run since."""
    return dict(
        saver.run_op(lambda: op_undo(thread_id, migration_id, saver=saver))
    )


__all__ = [
    "POLICY_KEY",
    "RUN_GRAPH",
    "VERSION_KEY",
    "Migration",
    "MigrationRegistry",
    "MigrationReport",
    "MigrationResult",
    "UnversionedPolicy",
    "VersionPolicy",
    "amigrate_threads",
    "apply_migrations",
    "describe_graph",
    "flow_migrate",
    "graph_fingerprint",
    "list_threads",
    "migrate_threads",
    "migration_log",
    "pending_orphans",
    "undo_migration",
    "version_summary",
]
