"""graph_fingerprint: stable where it must be, sensitive where a resume would break."""

from __future__ import annotations

import operator
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import _child_versioning_graphs as g
import pytest
from langgraph.graph import END, START, StateGraph

from langgraph_durable import ConfigurationError, graph_fingerprint
from langgraph_durable.versioning import describe_graph

HERE = Path(__file__).parent


def test_same_across_processes_and_hash_seeds() -> None:
    outputs = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, str(HERE / "_child_versioning_fp.py")],
            env=env, capture_output=True, text=True, check=True, timeout=120,
        ).stdout.split()
        outputs.append(out)
    assert len(outputs[0]) == 5
    assert outputs[0] == outputs[1]
    # ...and equal to this process's values (yet another seed).
    assert outputs[0][0] == graph_fingerprint(g.build_v1())
    assert outputs[0][1] == graph_fingerprint(g.graph_v2)
    assert outputs[0][4] == graph_fingerprint(g.build_with_subgraph(True))


def test_reordering_add_node_calls_keeps_it() -> None:
    a = g.build_v1(order=("fetch", "review", "audit", "summarize"))
    b = g.build_v1(order=("summarize", "audit", "fetch", "review"))
    assert graph_fingerprint(a) == graph_fingerprint(b)


def test_builder_and_compiled_graph_agree() -> None:
    builder = g.build_v1()
    fp = graph_fingerprint(builder)
    assert graph_fingerprint(builder.compile()) == fp
    # interrupt_before/after is a pause policy, not topology: same version.
    assert graph_fingerprint(builder.compile(interrupt_before=["audit"])) == fp


def test_edge_change_changes_it() -> None:
    base = g.build_v1()
    changed = g.build_v1()
    changed.edges.discard(("audit", "summarize"))
    changed.add_edge("review", "summarize")
    assert graph_fingerprint(base) != graph_fingerprint(changed)


def test_node_rename_and_removal_change_it() -> None:
    fps = {graph_fingerprint(x) for x in (g.build_v1(), g.build_v2(), g.build_v3())}
    assert len(fps) == 3


def test_cosmetic_edits_keep_it_unless_source_is_hashed() -> None:
    class S(TypedDict, total=False):
        n: int

    def build(step: Any) -> StateGraph:
        b = StateGraph(S)
        b.add_node("step", step)
        b.add_edge(START, "step")
        b.add_edge("step", END)
        return b

    def one(s: S) -> dict[str, int]:
        return {"n": 1}

    def two(s: S) -> dict[str, int]:
        # a different body, same topology
        return {"n": 2}

    assert graph_fingerprint(build(one)) == graph_fingerprint(build(two))
    assert graph_fingerprint(build(one), include_source=True) != graph_fingerprint(
        build(two), include_source=True
    )


def test_channel_and_reducer_changes_change_it() -> None:
    class A(TypedDict, total=False):
        items: Annotated[list[int], operator.add]

    class B(TypedDict, total=False):
        items: list[int]  # reducer removed: pending writes would now overwrite

    class C(TypedDict, total=False):
        items: Annotated[list[int], operator.add]
        extra: str  # new channel

    def build(schema: Any) -> StateGraph:
        b = StateGraph(schema)
        b.add_node("n", lambda s: {})
        b.add_edge(START, "n")
        return b

    fa, fb, fc = (graph_fingerprint(build(s)) for s in (A, B, C))
    assert len({fa, fb, fc}) == 3
    assert describe_graph(build(A))["channels"]["items"]["reducer"] == "_operator.add"


def test_conditional_edge_destinations_are_covered() -> None:
    class S(TypedDict, total=False):
        n: int

    def build(dests: list[str] | None) -> StateGraph:
        b = StateGraph(S)
        for name in ("a", "b", "c"):
            b.add_node(name, lambda s: {})
        b.add_edge(START, "a")
        b.add_conditional_edges("a", lambda s: "b", dests)
        return b

    assert graph_fingerprint(build(["b"])) != graph_fingerprint(build(["b", "c"]))
    assert describe_graph(build(None))["branches"] == {"a": [["<dynamic>"]]}

    # The routing function's name and body are logic, not topology.
    def route(s: Any) -> Any:
        return "b"

    renamed = StateGraph(S)
    for name in ("a", "b", "c"):
        renamed.add_node(name, lambda s: {})
    renamed.add_edge(START, "a")
    renamed.add_conditional_edges("a", route, ["b"])
    assert graph_fingerprint(renamed) == graph_fingerprint(build(["b"]))


def test_subgraph_change_changes_parent() -> None:
    assert graph_fingerprint(g.build_with_subgraph(False)) != graph_fingerprint(
        g.build_with_subgraph(True)
    )
    desc = describe_graph(g.build_with_subgraph(True))
    assert desc["nodes"]["write"]["run"]["subgraph"].startswith("fp-")


def test_functional_api_graph_is_described() -> None:
    from langgraph.func import entrypoint

    @entrypoint()
    def flow(x: int) -> int:
        return x + 1

    fp = graph_fingerprint(flow)
    assert fp.startswith("fp-") and fp == graph_fingerprint(flow)


def test_not_a_graph_is_a_typed_error() -> None:
    with pytest.raises(ConfigurationError):
        graph_fingerprint(object())


def test_command_destinations_and_defer_are_covered() -> None:
    class S(TypedDict, total=False):
        n: int

    def build(destinations: tuple[str, ...], defer: bool) -> StateGraph:
        b = StateGraph(S)
        b.add_node("a", lambda s: {}, destinations=destinations)
        b.add_node("b", lambda s: {}, defer=defer)
        b.add_node("c", lambda s: {})
        b.add_edge(START, "a")
        return b

    base = graph_fingerprint(build(("b",), False))
    assert graph_fingerprint(build(("b", "c"), False)) != base
    assert graph_fingerprint(build(("b",), True)) != base
    assert graph_fingerprint(build(("b",), False)) == base
