"""The version stamp's metadata keys, the policies, and LangGraph's channel names the
versioning code reads."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Literal

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
