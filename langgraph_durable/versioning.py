"""Graph-version stamping, fingerprints and checkpoint migrations.

Vocabulary follows Temporal's worker versioning: a thread is *pinned* to the graph
version that wrote its latest checkpoint. On resume the saver compares that version
with the running graph's and applies the policy:

* ``"refuse"`` (default): raise ``GraphVersionMismatchError`` before any node runs,
  unless a migration path from the stored version to the current one is registered,
  in which case the checkpoint is migrated (atomically, in place) and the run goes on.
* ``"warn"``: log a warning and continue on the new graph (LangGraph's stock behaviour).
* ``"auto-upgrade"``: an operator's per-invoke override (``configurable.version_policy``)
  meaning "I accept the skew for this run": continue without warning.

Threads written before stamping existed carry no version: ``unversioned_policy``
(default ``"adopt"``) lets them run and stamps them; ``"refuse"`` treats them as a
mismatch.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import logging
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from langgraph_durable.errors import ConfigurationError

logger = logging.getLogger("langgraph_durable.versioning")

VersionPolicy = Literal["refuse", "warn", "auto-upgrade"]
UnversionedPolicy = Literal["adopt", "refuse"]
VERSION_KEY = "graph_version"
POLICY_KEY = "version_policy"

_fingerprint_cache: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def graph_fingerprint(graph: Any, *, include_source: bool = False) -> str:
    """A stable hash of what resuming a checkpoint depends on.

    Accepts a ``StateGraph`` builder, a compiled graph, or any ``Pregel``. Covers node
    names, edges, conditional-edge destinations, channel names and their reducer kinds,
    interrupt_before/after, and subgraphs (recursively). With ``include_source=True``
    node source code is hashed too (as DBOS does), so any code edit changes the version.
    Independent of ``PYTHONHASHSEED`` and of the order in which nodes were added.
    """
    if not include_source:
        try:
            cached = _fingerprint_cache.get(graph)
        except TypeError:
            cached = None
        if cached is not None:
            return cached
    desc = describe_graph(graph, include_source=include_source)
    digest = hashlib.sha256(orjson.dumps(desc, option=orjson.OPT_SORT_KEYS)).hexdigest()
    fp = f"fp-{digest[:16]}"
    if not include_source:
        try:
            _fingerprint_cache[graph] = fp
        except TypeError:
            pass
    return fp


def describe_graph(graph: Any, *, include_source: bool = False) -> dict[str, Any]:
    """The canonical, JSON-able description that ``graph_fingerprint`` hashes."""
    from langgraph.graph.state import StateGraph
    from langgraph.pregel import Pregel

    builder: StateGraph | None = None
    compiled: Pregel | None = None
    if isinstance(graph, StateGraph):
        builder = graph
        compiled = graph.compile()
    elif isinstance(graph, Pregel):
        compiled = graph
        builder = getattr(graph, "builder", None)
        if not isinstance(builder, StateGraph):
            builder = None
    else:
        raise ConfigurationError(
            f"graph_fingerprint expects a StateGraph or a compiled graph, got {type(graph).__name__}"
        )
    desc: dict[str, Any] = {"channels": _describe_channels(compiled.channels)}
    if builder is not None:
        nodes: dict[str, Any] = {}
        for name, spec in builder.nodes.items():
            nodes[name] = _describe_runnable(spec.runnable, include_source)
        desc["nodes"] = nodes
        desc["edges"] = sorted([list(e) for e in builder.edges])
        desc["waiting_edges"] = sorted(
            [[sorted(starts), end] for starts, end in getattr(builder, "waiting_edges", set())]
        )
        branches: dict[str, Any] = {}
        for source, specs in builder.branches.items():
            for bname, bspec in specs.items():
                ends = sorted(bspec.ends.values()) if bspec.ends else "dynamic"
                branches[f"{source}:{bname}"] = ends
        desc["branches"] = branches
    else:
        nodes = {}
        for name, node in compiled.nodes.items():
            nodes[name] = {
                "triggers": sorted(node.triggers),
                "reads": sorted(node.channels) if isinstance(node.channels, list) else node.channels,
                "writes": sorted(_static_writes(node)),
                "bound": _describe_runnable(node.bound, include_source),
            }
        desc["nodes"] = nodes
    desc["interrupt_before"] = _names(getattr(compiled, "interrupt_before_nodes", ()))
    desc["interrupt_after"] = _names(getattr(compiled, "interrupt_after_nodes", ()))
    return desc


def _names(value: Any) -> Any:
    if value == "*" or isinstance(value, str):
        return value
    return sorted(value)


def _describe_channels(channels: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, chan in channels.items():
        entry: dict[str, Any] = {"kind": type(chan).__name__}
        op = getattr(chan, "operator", None)
        if op is not None:
            entry["reducer"] = f"{getattr(op, '__module__', '')}.{getattr(op, '__qualname__', type(op).__name__)}"
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
        src = getattr(func, "__qualname__", type(func).__name__)
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


@dataclass(frozen=True)
class Migration:
    """One step ``from_version -> to_version``: ``fn`` rewrites the channel values
    (the state) and ``rename_nodes`` maps old node names to new ones for pending work."""

    from_version: str
    to_version: str
    fn: MigrationFn | None = None
    rename_nodes: Mapping[str, str] = field(default_factory=dict)


class MigrationRegistry:
    """Registered migrations; finds the shortest chain between two versions."""

    def __init__(self) -> None:
        self._edges: dict[str, list[Migration]] = {}

    def register(
        self,
        from_version: str,
        to_version: str,
        fn: MigrationFn | None = None,
        *,
        rename_nodes: Mapping[str, str] | None = None,
    ) -> Any:
        """Register ``fn`` (or use as a decorator: ``@registry.register("v1", "v2")``)."""
        if from_version == to_version:
            raise ConfigurationError("a migration must change the version", version=from_version)

        def add(f: MigrationFn | None) -> MigrationFn | None:
            m = Migration(from_version, to_version, f, dict(rename_nodes or {}))
            edges = self._edges.setdefault(from_version, [])
            edges[:] = [e for e in edges if e.to_version != to_version] + [m]
            return f

        if fn is None and rename_nodes is None:
            return add
        add(fn)
        return fn

    def path(self, from_version: str, to_version: str) -> list[Migration] | None:
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

    def __bool__(self) -> bool:
        return bool(self._edges)

    def __len__(self) -> int:
        return sum(len(v) for v in self._edges.values())


def rename_channel(name: str, renames: Mapping[str, str]) -> str:
    """Map a node-specific channel (``branch:to:old``) to its new node name."""
    for prefix in ("branch:to:", "start:", "join:"):
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            node, sep, tail = rest.partition(":")
            if node in renames:
                return f"{prefix}{renames[node]}{sep}{tail}"
    return name


def apply_migrations(
    chain: list[Migration],
    checkpoint: dict[str, Any],
    pending_writes: list[tuple[str, str, Any]],
    next_version: Callable[[Any], Any],
) -> tuple[dict[str, Any], list[tuple[str, str, Any]], set[str]]:
    """Run ``chain`` on a copy of ``checkpoint``; returns (checkpoint, writes, changed
    channels). Pure: the stored checkpoint is never touched, so a failing migration
    leaves nothing behind."""
    from langgraph.types import Send

    cp = copy.deepcopy(checkpoint)
    writes = list(pending_writes)
    changed: set[str] = set()
    for m in chain:
        values = dict(cp["channel_values"])
        if m.fn is not None:
            new_values = m.fn(copy.deepcopy(values))
            if not isinstance(new_values, dict):
                raise TypeError(
                    f"migration {m.from_version}->{m.to_version} must return a dict of channel values"
                )
            for k in set(values) | set(new_values):
                if k not in new_values:
                    changed.add(k)
                elif k not in values or values[k] is not new_values[k]:
                    changed.add(k)
            values = new_values
        if m.rename_nodes:
            r = m.rename_nodes
            values = {rename_channel(k, r): v for k, v in values.items()}
            cp["channel_versions"] = {
                rename_channel(k, r): v for k, v in cp["channel_versions"].items()
            }
            cp["versions_seen"] = {r.get(k, k): v for k, v in cp["versions_seen"].items()}
            if cp.get("updated_channels"):
                cp["updated_channels"] = [rename_channel(c, r) for c in cp["updated_channels"]]
            renamed_writes = []
            for tid, chan, val in writes:
                if isinstance(val, Send) and val.node in r:
                    val = Send(r[val.node], val.arg)
                renamed_writes.append((tid, rename_channel(chan, r), val))
            writes = renamed_writes
            if "__pregel_tasks" in values and isinstance(values["__pregel_tasks"], list):
                values["__pregel_tasks"] = [
                    Send(r[s.node], s.arg) if isinstance(s, Send) and s.node in r else s
                    for s in values["__pregel_tasks"]
                ]
                changed.add("__pregel_tasks")
        cp["channel_values"] = values
    for k in changed:
        if k in cp["channel_values"]:
            cp["channel_versions"][k] = next_version(cp["channel_versions"].get(k))
        else:
            cp["channel_versions"].pop(k, None)
    return cp, writes, changed
