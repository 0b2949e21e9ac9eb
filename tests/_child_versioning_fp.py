"""Child of test_fingerprint: prints the fingerprints of the test graphs, one per line.

Run with different PYTHONHASHSEED values; the output must not change."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _child_versioning_graphs as g

from langgraph_durable import graph_fingerprint

for graph in (
    g.build_v1(),
    g.graph_v2,
    g.build_parallel("left"),
    g.build_fanout("worker"),
    g.build_with_subgraph(True),
):
    print(graph_fingerprint(graph))
