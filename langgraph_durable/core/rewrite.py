"""The version gate at a run start, the topology record, and the in-place rewrite of a
checkpoint a migration produced (``versioning.flow_migrate`` calls ``_op_rewrite``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    CheckpointTuple,
)
from langgraph.checkpoint.postgres.base import (
    UPSERT_CHECKPOINT_BLOBS_SQL,
    UPSERT_CHECKPOINT_WRITES_SQL,
)
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from langgraph_durable import _sealing
from langgraph_durable._io import (
    AfterCommit,
    Batch,
    Flow,
    Op,
    Stmt,
    Tx,
)
from langgraph_durable.compat import (
    flow_classify_saved,
    graph_topology,
    op_load_versions,
    op_record_version,
)
from langgraph_durable.core.jsonb import _jsonb
from langgraph_durable.core.view import VersionGateView
from langgraph_durable.sql.checkpoints import DELETE_CHECKPOINT_WRITES_SQL, REWRITE_CHECKPOINT_SQL

if TYPE_CHECKING:
    from langgraph_durable.lifecycle import _RunContext
from langgraph_durable.errors import (
    ConfigurationError,
    GraphVersionMismatchError,
    MigrationError,
    ThreadBusyError,
)
from langgraph_durable.versioning import (
    INSERT_LOG_SQL,
    LOCK_CHECKPOINT_SQL,
    LOCK_THREAD_SQL,
    MIGRATION_ID_KEY,
    RUN_GRAPH,
    SET_THREAD_VERSION_SQL,
    VERSION_KEY,
    VERSION_POLICIES,
    WRITE_PATHS_SQL,
    MigrationResult,
    flow_migrate,
    pending_orphans,
)

logger = logging.getLogger("langgraph_durable")


class VersionGate(VersionGateView):
    """Graph-version checks and migrated-checkpoint rewrites."""

    def _flow_check_version(
        self, thread_id: str, saved: CheckpointTuple, current: str | None, policy: str
    ) -> Flow[CheckpointTuple]:
        """Every run start on a thread with a checkpoint (a resume, and also a run with
        new input: its old state would run on the new graph just the same). A registered
        migration path wins over the policy."""
        if policy not in VERSION_POLICIES:
            raise ConfigurationError(
                f"unknown version_policy {policy!r} (use one of {', '.join(VERSION_POLICIES)})",
                policy=policy,
            )
        stored = saved.metadata.get(VERSION_KEY) if saved.metadata else None
        if current is None or stored == current:
            return saved
        graph = RUN_GRAPH.get()
        if stored is None:
            if self.unversioned_policy == "adopt" or policy in ("warn", "auto-upgrade"):
                return saved
            raise GraphVersionMismatchError(thread_id, None, current, policy=policy)
        chain = self.migrations.path(str(stored), current)
        if chain:
            reloaded = yield from flow_migrate(
                self, saved, str(stored), current, chain, graph=graph, origin="run"
            )
            return cast(CheckpointTuple, reloaded)
        if policy == "auto-upgrade":
            return saved
        rows = yield Tx(lambda: op_load_versions([str(stored), current]))
        compat = yield from flow_classify_saved(self, saved, str(stored), current, rows, graph)
        if policy == "strict":
            raise GraphVersionMismatchError(
                thread_id, str(stored), current, compat.as_dict(), policy=policy
            )
        if policy == "warn":
            orphans = pending_orphans(saved, graph) if graph is not None else []
            logger.warning(
                "thread %s was written by graph version %s, resuming on %s (version_policy=warn, %s)%s",
                thread_id, stored, current, compat.summary(),
                f"; pending work for missing node(s) {orphans} will be skipped" if orphans else "",
            )
            return saved
        if compat.automatic and compat.verdict in ("identical", "compatible"):
            logger.info(
                "thread %s: graph version %s -> %s is %s; resuming", thread_id, stored, current,
                compat.summary(),
            )
            return saved
        raise GraphVersionMismatchError(
            thread_id, str(stored), current, compat.as_dict(), policy=policy
        )

    def _flow_record_version(self, version: str | None, ctx: _RunContext) -> Flow[None]:
        """Store the running graph's topology once per version (per saver and its
        views): later mismatches are classified against it. One statement the first
        time a version runs in this process, nothing after, nothing per step."""
        if not version or ctx.graph is None or version in self._recorded_versions:
            return
        try:
            topology = graph_topology(ctx.graph)
        except Exception:  # a graph we cannot describe: its threads classify "unknown"
            logger.debug("could not describe %r", ctx.graph, exc_info=True)
            return
        name = graph_name(ctx.graph, getattr(ctx.loop, "config", None))
        yield Tx(lambda: op_record_version(version, topology, name))
        self._recorded_versions.add(version)

    def _op_rewrite(
        self,
        saved: CheckpointTuple,
        result: MigrationResult,
        metadata: dict[str, Any],
        *,
        expected: str,
        origin: str,
    ) -> Op[None]:
        """Replace a checkpoint in place (same id, so task ids and pending writes keep
        matching) with its migrated form, in one transaction, after copying the rows it
        replaces into durable_migration_log. Changed channels get new blob rows under
        new versions; the old blobs stay, so history is not rewritten."""
        cfg = saved.config["configurable"]
        thread_id, ns, cid = str(cfg["thread_id"]), cfg.get("checkpoint_ns", ""), cfg["checkpoint_id"]
        checkpoint = result.checkpoint
        target = metadata.get(VERSION_KEY)
        locked = yield from self._op_rewrite_lock(thread_id, ns, cid, expected, target)
        if locked is None:
            return  # migrated meanwhile (another worker, or a retried commit): reloaded next
        raw_inline, paths = locked
        log = yield Batch([self._rewrite_log(saved, result, expected, target, origin)])
        md = {**metadata, MIGRATION_ID_KEY: str(log[0][0]["id"])}
        artifacts: dict[bytes, bytes] = {}
        values_json, blob_rows = self._rewrite_values(saved, checkpoint, raw_inline, artifacts)
        write_rows = self._rewrite_writes(saved, result, paths, artifacts) if result.writes_changed else []
        art_stmts, new_refs = self._artifact_stmts(thread_id, artifacts)
        stmts = [*art_stmts]
        if blob_rows:
            stmts.append(Stmt(UPSERT_CHECKPOINT_BLOBS_SQL, blob_rows, many=True))
        stmts.append(
            Stmt(
                REWRITE_CHECKPOINT_SQL,
                (
                    _jsonb({**checkpoint, "channel_values": values_json}),
                    _jsonb(_sealing.seal_metadata(_sealing.keyring_of(self.serde), md)),
                    thread_id, ns, cid,
                ),
            )
        )
        if result.writes_changed:
            stmts.append(Stmt(DELETE_CHECKPOINT_WRITES_SQL, (thread_id, ns, cid)))
            if write_rows:
                stmts.append(Stmt(UPSERT_CHECKPOINT_WRITES_SQL, write_rows, many=True))
        if ns == "":
            stmts.append(Stmt(SET_THREAD_VERSION_SQL, (target, thread_id)))
        yield Batch(stmts)
        if new_refs:
            yield AfterCommit(lambda: self._known_refs.add(thread_id, new_refs))

    def _op_rewrite_lock(
        self, thread_id: str, ns: str, cid: str, expected: str, target: str | None
    ) -> Op[tuple[dict[str, Any], dict[str, str]] | None]:
        """Step 1 of ``_op_rewrite``: hold the thread (fence or row lock) and the checkpoint
        row, and check it is still the one to migrate. Returns its inline values and its
        writes' task paths, or None when it was migrated meanwhile."""
        fence, lease = self._fence(thread_id)
        # In a run we hold the lease (fence); outside one (CLI, batch) lock the thread row
        # so no run takes the lease and reads the checkpoint before this commits.
        first = [fence if lease is not None else Stmt(LOCK_THREAD_SQL, (thread_id,), fetch=True)]
        first.append(Stmt(LOCK_CHECKPOINT_SQL, (thread_id, ns, cid), fetch=True))
        first.append(Stmt(WRITE_PATHS_SQL, (thread_id, ns, cid), fetch=True))
        rows = yield Batch(first)
        if lease is not None:
            self._check_fence(thread_id, lease, rows[0])
        elif rows[0] and self.leases_enabled:
            holder = rows[0][0]
            if holder["lease_owner"] and (holder["expires_in"] or 0) > 0:
                raise ThreadBusyError(thread_id, holder["lease_owner"], holder["expires_in"])
        if not rows[1]:
            raise MigrationError(
                f"checkpoint {cid!r} of thread {thread_id!r} disappeared while migrating",
                thread_id=thread_id, from_version=expected, to_version=target,
            )
        now_version = rows[1][0]["graph_version"]
        if now_version == target:
            return None
        if now_version != expected:
            raise MigrationError(
                f"checkpoint {cid!r} of thread {thread_id!r} changed while migrating (its version "
                f"is now {now_version!r}, expected {expected!r}); retry",
                thread_id=thread_id, from_version=expected, to_version=target,
            )
        raw_inline: dict[str, Any] = rows[1][0]["inline_values"] or {}
        return raw_inline, {r["task_id"]: r["task_path"] for r in rows[2]}

    def _rewrite_values(
        self,
        saved: CheckpointTuple,
        checkpoint: Mapping[str, Any],
        raw_inline: Mapping[str, Any],
        artifacts: dict[bytes, bytes],
    ) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
        """Step 2: the migrated checkpoint's inline values and new blob rows (changed
        channels only), collecting their artifacts into ``artifacts``."""
        cfg = saved.config["configurable"]
        thread_id, ns = str(cfg["thread_id"]), cfg.get("checkpoint_ns", "")
        old_versions = saved.checkpoint["channel_versions"]
        new_versions = checkpoint["channel_versions"]
        values_json: dict[str, Any] = {}
        blob_rows: list[tuple[Any, ...]] = []
        sealed = _sealing.keyring_of(self.serde) is not None  # no value inline (issue 27)
        for k, v in checkpoint["channel_values"].items():
            if k in old_versions and old_versions[k] == new_versions.get(k):
                # Unchanged: keep it exactly as stored (inline JSON, or its blob row).
                if k in raw_inline:
                    values_json[k] = raw_inline[k]
                continue
            if (sealed and v is not None) or isinstance(v, _DeltaSnapshot) or not self._inline(v):
                if isinstance(v, _DeltaSnapshot):
                    values_json[k] = True
                enc = self.codec.encode(self.serde, v)
                artifacts.update(enc.artifacts)
                blob_rows.append((thread_id, ns, k, cast(str, new_versions[k]), enc.type, enc.data))
            else:
                values_json[k] = v
        return values_json, blob_rows

    def _rewrite_writes(
        self,
        saved: CheckpointTuple,
        result: MigrationResult,
        paths: Mapping[str, str],
        artifacts: dict[bytes, bytes],
    ) -> list[tuple[Any, ...]]:
        """Step 3: the pending-write rows of a migration that changed them."""
        cfg = saved.config["configurable"]
        thread_id, ns, cid = str(cfg["thread_id"]), cfg.get("checkpoint_ns", ""), cfg["checkpoint_id"]
        write_rows: list[tuple[Any, ...]] = []
        by_task: dict[str, int] = {}
        for task_id, channel, value in result.writes:
            idx = WRITES_IDX_MAP.get(channel)
            if idx is None:
                idx = by_task.get(task_id, 0)
                by_task[task_id] = idx + 1
            enc = self.codec.encode(self.serde, value)
            artifacts.update(enc.artifacts)
            path = result.task_paths.get(task_id) or paths.get(task_id, "")
            write_rows.append((thread_id, ns, cid, task_id, path, idx, channel, enc.type, enc.data))
        return write_rows

    @staticmethod
    def _rewrite_log(
        saved: CheckpointTuple, result: MigrationResult, expected: str, target: str | None, origin: str
    ) -> Stmt:
        """The statement copying the rows a rewrite replaces into durable_migration_log
        (the channels whose version changes), returning the log entry's id."""
        cfg = saved.config["configurable"]
        old_versions = saved.checkpoint["channel_versions"]
        new_versions = result.checkpoint["channel_versions"]
        gone = [(k, str(v)) for k, v in old_versions.items() if new_versions.get(k) != v]
        return Stmt(
            INSERT_LOG_SQL,
            {
                "from": expected,
                "to": target,
                "steps": _jsonb(result.steps),
                "origin": origin,
                "channels": [k for k, _ in gone],
                "versions": [v for _, v in gone],
                "thread_id": str(cfg["thread_id"]),
                "ns": cfg.get("checkpoint_ns", ""),
                "cid": cfg["checkpoint_id"],
            },
            fetch=True,
        )


def graph_name(graph: Any, config: Any) -> str | None:
    """The name a graph's versions are grouped by (issue 25): the run's metadata
    ``graph_id`` (LangGraph Platform's graph name), else ``assistant_id``, else the
    compiled graph's ``name`` when it is not LangGraph's default."""
    metadata = (config.get("metadata") or {}) if isinstance(config, dict) else {}
    for key in ("graph_id", "assistant_id"):
        value = metadata.get(key)
        if isinstance(value, str) and value:
            return value[:200]
    name = getattr(graph, "name", None)
    return name[:200] if isinstance(name, str) and name and name != "LangGraph" else None
