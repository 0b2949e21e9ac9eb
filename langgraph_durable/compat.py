"""Is the running graph able to continue a thread written by another graph version?

The fingerprint (``versioning.graph_fingerprint``) says *whether* the graph changed; this
module says *whether the change matters for this thread*. Each graph version's compact
topology (the exact JSON the fingerprint hashes, plus the declared value type of each
state key and a ``DeltaChannel``'s reducer, which are not hashed so fingerprints stay
stable) is stored once per version in ``durable_graph_versions`` at run start. At a
version mismatch, the stored topology is compared with the running graph's and with
the checkpoint's pending work:

* **identical**: same topology (only the version name differs);
* **compatible**: an added state key; a node added, removed, or changed where no pending
  task, Send or interrupt needs it; ``DeltaChannel`` <-> plain reducer on the same key
  (LangGraph reads either from the other); a reducer changed where the declared value
  type is unchanged and the paused step holds no write to fold; definitions reordered;
* **incompatible**: a removed/renamed/changed node with pending work or an interrupt; a
  changed channel type (or reducer and declared type) of a key holding data; a reducer
  change with writes of the paused step still to fold; a removed state key holding data;
  a changed edge out of (or join into) a node with pending tasks;
* **unknown**: no stored topology for the stored version (a thread written by the stock
  saver or before this table existed, or a version name used for two different graphs):
  the check falls back to refusing, as before.

Everything but ``op_record_version`` / ``op_load_versions`` is pure.
"""

from __future__ import annotations

import typing
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, cast

from langchain_core.runnables import RunnableConfig

from langgraph_durable._io import Batch, Flow, Op, Stmt, Tx
from langgraph_durable._view import SaverView
from langgraph_durable.sql.versions import (
    LOAD_VERSIONS_SQL,
    RECORD_VERSION_SQL,
    RECORDED_VERSIONS_SQL,
)
from langgraph_durable.versioning import (
    _END,
    _INTERRUPT,
    _START,
    _TASKS,
    _target_node,
    compiled_graph,
    describe_graph,
    graph_fingerprint,
)

Verdict = Literal["identical", "compatible", "incompatible", "unknown"]

# Version of the stored topology JSON: a row of another format is treated as missing.
TOPOLOGY_FORMAT = 1

# Reducers LangGraph itself treats as one: the batch form a DeltaChannel uses and the
# pairwise form of the same operation (``add_messages``).
_SAME_REDUCER = {
    "langgraph.graph.message._messages_delta_reducer": (
        "langgraph.graph.message._add_messages_wrapper.<locals>._add_messages"
    ),
}
# Channel classes that store the same value and read each other's checkpoints.
_REDUCER_FAMILY = frozenset({"BinaryOperatorAggregate", "DeltaChannel"})

# LangGraph's reserved channel names (langgraph._internal._constants), kept literal.
_RESERVED = frozenset(
    {
        "__start__",
        "__end__",
        "__input__",
        "__interrupt__",
        "__resume__",
        "__error__",
        "__no_writes__",
        "__return__",
        "__previous__",
        "__self__",
        "__scheduled__",
        "__copy__",
    }
)


def is_state_key(name: str) -> bool:
    """A user's state key (``__root__`` is one), not one of LangGraph's routing channels."""
    return not (name.startswith(("branch:", "join:", "start:", "__pregel")) or name in _RESERVED)


_topology_cache: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Compatibility:
    """The classification of one thread's checkpoint against the running graph.

    ``changes``: differences that do not matter for this thread; ``reasons``: why it is
    incompatible (or unknown). ``automatic``: both versions are fingerprints, so the
    default policy may resume a compatible thread without a registered migration (a
    version *name* you chose is a declaration, honoured as before)."""

    verdict: Verdict
    changes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    automatic: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "changes": list(self.changes),
            "reasons": list(self.reasons),
            "automatic": self.automatic,
        }

    def summary(self) -> str:
        if self.verdict == "identical":
            return "identical topology"
        if self.verdict == "compatible":
            return "compatible (" + "; ".join(self.changes) + ")"
        return f"{self.verdict} (" + "; ".join(self.reasons) + ")"


def _type_name(t: Any) -> str | None:
    if t is None:
        return None
    if typing.get_origin(t) is typing.Annotated:
        t = t.__origin__
    if isinstance(t, type) and typing.get_origin(t) is None:
        return f"{t.__module__}.{t.__qualname__}"
    return str(t)


def _callable_name(fn: Any) -> str:
    qual = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', '') or ''}.{qual}"


def graph_topology(graph: Any) -> dict[str, Any]:
    """What is stored per graph version: ``describe_graph`` (the fingerprint's input)
    plus per state key its declared value type and a ``DeltaChannel``'s reducer."""
    from langgraph.pregel import Pregel

    cacheable = isinstance(graph, Pregel)
    if cacheable:
        cached = _topology_cache.get(graph)
        if cached is not None:
            return cached
    compiled = compiled_graph(graph)
    types: dict[str, str | None] = {}
    reducers: dict[str, str] = {}
    for name, chan in compiled.channels.items():
        if not is_state_key(name):
            continue
        types[name] = _type_name(getattr(chan, "typ", None))
        reducer = getattr(chan, "reducer", None)
        if reducer is not None:
            reducers[name] = _callable_name(reducer)
    topo = {
        "format": TOPOLOGY_FORMAT,
        "fingerprint": graph_fingerprint(graph),
        "description": describe_graph(graph),
        "types": types,
        "reducers": reducers,
    }
    if cacheable:
        try:
            _topology_cache[graph] = topo
        except TypeError:
            pass
    return topo


# --- what the checkpoint still needs ----------------------------------------------------


@dataclass
class _Pending:
    nodes: set[str] = field(default_factory=set)
    interrupted: bool = False
    data_keys: set[str] = field(default_factory=set)
    written_keys: set[str] = field(default_factory=set)


def _pending(checkpoint: Mapping[str, Any], writes: Sequence[tuple[str, str, Any]]) -> _Pending:
    from langgraph.types import Send

    out = _Pending()
    values = checkpoint.get("channel_values") or {}
    for k, v in values.items():
        target = _target_node(k)
        if target is not None and target != _END:
            out.nodes.add(target)
        if k == _START:
            out.nodes.add(_START)  # input not yet processed: START's edges route it
        if k == _TASKS and isinstance(v, list):
            out.nodes.update(s.node for s in v if isinstance(s, Send))
    for _, c, v in writes:
        target = _target_node(c)
        if target is not None and target != _END:
            out.nodes.add(target)
        if c == _TASKS and isinstance(v, Send):
            out.nodes.add(v.node)
        if c == _INTERRUPT:
            out.interrupted = True
        if is_state_key(c):
            out.written_keys.add(c)
    out.data_keys = {
        k for k in (*(checkpoint.get("channel_versions") or {}), *values) if is_state_key(k)
    } | out.written_keys
    return out


# --- comparing two topologies -------------------------------------------------------------


def _out_edges(desc: Mapping[str, Any], node: str) -> list[Any]:
    out: list[Any] = [["edge", e[1]] for e in desc.get("edges") or () if e[0] == node]
    out += [["branch", d] for d in (desc.get("branches") or {}).get(node, ())]
    out += [["join", w[0], w[1]] for w in desc.get("waiting_edges") or () if node in w[0]]
    ends = ((desc.get("nodes") or {}).get(node) or {}).get("ends")
    if ends:
        out.append(["command", ends])
    handler = ((desc.get("nodes") or {}).get(node) or {}).get("error_handler")
    if handler:
        out.append(["error_handler", handler])
    return sorted(out, key=repr)


def _joins_into(desc: Mapping[str, Any], node: str) -> list[Any]:
    return sorted((w for w in desc.get("waiting_edges") or () if w[1] == node), key=repr)


def _reducer(topo: Mapping[str, Any], key: str) -> str | None:
    entry = (topo["description"].get("channels") or {}).get(key) or {}
    name = entry.get("reducer") or (topo.get("reducers") or {}).get(key)
    return _SAME_REDUCER.get(name, name) if name else None


def classify(
    stored: Mapping[str, Any] | None,
    running: Mapping[str, Any],
    checkpoint: Mapping[str, Any],
    pending_writes: Sequence[tuple[str, str, Any]],
    *,
    stored_version: str | None = None,
    automatic: bool = False,
) -> Compatibility:
    """Classify continuing ``checkpoint`` (with its pending writes) written by the graph
    ``stored`` (a topology as stored, ``None`` if unknown) on the graph ``running``."""
    if stored is None or stored.get("format") != TOPOLOGY_FORMAT:
        return Compatibility(
            "unknown",
            reasons=(
                f"no stored topology for graph version {stored_version!r} (written by the stock "
                "saver or an older langgraph-durable, or the name is shared by different graphs)",
            ),
        )
    s, r = stored["description"], running["description"]
    if (
        s == r
        and stored.get("types") == running.get("types")
        and stored.get("reducers") == running.get("reducers")
    ):
        return Compatibility("identical", automatic=automatic)
    pend = _pending(checkpoint, pending_writes)
    changes: list[str] = []
    reasons: list[str] = []
    _judge_nodes(s, r, pend, changes, reasons)
    _judge_edges(s, r, pend, changes, reasons)
    _judge_channels(stored, running, pend, changes, reasons)
    known = {"channels", "nodes", "edges", "waiting_edges", "branches"}
    for key in sorted((set(s) | set(r)) - known):
        if s.get(key) != r.get(key):
            reasons.append(f"unclassified change in {key!r}")
    if reasons:
        return Compatibility("incompatible", tuple(changes), tuple(reasons), automatic)
    if not changes:
        return Compatibility("identical", automatic=automatic)
    return Compatibility("compatible", tuple(changes), (), automatic)


def _work(pend: _Pending) -> str:
    # Interrupts are stored per task id, which hashes the node with its triggers: the
    # thread is known to be paused at an interrupt, not (without the old graph) whose.
    return "pending work (the thread is paused at an interrupt)" if pend.interrupted else "pending work"


def _judge_nodes(
    s: Mapping[str, Any], r: Mapping[str, Any], pend: _Pending, changes: list[str], reasons: list[str]
) -> None:
    """Nodes removed, added or changed: a change is a reason only with pending work."""
    s_nodes: Mapping[str, Any] = s.get("nodes") or {}
    r_nodes: Mapping[str, Any] = r.get("nodes") or {}
    for n in sorted(set(s_nodes) - set(r_nodes)):
        if n in pend.nodes:
            reasons.append(
                f"node {n!r} was removed or renamed but the checkpoint has {_work(pend)} for it"
            )
        else:
            changes.append(f"node {n!r} removed (no pending work needs it)")
    for n in sorted(set(r_nodes) - set(s_nodes)):
        changes.append(f"node {n!r} added")
    for n in sorted(set(s_nodes) & set(r_nodes)):
        # A node's own entry (what it runs: a subgraph's fingerprint, its triggers and
        # writes for a functional graph), apart from routing, compared below.
        a = {k: v for k, v in s_nodes[n].items() if k not in ("ends", "error_handler")}
        b = {k: v for k, v in r_nodes[n].items() if k not in ("ends", "error_handler")}
        if a != b:
            if n in pend.nodes:
                reasons.append(
                    f"node {n!r} changed ({', '.join(sorted(set(a) | set(b)))}) and has {_work(pend)}"
                )
            else:
                changes.append(f"node {n!r} changed (no pending work)")


def _judge_edges(
    s: Mapping[str, Any], r: Mapping[str, Any], pend: _Pending, changes: list[str], reasons: list[str]
) -> None:
    """Routing out of (and joins into) every node still there."""
    if "edges" not in s and "edges" not in r:
        return
    s_nodes: Mapping[str, Any] = s.get("nodes") or {}
    r_nodes: Mapping[str, Any] = r.get("nodes") or {}
    for n in sorted(set(s_nodes) | set(r_nodes) | {_START}):
        if n not in r_nodes and n != _START:
            continue  # removed: judged with the nodes
        if _out_edges(s, n) != _out_edges(r, n):
            if n in pend.nodes:
                reasons.append(f"edges out of node {n!r} changed and it has pending tasks")
            else:
                changes.append(f"edges out of node {n!r} changed (no pending task)")
        if n in s_nodes and _joins_into(s, n) != _joins_into(r, n) and n in pend.nodes:
            reasons.append(f"the join into node {n!r} changed and it has pending tasks")


def _judge_channels(
    stored: Mapping[str, Any],
    running: Mapping[str, Any],
    pend: _Pending,
    changes: list[str],
    reasons: list[str],
) -> None:
    """State keys added or removed, and changes of channel kind, reducer or declared
    type: a reason only where the thread holds data (or writes still to fold)."""
    s_ch: Mapping[str, Any] = stored["description"].get("channels") or {}
    r_ch: Mapping[str, Any] = running["description"].get("channels") or {}
    s_types: Mapping[str, Any] = stored.get("types") or {}
    r_types: Mapping[str, Any] = running.get("types") or {}
    for k in sorted(set(s_ch) | set(r_ch)):
        if not is_state_key(k):
            continue
        if k not in s_ch:
            changes.append(f"state key {k!r} added")
            continue
        if k not in r_ch:
            if k in pend.data_keys:
                reasons.append(f"state key {k!r} was removed but holds data")
            else:
                changes.append(f"state key {k!r} removed (no data)")
            continue
        ks, kr = s_ch[k].get("kind"), r_ch[k].get("kind")
        has_data = k in pend.data_keys
        if ks != kr and not {ks, kr} <= _REDUCER_FAMILY:
            if has_data:
                reasons.append(f"channel type of {k!r} changed ({ks} -> {kr}) and it holds data")
            else:
                changes.append(f"channel type of {k!r} changed ({ks} -> {kr}, no data)")
            continue
        ts, tr = s_types.get(k), r_types.get(k)
        type_changed = ts is not None and tr is not None and ts != tr
        if _reducer(stored, k) != _reducer(running, k):
            if k in pend.written_keys:
                reasons.append(
                    f"reducer of {k!r} changed and the paused step has writes to it still to fold"
                )
            elif type_changed and has_data:
                reasons.append(
                    f"reducer and declared type of {k!r} changed ({ts} -> {tr}) and it holds data"
                )
            else:
                changes.append(
                    f"reducer of {k!r} changed (same declared type: the stored value is kept, "
                    "later writes use the new reducer)"
                )
        elif ks != kr:
            changes.append(f"{k!r}: {ks} -> {kr} (LangGraph reads either from the other)")
        elif type_changed:
            changes.append(f"declared type of {k!r} changed ({ts} -> {tr})")


# --- storage ------------------------------------------------------------------------------

def op_record_version(version: str, topology: Mapping[str, Any]) -> Op[None]:
    from psycopg.types.json import Jsonb

    yield Batch(
        [
            Stmt(
                RECORD_VERSION_SQL,
                (version, topology["fingerprint"], Jsonb(topology)),
                prepare=False,
            )
        ]
    )


def op_load_versions(versions: Sequence[str]) -> Op[dict[str, dict[str, Any]]]:
    rows = yield Batch([Stmt(LOAD_VERSIONS_SQL, (list(versions),), fetch=True, prepare=False)])
    return {r["version"]: dict(r) for r in rows[0]}


def stored_topology(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The usable topology of a ``durable_graph_versions`` row (None: missing/ambiguous)."""
    if row is None or row.get("ambiguous"):
        return None
    topo = row.get("topology")
    return dict(topo) if isinstance(topo, Mapping) else None


def is_automatic(version: str, row_or_topology: Mapping[str, Any] | None) -> bool:
    """Whether ``version`` is the fingerprint of the topology stored for it."""
    if row_or_topology is None:
        return False
    return row_or_topology.get("fingerprint") == version


def classify_saved(
    saved: Any,
    stored_version: str,
    current_version: str,
    rows: Mapping[str, Mapping[str, Any]],
    graph: Any = None,
) -> Compatibility:
    """``classify`` for a loaded checkpoint tuple, with the topologies ``rows`` (by
    version) and, when known, the running graph (else its stored topology)."""
    stored = stored_topology(rows.get(stored_version))
    try:
        running = (
            graph_topology(graph)
            if graph is not None
            else stored_topology(rows.get(current_version))
        )
    except Exception as exc:  # a graph we cannot describe: fail closed
        return Compatibility("unknown", reasons=(f"cannot describe the running graph: {exc}",))
    if running is None:
        return Compatibility(
            "unknown", reasons=(f"no topology known for the running version {current_version!r}",)
        )
    automatic = (
        stored is not None
        and is_automatic(stored_version, stored)
        and is_automatic(current_version, running)
    )
    try:
        return classify(
            stored,
            running,
            saved.checkpoint,
            list(saved.pending_writes or []),
            stored_version=stored_version,
            automatic=automatic,
        )
    except Exception as exc:  # a damaged topology row: fail closed (refused as unknown)
        return Compatibility(
            "unknown", reasons=(f"could not classify: {type(exc).__name__}: {exc}",)
        )


# --- many threads (versions list) -----------------------------------------------------------


def _flow_classify_threads(
    saver: SaverView, graph: Any, thread_ids: Sequence[str]
) -> Flow[dict[str, Compatibility]]:
    """Each thread's latest root checkpoint classified against ``graph`` (a thread at
    the graph's own version is ``identical``)."""
    from langgraph_durable.versioning import VERSION_KEY

    current = graph_fingerprint(graph)
    loaded: dict[str, Any] = {}
    for tid in thread_ids:
        cfg: RunnableConfig = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
        loaded[tid] = yield Tx(partial(saver._op_get_tuple, cfg))
    versions = sorted(
        {
            str(t.metadata.get(VERSION_KEY))
            for t in loaded.values()
            if t and t.metadata.get(VERSION_KEY)
        }
    )
    rows = (yield Tx(partial(op_load_versions, versions))) if versions else {}
    out: dict[str, Compatibility] = {}
    for tid, saved in loaded.items():
        if saved is None:
            continue
        stored = (saved.metadata or {}).get(VERSION_KEY)
        if stored is None:
            out[tid] = Compatibility(
                "unknown", reasons=("unversioned (written by the stock saver): adopted as is",)
            )
        elif stored == current:
            out[tid] = Compatibility("identical", automatic=True)
        else:
            out[tid] = classify_saved(saved, str(stored), current, rows, graph)
    return out


def classify_threads(saver: SaverView, graph: Any, thread_ids: Sequence[str]) -> dict[str, Compatibility]:
    """How ``graph`` would treat each thread's latest checkpoint (sync saver)."""
    return cast(
        "dict[str, Compatibility]", saver.run_flow(_flow_classify_threads(saver, graph, thread_ids))
    )


async def aclassify_threads(
    saver: SaverView, graph: Any, thread_ids: Sequence[str]
) -> dict[str, Compatibility]:
    """``classify_threads`` for an ``AsyncDurablePostgresSaver``."""
    return cast(
        "dict[str, Compatibility]",
        await saver.arun_flow(_flow_classify_threads(saver, graph, thread_ids)),
    )


def recorded_versions(saver: SaverView) -> dict[str, dict[str, Any]]:
    """Rows of ``durable_graph_versions`` by version (without the topology JSON)."""

    def op() -> Op[dict[str, dict[str, Any]]]:
        rows = yield Batch(
            [
                Stmt(RECORDED_VERSIONS_SQL, None, fetch=True, prepare=False)
            ]
        )
        return {r["version"]: dict(r) for r in rows[0]}

    return cast("dict[str, dict[str, Any]]", saver.run_op(op))


__all__ = [
    "aclassify_threads",
    "classify_threads",
    "recorded_versions",
    "Compatibility",
    "classify",
    "classify_saved",
    "graph_topology",
    "op_load_versions",
    "op_record_version",
]
