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
  task, Send or interrupt needs it; changed edges out of a node whose task has not
  finished (an interrupt, a crash inside it: it re-runs and routes by the new edges, as
  stock LangGraph does) or out of a node the thread has already passed (a node added
  before the one it waits in); a changed subgraph whose own paused checkpoint is
  compatible with the new subgraph (the same rules, one level down); ``DeltaChannel`` <->
  plain reducer on the same key (LangGraph reads either from the other); a reducer
  changed where the declared value type is unchanged and the paused step holds no write
  to fold; definitions reordered;
* **incompatible**: stored work the new graph cannot honour: pending work (a trigger, a
  Send, an interrupt, a finished task's write) for a removed/renamed node; a task that
  finished in the paused step whose stored routing decision (an edge's or a conditional
  edge's ``branch:to:X``, a join write) is along a route the new graph no longer has
  (LangGraph would replay it); a changed node (or, inside a changed subgraph, the same)
  with pending work; a changed channel type (or reducer and declared type) of a key
  holding data; a reducer change with writes of the paused step still to fold; a removed
  state key holding data; a changed join into a node with pending tasks (its task id
  changes);
* **unknown**: no stored topology for the stored version (a thread written by the stock
  saver or before this table existed, or a version name used for two different graphs):
  the check falls back to refusing, as before.

Everything but the ops and flows (``op_record_version``, ``op_load_versions``,
``flow_classify_saved``: it reads the checkpoints of changed subgraphs) is pure.
"""

from __future__ import annotations

import binascii
import typing
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

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
    _PULL,
    _PUSH,
    _START,
    _TASKS,
    _find_subgraph,
    _target_node,
    _task_id_fn,
    compiled_graph,
    describe_graph,
    graph_fingerprint,
)

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple


class _Reader(Protocol):
    """What classifying a thread reads of a saver: its checkpoints (subgraphs')."""

    def _op_get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]: ...


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
        # Not hashed either: a thread paused inside a changed subgraph is classified
        # against the old subgraph's own topology.
        "subgraphs": _subgraph_topologies(graph),
    }
    if cacheable:
        try:
            _topology_cache[graph] = topo
        except TypeError:
            pass
    return topo


def _subgraph_topologies(graph: Any) -> dict[str, Any]:
    from langgraph.pregel import Pregel

    builder = getattr(compiled_graph(graph), "builder", None)
    out: dict[str, Any] = {}
    for name, spec in (getattr(builder, "nodes", None) or {}).items():
        sub = _find_subgraph(getattr(spec, "runnable", None))
        if isinstance(sub, Pregel):
            out[name] = graph_topology(sub)
    return out


# --- what the checkpoint still needs ----------------------------------------------------

# Writes that say what happened to a task, not what it produced: a task with only these
# has not finished (langgraph.pregel._task_status, kept literal like the names above).
_CONTROL_WRITES = frozenset({"__interrupt__", "__resume__", "__error__", "__error_source_node__"})


@dataclass
class _Pending:
    """The paused step, read from the checkpoint and its pending writes.

    ``triggered``: nodes whose tasks the next step runs (a trigger channel holds a
    value; START while the input is unprocessed); ``sends``: the nodes of stored
    ``Send``s, by index. ``finished``: output writes per task id of the tasks of that
    step that completed (LangGraph replays them instead of re-running the task);
    ``started``: task ids with only control writes (an interrupt, an error)."""

    nodes: set[str] = field(default_factory=set)
    triggered: set[str] = field(default_factory=set)
    sends: list[str] = field(default_factory=list)
    finished: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)
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
            out.triggered.add(target)
        if k == _START:
            out.nodes.add(_START)  # input not yet processed: START's edges route it
            out.triggered.add(_START)
        if k == _TASKS and isinstance(v, list):
            out.sends = [s.node if isinstance(s, Send) else "" for s in v]
            out.nodes.update(n for n in out.sends if n)
    for tid, c, v in writes:
        target = _target_node(c)
        if target is not None and target != _END:
            out.nodes.add(target)
        if c == _TASKS and isinstance(v, Send):
            out.nodes.add(v.node)
        if c == _INTERRUPT:
            out.interrupted = True
        if is_state_key(c):
            out.written_keys.add(c)
        if c in _CONTROL_WRITES:
            out.started.add(str(tid))
        else:
            out.finished.setdefault(str(tid), []).append((c, v))
    out.started -= set(out.finished)
    out.data_keys = {
        k for k in (*(checkpoint.get("channel_versions") or {}), *values) if is_state_key(k)
    } | out.written_keys
    return out


def _task_ids(
    desc: Mapping[str, Any],
    checkpoint: Mapping[str, Any],
    metadata: Mapping[str, Any] | None,
    ns: str,
    pend: _Pending,
) -> dict[str, str]:
    """Task id -> node for the tasks of the paused step, computed as LangGraph does
    (hash of checkpoint id, namespace, step, node, triggers; a Send's index), with the
    stored graph's triggers. Empty when the checkpoint does not allow it."""
    id_fn = _task_id_fn(checkpoint)
    step = (metadata or {}).get("step")
    cid = checkpoint.get("id")
    if id_fn is None or not isinstance(step, int) or not isinstance(cid, str):
        return {}
    try:
        cid_bytes = binascii.unhexlify(cid.replace("-", ""))
    except (binascii.Error, ValueError):
        return {}
    step_s = str(step + 1)
    nodes: Mapping[str, Any] = desc.get("nodes") or {}
    joins = [k for k in (checkpoint.get("channel_versions") or {}) if k.startswith("join:")]
    out: dict[str, str] = {}

    def task_ns(node: str) -> str:
        return f"{ns}|{node}" if ns else node

    for n in pend.triggered:
        if n == _START:
            candidates = [[_START]]
        elif isinstance((nodes.get(n) or {}).get("triggers"), list):
            candidates = [list(nodes[n]["triggers"])]  # a graph without a builder
        else:
            own = sorted(j for j in joins if _target_node(j) == n)
            candidates = [[f"branch:to:{n}"], *([sorted([f"branch:to:{n}", *own])] if own else [])]
        for trig in candidates:
            out[id_fn(cid_bytes, task_ns(n), step_s, n, _PULL, *trig)] = n
    for i, n in enumerate(pend.sends):
        if n:
            out[id_fn(cid_bytes, task_ns(n), step_s, n, _PUSH, str(i))] = n
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


def _routes(desc: Mapping[str, Any], node: str) -> tuple[set[str], bool]:
    """Where ``node`` may route: the nodes its edges, conditional edges, declared
    ``Command`` destinations and error handler name, and whether it may also route
    where the graph does not say (a conditional edge without a path map)."""
    targets = {str(e[1]) for e in desc.get("edges") or () if e[0] == node}
    dynamic = False
    for dests in (desc.get("branches") or {}).get(node, ()):
        dynamic = dynamic or "<dynamic>" in dests
        targets.update(str(d) for d in dests if d != "<dynamic>")
    entry = (desc.get("nodes") or {}).get(node) or {}
    targets.update(str(d) for d in entry.get("ends") or ())
    if entry.get("error_handler"):
        targets.add(str(entry["error_handler"]))
    return targets, dynamic


def _joins(desc: Mapping[str, Any]) -> set[tuple[tuple[str, ...], str]]:
    return {(tuple(sorted(w[0])), str(w[1])) for w in desc.get("waiting_edges") or ()}


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
    metadata: Mapping[str, Any] | None = None,
    ns: str = "",
    inner: Mapping[str, Compatibility | None] | None = None,
) -> Compatibility:
    """Classify continuing ``checkpoint`` (with its pending writes) written by the graph
    ``stored`` (a topology as stored, ``None`` if unknown) on the graph ``running``.

    ``metadata`` (the checkpoint's: its ``step``) and ``ns`` (its namespace) locate the
    tasks of the paused step, so the stored routing of a finished task can be checked
    against the new edges; ``inner``: per node whose subgraph changed and whose task is
    paused, the classification of the subgraph's own checkpoint (``None``: it has none)."""
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
    owners = _task_ids(s, checkpoint, metadata, ns, pend)
    changes: list[str] = []
    reasons: list[str] = []
    _judge_nodes(s, r, pend, owners, inner or {}, changes, reasons)
    _judge_edges(s, r, pend, changes, reasons)
    _judge_routing(s, r, pend, owners, reasons)
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


def _finished(node: str, pend: _Pending, owners: Mapping[str, str]) -> bool:
    return any(owners.get(t) == node for t in pend.finished)


def _judge_nodes(
    s: Mapping[str, Any],
    r: Mapping[str, Any],
    pend: _Pending,
    owners: Mapping[str, str],
    inner: Mapping[str, Compatibility | None],
    changes: list[str],
    reasons: list[str],
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
        if a == b:
            continue
        if n not in pend.nodes or (n not in pend.sends and _finished(n, pend, owners)):
            # Finished in the paused step: its stored writes are replayed, not re-run.
            changes.append(f"node {n!r} changed (no pending work)")
        elif _is_subgraph_change(a, b):
            _judge_subgraph(n, inner, changes, reasons)
        else:
            reasons.append(
                f"node {n!r} changed ({', '.join(sorted(set(a) | set(b)))}) and has {_work(pend)}"
            )


def _is_subgraph_change(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    ra, rb = a.get("run"), b.get("run")
    return (
        set(a) == set(b)
        and {k: v for k, v in a.items() if k != "run"} == {k: v for k, v in b.items() if k != "run"}
        and isinstance(ra, Mapping)
        and isinstance(rb, Mapping)
        and "subgraph" in ra
        and "subgraph" in rb
    )


def _judge_subgraph(
    n: str, inner: Mapping[str, Compatibility | None], changes: list[str], reasons: list[str]
) -> None:
    """A changed subgraph whose task is paused: LangGraph resumes the subgraph's own
    checkpoint on the new subgraph, so that checkpoint is what must be compatible."""
    if n not in inner:
        reasons.append(
            f"node {n!r} (a subgraph) changed and has pending work, and the stored topology "
            "does not describe the old subgraph (recorded by an older langgraph-durable)"
        )
        return
    sub = inner[n]
    if sub is None:
        changes.append(f"subgraph {n!r} changed (its paused task has not started it yet)")
    elif sub.verdict in ("identical", "compatible"):
        changes.append(f"subgraph {n!r}: " + sub.summary())
    else:
        reasons.extend(f"in subgraph {n!r}: {why}" for why in sub.reasons)


def _judge_edges(
    s: Mapping[str, Any], r: Mapping[str, Any], pend: _Pending, changes: list[str], reasons: list[str]
) -> None:
    """Routing out of (and joins into) every node still there. Changed edges out of a
    node are no reason in themselves: a task that has not finished routes by the new
    graph's edges (what stock LangGraph does); a finished one is ``_judge_routing``'s."""
    if "edges" not in s and "edges" not in r:
        return
    s_nodes: Mapping[str, Any] = s.get("nodes") or {}
    r_nodes: Mapping[str, Any] = r.get("nodes") or {}
    for n in sorted(set(s_nodes) | set(r_nodes) | {_START}):
        if n not in r_nodes and n != _START:
            continue  # removed: judged with the nodes
        if _out_edges(s, n) != _out_edges(r, n):
            changes.append(
                f"edges out of node {n!r} changed"
                + (" (its paused task will route by the new edges)" if n in pend.triggered else "")
            )
        # A changed join changes the node's triggers, hence its task id: its stored
        # writes (finished work, an interrupt) would no longer be found.
        if n in s_nodes and _joins_into(s, n) != _joins_into(r, n) and n in pend.nodes:
            reasons.append(f"the join into node {n!r} changed and it has pending tasks")


def _judge_routing(
    s: Mapping[str, Any],
    r: Mapping[str, Any],
    pend: _Pending,
    owners: Mapping[str, str],
    reasons: list[str],
) -> None:
    """The stored routing decisions of tasks that finished in the paused step: LangGraph
    replays their writes, so a ``branch:to:X`` (an edge's or a conditional edge's
    decision) or a join write along a route the running graph no longer has would take
    the thread where the new graph does not go; and a static edge the running graph
    added out of such a task's node would never be taken."""
    if "edges" not in s and "edges" not in r:
        return
    r_nodes: Mapping[str, Any] = r.get("nodes") or {}
    for tid, writes in sorted(pend.finished.items()):
        src = owners.get(tid)
        for chan, value in writes:
            target = _target_node(chan)
            if target is None or target == _END or target not in r_nodes:
                continue  # END, not routing, or a removed node (judged with the nodes)
            why = _gone_route(s, r, src, chan, target, value)
            if why:
                reasons.append(why)
        if src is not None and (src == _START or src in r_nodes):
            added = sorted(_static(r, src) - _static(s, src) - {_END})
            if added:
                reasons.append(
                    f"node {src!r} finished in the paused step, and the running graph adds the "
                    f"edge(s) {', '.join(f'{src!r} -> {t!r}' for t in added)}: LangGraph replays "
                    "its stored writes instead of re-running it, so they would never be taken"
                )


def _static(desc: Mapping[str, Any], node: str) -> set[str]:
    return {str(e[1]) for e in desc.get("edges") or () if e[0] == node}


def _gone_route(
    s: Mapping[str, Any], r: Mapping[str, Any], src: str | None, chan: str, target: str, value: Any
) -> str | None:
    if chan.startswith("join:"):
        starts = tuple(sorted(chan[len("join:") :].rpartition(":")[0].split("+")))
        if (starts, target) in _joins(s) and (starts, target) not in _joins(r):
            return (
                f"a task that finished in the paused step wrote to the join {list(starts)} -> "
                f"{target!r}, which the running graph no longer has"
            )
        return None
    if src is None:
        # Which task wrote it is unknown: refuse if any route into target is gone.
        gone = sorted(
            n for n in (*(s.get("nodes") or {}), _START)
            if target in _routes(s, n)[0] and not _reaches(r, n, target)
        )
        if not gone:
            return None
        return (
            f"a task that finished in the paused step routed to {target!r}, and the route(s) "
            f"{', '.join(f'{g!r} -> {target!r}' for g in gone)} are gone"
        )
    if target in _routes(s, src)[0] and not _reaches(r, src, target):
        now, dynamic = _routes(r, src)
        return (
            f"node {src!r} finished in the paused step and its stored routing decision "
            f"{src!r} -> {target!r} is along an edge the running graph no longer has (it routes "
            f"{src!r} to {sorted(now) or 'nowhere'}{' or dynamically' if dynamic else ''}): "
            f"LangGraph would replay the decision and run {target!r}"
        )
    return None


def _reaches(desc: Mapping[str, Any], node: str, target: str) -> bool:
    """Whether the graph ``desc`` may route ``node`` to ``target`` (a node it lacks is
    judged with the nodes: its stored writes are not replayed)."""
    targets, dynamic = _routes(desc, node)
    return dynamic or target in targets or (node != _START and node not in (desc.get("nodes") or {}))


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

def op_record_version(
    version: str, topology: Mapping[str, Any], graph_name: str | None = None
) -> Op[None]:
    from psycopg.types.json import Jsonb

    yield Batch(
        [
            Stmt(
                RECORD_VERSION_SQL,
                (version, topology["fingerprint"], Jsonb(topology), graph_name),
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


def _running(
    graph: Any, current_version: str, rows: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    return graph_topology(graph) if graph is not None else stored_topology(rows.get(current_version))


def classify_saved(
    saved: Any,
    stored_version: str,
    current_version: str,
    rows: Mapping[str, Mapping[str, Any]],
    graph: Any = None,
    *,
    inner: Mapping[str, Compatibility | None] | None = None,
) -> Compatibility:
    """``classify`` for a loaded checkpoint tuple, with the topologies ``rows`` (by
    version) and, when known, the running graph (else its stored topology).
    ``inner``: see ``classify`` (``flow_classify_saved`` loads it)."""
    stored = stored_topology(rows.get(stored_version))
    try:
        running = _running(graph, current_version, rows)
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
            metadata=saved.metadata,
            ns=str(saved.config["configurable"].get("checkpoint_ns") or ""),
            inner=inner,
        )
    except Exception as exc:  # a damaged topology row: fail closed (refused as unknown)
        return Compatibility(
            "unknown", reasons=(f"could not classify: {type(exc).__name__}: {exc}",)
        )


def flow_classify_saved(
    saver: _Reader,
    saved: Any,
    stored_version: str,
    current_version: str,
    rows: Mapping[str, Mapping[str, Any]],
    graph: Any = None,
) -> Flow[Compatibility]:
    """``classify_saved``, after loading the checkpoints of the changed subgraphs the
    thread is paused in (a read per such subgraph; none when no subgraph changed)."""
    inner: dict[str, Compatibility | None] = {}
    try:
        stored = stored_topology(rows.get(stored_version))
        running = _running(graph, current_version, rows)
    except Exception:  # classify_saved says why
        stored = running = None
    if stored is not None and running is not None:
        cfg = saved.config["configurable"]
        inner = yield from _flow_inner(
            saver,
            str(cfg["thread_id"]),
            stored,
            running,
            saved,
            str(cfg.get("checkpoint_ns") or ""),
        )
    return classify_saved(saved, stored_version, current_version, rows, graph, inner=inner)


def _flow_inner(
    saver: _Reader,
    thread_id: str,
    stored: Mapping[str, Any],
    running: Mapping[str, Any],
    saved: Any,
    ns: str,
) -> Flow[dict[str, Compatibility | None]]:
    """Per node whose subgraph changed and whose task the paused step has not finished:
    the classification of that task's subgraph checkpoint against the new subgraph
    (recursively), or None when the task has not started the subgraph. A node left
    out (old topology without subgraphs, task ids unknown) is refused by ``classify``."""
    out: dict[str, Compatibility | None] = {}
    for n, old, new, tids in _inner_candidates(stored, running, saved, ns):
        for tid in tids or ():
            sub_ns = f"{ns}|{n}:{tid}" if ns else f"{n}:{tid}"
            sub_cfg: RunnableConfig = {
                "configurable": {"thread_id": thread_id, "checkpoint_ns": sub_ns}
            }
            sub = yield Tx(partial(saver._op_get_tuple, sub_cfg))
            if sub is None:
                continue
            deeper = yield from _flow_inner(saver, thread_id, old, new, sub, sub_ns)
            out[n] = _classify_sub(old, new, sub, sub_ns, deeper)
            break
        else:
            out[n] = None  # not started: the task runs the new subgraph afresh
    return out


def _inner_candidates(
    stored: Mapping[str, Any], running: Mapping[str, Any], saved: Any, ns: str
) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any], list[str] | None]]:
    """(node, old and new subgraph topology, the candidate task ids of its paused
    task, or None when it is only routed to) for each changed subgraph with pending
    work. Empty on a topology it cannot read (``classify`` then refuses)."""
    try:
        s_sub, r_sub = stored.get("subgraphs"), running.get("subgraphs")
        if not isinstance(s_sub, Mapping) or not isinstance(r_sub, Mapping):
            return []
        pend = _pending(saved.checkpoint, list(saved.pending_writes or []))
        owners = _task_ids(stored["description"], saved.checkpoint, saved.metadata, ns, pend)
        found: list[tuple[str, Mapping[str, Any], Mapping[str, Any], list[str] | None]] = []
        for n in sorted(set(s_sub) & set(r_sub)):
            old, new = s_sub[n], r_sub[n]
            if not isinstance(old, Mapping) or old.get("fingerprint") == new.get("fingerprint"):
                continue
            if n not in pend.triggered and n not in pend.sends:
                found.append((n, old, new, None))
                continue
            tids = [t for t, node in owners.items() if node == n and t not in pend.finished]
            if tids:  # an interrupted task's id first: it has the subgraph checkpoint
                found.append((n, old, new, sorted(tids, key=lambda t: t not in pend.started)))
        return found
    except Exception:
        return []


def _classify_sub(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    sub: Any,
    sub_ns: str,
    deeper: Mapping[str, Compatibility | None],
) -> Compatibility:
    try:
        return classify(
            old,
            new,
            sub.checkpoint,
            list(sub.pending_writes or []),
            automatic=True,
            metadata=sub.metadata,
            ns=sub_ns,
            inner=deeper,
        )
    except Exception as exc:  # a damaged topology: fail closed
        return Compatibility("unknown", reasons=(f"could not classify: {type(exc).__name__}: {exc}",))


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
            out[tid] = yield from flow_classify_saved(saver, saved, str(stored), current, rows, graph)
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
    "flow_classify_saved",
    "graph_topology",
    "op_load_versions",
    "op_record_version",
]
