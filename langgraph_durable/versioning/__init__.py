"""Graph-version stamping, fingerprints and checkpoint migrations.

Vocabulary follows Temporal's worker versioning: a thread is *pinned* to the graph
version that wrote its latest checkpoint. Every run that starts on a thread with a
checkpoint (a resume with ``None`` or a ``Command``, and also a run with new input)
compares that version with the running graph's and applies the policy:

* ``"refuse"`` (default): raise ``GraphVersionMismatchError`` before any node runs,
  unless a migration path from the stored version to the current one is registered,
  in which case the checkpoint is migrated (atomically, in place) and the run goes on,
  or both versions are fingerprints and the difference is *compatible* for this
  thread (``compat.py``: e.g. an added state key, or a node added after the one the
  thread waits in: a task that has not finished routes by the new graph's edges), in
  which case it simply goes on. The error names the policies that go on anyway.
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

The package: ``keys`` (metadata keys, policies), ``fingerprint``, ``registry``
(``Migration``, ``MigrationRegistry``), ``transform`` (``apply_migrations``, pure) and
``gate`` (``flow_migrate``, the version gate's rewrite of one stored checkpoint). The
operator APIs over many threads are in ``ops/migrations.py``. Every name of the
submodules is importable from here, as from the one module versioning.py was (other
modules import some private helpers too: ``_target_node``, ``_TASKS``, ...).
"""

from __future__ import annotations

# The rewrite's SQL, imported from here by saver.py until it takes it from sql/.
from langgraph_durable.sql.threads import LOCK_THREAD_LEASE_SQL as LOCK_THREAD_SQL
from langgraph_durable.sql.threads import SET_THREAD_VERSION_SQL as SET_THREAD_VERSION_SQL
from langgraph_durable.sql.versions import INSERT_LOG_SQL as INSERT_LOG_SQL
from langgraph_durable.sql.versions import LOCK_CHECKPOINT_SQL as LOCK_CHECKPOINT_SQL
from langgraph_durable.sql.versions import WRITE_PATHS_SQL as WRITE_PATHS_SQL
from langgraph_durable.versioning.fingerprint import (
    _builder_and_compiled as _builder_and_compiled,
)
from langgraph_durable.versioning.fingerprint import (
    _describe_channels as _describe_channels,
)
from langgraph_durable.versioning.fingerprint import (
    _describe_runnable as _describe_runnable,
)
from langgraph_durable.versioning.fingerprint import (
    _find_subgraph as _find_subgraph,
)
from langgraph_durable.versioning.fingerprint import (
    _fingerprint_cache as _fingerprint_cache,
)
from langgraph_durable.versioning.fingerprint import (
    _static_writes as _static_writes,
)
from langgraph_durable.versioning.fingerprint import (
    compiled_graph as compiled_graph,
)
from langgraph_durable.versioning.fingerprint import (
    describe_graph as describe_graph,
)
from langgraph_durable.versioning.fingerprint import (
    graph_fingerprint as graph_fingerprint,
)
from langgraph_durable.versioning.gate import (
    flow_migrate as flow_migrate,
)
from langgraph_durable.versioning.keys import (
    _END as _END,
)
from langgraph_durable.versioning.keys import (
    _INTERRUPT as _INTERRUPT,
)
from langgraph_durable.versioning.keys import (
    _PULL as _PULL,
)
from langgraph_durable.versioning.keys import (
    _PUSH as _PUSH,
)
from langgraph_durable.versioning.keys import (
    _START as _START,
)
from langgraph_durable.versioning.keys import (
    _TASKS as _TASKS,
)
from langgraph_durable.versioning.keys import (
    MIGRATED_FROM_KEY as MIGRATED_FROM_KEY,
)
from langgraph_durable.versioning.keys import (
    MIGRATION_ID_KEY as MIGRATION_ID_KEY,
)
from langgraph_durable.versioning.keys import (
    POLICY_KEY as POLICY_KEY,
)
from langgraph_durable.versioning.keys import (
    RUN_GRAPH as RUN_GRAPH,
)
from langgraph_durable.versioning.keys import (
    VERSION_KEY as VERSION_KEY,
)
from langgraph_durable.versioning.keys import (
    VERSION_POLICIES as VERSION_POLICIES,
)
from langgraph_durable.versioning.keys import (
    UnversionedPolicy as UnversionedPolicy,
)
from langgraph_durable.versioning.keys import (
    VersionPolicy as VersionPolicy,
)
from langgraph_durable.versioning.registry import (
    F as F,
)
from langgraph_durable.versioning.registry import (
    Migration as Migration,
)
from langgraph_durable.versioning.registry import (
    MigrationFn as MigrationFn,
)
from langgraph_durable.versioning.registry import (
    MigrationRegistry as MigrationRegistry,
)
from langgraph_durable.versioning.registry import (
    _check_name as _check_name,
)
from langgraph_durable.versioning.registry import (
    is_routing_channel as is_routing_channel,
)
from langgraph_durable.versioning.transform import (
    MigrationResult as MigrationResult,
)
from langgraph_durable.versioning.transform import (
    _apply_fn as _apply_fn,
)
from langgraph_durable.versioning.transform import (
    _interrupt_id as _interrupt_id,
)
from langgraph_durable.versioning.transform import (
    _max_version as _max_version,
)
from langgraph_durable.versioning.transform import (
    _move_writes as _move_writes,
)
from langgraph_durable.versioning.transform import (
    _orphaned_nodes as _orphaned_nodes,
)
from langgraph_durable.versioning.transform import (
    _OrphanedWork as _OrphanedWork,
)
from langgraph_durable.versioning.transform import (
    _remap_interrupt as _remap_interrupt,
)
from langgraph_durable.versioning.transform import (
    _rename_node_values as _rename_node_values,
)
from langgraph_durable.versioning.transform import (
    _rename_node_writes as _rename_node_writes,
)
from langgraph_durable.versioning.transform import (
    _rename_nodes as _rename_nodes,
)
from langgraph_durable.versioning.transform import (
    _rename_sends as _rename_sends,
)
from langgraph_durable.versioning.transform import (
    _rename_state_keys as _rename_state_keys,
)
from langgraph_durable.versioning.transform import (
    _reversion as _reversion,
)
from langgraph_durable.versioning.transform import (
    _same as _same,
)
from langgraph_durable.versioning.transform import (
    _send_moves as _send_moves,
)
from langgraph_durable.versioning.transform import (
    _target_node as _target_node,
)
from langgraph_durable.versioning.transform import (
    _task_id_fn as _task_id_fn,
)
from langgraph_durable.versioning.transform import (
    _task_moves as _task_moves,
)
from langgraph_durable.versioning.transform import (
    _task_path as _task_path,
)
from langgraph_durable.versioning.transform import (
    _TaskMoves as _TaskMoves,
)
from langgraph_durable.versioning.transform import (
    _Work as _Work,
)
from langgraph_durable.versioning.transform import (
    apply_migrations as apply_migrations,
)
from langgraph_durable.versioning.transform import (
    pending_orphans as pending_orphans,
)
from langgraph_durable.versioning.transform import (
    rename_channel as rename_channel,
)

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
