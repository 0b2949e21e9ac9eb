"""Graph fingerprints: a stable hash of a graph's topology (``describe_graph``)."""

from __future__ import annotations

import hashlib
import inspect
import weakref
from collections.abc import Mapping
from typing import Any

import orjson

from langgraph_durable.errors import (
    ConfigurationError,
)

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
