"""Writing: ``put`` and ``put_writes`` ops (encode, artifacts, the guarded statements)
and the retry loop around them (an artifact collected meanwhile, a concurrent write
storing the same artifacts)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import wait as futures_wait
from contextvars import ContextVar
from functools import partial
from typing import Any, cast

import orjson
import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres.base import (
    INSERT_CHECKPOINT_WRITES_SQL,
    UPSERT_CHECKPOINT_BLOBS_SQL,
    UPSERT_CHECKPOINT_WRITES_SQL,
)
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from psycopg.types.json import Jsonb

from langgraph_durable import _sealing, _values
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import (
    AfterCommit,
    Batch,
    Op,
    Stmt,
)
from langgraph_durable._pool import OUTAGE
from langgraph_durable.artifacts import (
    ArtifactsInFlight,
    WriteSession,
)
from langgraph_durable.core.jsonb import _as_is, _json_problem, _jsonb_now
from langgraph_durable.core.view import WriteView
from langgraph_durable.errors import (
    DurableError,
    SerializationError,
    ThreadBusyError,
    UnencodableValueError,
)
from langgraph_durable.leases.dead import op_expire_if_dead
from langgraph_durable.leases.fence import checks_parent
from langgraph_durable.leases.model import Lease
from langgraph_durable.sql.artifacts import (
    ARTIFACT_LOCK_CLASS,
    ARTIFACT_LOCK_SHARED_SQL,
    INSERT_ARTIFACT_REF_SQL,
    UPSERT_ARTIFACT_SQL,
)
from langgraph_durable.sql.checkpoints import (
    CANCELLED_PUT_SQL,
    GUARDED_INSERT_WRITE_SQL,
    GUARDED_INSERT_WRITES_SQL,
    GUARDED_UPSERT_CHECKPOINT_INHERIT_SQL,
    GUARDED_UPSERT_CHECKPOINT_SQL,
    GUARDED_UPSERT_CHILD_CHECKPOINT_INHERIT_SQL,
    GUARDED_UPSERT_CHILD_CHECKPOINT_SQL,
    GUARDED_UPSERT_WRITE_SQL,
    GUARDED_UPSERT_WRITES_SQL,
    GUARDED_WRITES_MAX,
)
from langgraph_durable.sql.threads import SYNC_THREAD_VERSION_SQL
from langgraph_durable.versioning import VERSION_KEY

logger = logging.getLogger("langgraph_durable")


# The put/put_writes call running in this context (see artifacts.WriteSession). A
# ContextVar: it follows the op into asyncio.to_thread and into the same task, and ops
# run where no call set it (e.g. a sync call of the async saver) simply do not dedup.
_WRITE_SESSION: ContextVar[WriteSession | None] = ContextVar("langgraph_durable_write", default=None)


# How long a write waits for a concurrent write storing the same artifacts before it
# sends them itself (a safety net: the other write normally ends within its statement).
_INFLIGHT_WAIT = 30.0


def _last_per_key(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """An upsert's rows, the last of each key (idx: one call's rows share thread,
    namespace, checkpoint and task), in order: what upserting them one by one leaves."""
    seen: dict[Any, tuple[Any, ...]] = {}
    for r in rows:
        seen.pop(r[5], None)
        seen[r[5]] = r
    return list(seen.values()) if len(seen) < len(rows) else rows


_START = "__start__"


def _root(channel: str) -> str:
    """How an error names a channel's value: the graph input, or the state."""
    return "input" if channel == _START else f"state[{channel!r}]"


def _write_root(channel: str) -> str:
    """How an error names a pending write's value (built on the error path only)."""
    return "input" if channel == _START else f"writes[{channel!r}]"


class WriteOps(WriteView):
    """The write ops of the saver."""

    def _artifact_stmts(self, thread_id: str, artifacts: dict[bytes, bytes]) -> tuple[list[Stmt], list[bytes]]:
        """Statements storing a write's artifacts and reference rows, and the digests to
        remember once committed. The first statement is the thread's shared artifact
        lock: send it before the fence (everything that takes both takes the advisory
        lock first, so they cannot deadlock). Artifacts this process stored for the
        thread recently are not compressed and sent again; their reference rows are
        (one index probe each), so a reference never depends on a cache being right."""
        if not artifacts:
            return [], []
        digests = sorted(artifacts)
        session = _WRITE_SESSION.get()
        if session is not None and session.known is self._known_refs:
            # Inside put/put_writes: own the new pairs while storing them, or wait for
            # the concurrent write storing them (raises before anything is sent).
            new = self._known_refs.reserve(session, thread_id, digests, wait=not session.force)
        else:
            new = sorted(self._known_refs.unknown(thread_id, digests))
        _telemetry.count("artifacts_deduplicated", len(digests) - len(new))
        stmts = [Stmt(ARTIFACT_LOCK_SHARED_SQL, (ARTIFACT_LOCK_CLASS, thread_id))]
        if new:
            sealed = [self.codec.seal(artifacts[d], self.serde) for d in new]
            stmts.append(Stmt(UPSERT_ARTIFACT_SQL, (new, [len(artifacts[d]) for d in new], sealed)))
        stmts.append(Stmt(INSERT_ARTIFACT_REF_SQL, (thread_id, digests)))
        return stmts, digests

    def _write(self, thread_id: str, factory: Callable[[], Op[Any]]) -> Any:
        """Run a put/put_writes op. A foreign-key violation means an artifact this
        process believed stored was garbage-collected meanwhile (its references were
        dropped by prune/retention/delete elsewhere): forget, and write again with
        the data. Nothing was committed by the failed attempt. Artifacts a concurrent
        write of this process is storing are waited for, not sent twice (WriteSession).
        A write outside a run refused by a live lease whose owner is a provably dead
        process of this machine ends that lease and is retried once (``op_expire_if_dead``),
        as a run start takes it over: not ThreadBusyError for up to lease_ttl."""
        session = WriteSession(self._known_refs)
        token = _WRITE_SESSION.set(session)
        committed = False
        try:
            retried_fk = retried_dead = False
            while True:
                try:
                    result = self._run_op(factory)
                except ThreadBusyError as refused:
                    if retried_dead or not self.takeover_dead_owners:
                        raise
                    retried_dead = True
                    holder = refused.fields.get("owner")
                    if not self._run_op(partial(op_expire_if_dead, thread_id, holder)):
                        raise
                    session.finish(False)
                    logger.warning("thread %s: lease holder %s is a dead process of this machine; "
                                   "its lease ended, writing again", thread_id, holder)
                    continue
                except ArtifactsInFlight as busy:
                    session.finish(False)
                    _, pending = futures_wait(busy.futures, timeout=_INFLIGHT_WAIT)
                    session.force = bool(pending)
                    continue
                except psycopg.errors.ForeignKeyViolation:
                    if retried_fk:
                        raise
                    retried_fk = True
                    session.finish(False)
                    logger.info("thread %s: an artifact was collected meanwhile; writing it again", thread_id)
                    self._known_refs.forget_thread(thread_id)
                    continue
                committed = True
                return result
        finally:
            _WRITE_SESSION.reset(token)
            session.finish(committed)

    async def _awrite(self, thread_id: str, factory: Callable[[], Op[Any]]) -> Any:
        session = WriteSession(self._known_refs)
        token = _WRITE_SESSION.set(session)
        committed = False
        try:
            retried_fk = retried_dead = False
            while True:
                try:
                    result = await self._arun_op(factory)
                except ThreadBusyError as refused:
                    if retried_dead or not self.takeover_dead_owners:
                        raise
                    retried_dead = True
                    holder = refused.fields.get("owner")
                    if not await self._arun_op(partial(op_expire_if_dead, thread_id, holder)):
                        raise
                    session.finish(False)
                    logger.warning("thread %s: lease holder %s is a dead process of this machine; "
                                   "its lease ended, writing again", thread_id, holder)
                    continue
                except ArtifactsInFlight as busy:
                    session.finish(False)
                    waits = [asyncio.wrap_future(f) for f in busy.futures]
                    _, pending = await asyncio.wait(waits, timeout=_INFLIGHT_WAIT)
                    session.force = bool(pending)
                    continue
                except psycopg.errors.ForeignKeyViolation:
                    if retried_fk:
                        raise
                    retried_fk = True
                    session.finish(False)
                    logger.info("thread %s: an artifact was collected meanwhile; writing it again", thread_id)
                    self._known_refs.forget_thread(thread_id)
                    continue
                committed = True
                return result
        finally:
            _WRITE_SESSION.reset(token)
            session.finish(committed)

    def _inline(self, value: Any) -> bool:
        # Exact types first (one type() per channel per put, issue 14); subclasses
        # (an IntEnum, a str enum) take the isinstance path below, as before.
        kind = type(value)
        if kind is str:
            threshold = self.codec.config.threshold
            return "\x00" not in value and (threshold is None or len(value) < max(threshold, 1))
        if kind is int:
            return abs(value) < 2**63
        if kind is bool or value is None:
            return True
        if isinstance(value, float):
            # Only floats JSONB gives back as the same float: nan/inf become null, -0.0
            # becomes 0, and from 1e16 on orjson writes an exponent that numeric prints
            # back as an integer. Those go to a blob (msgpack keeps them exactly).
            negative_zero = value == 0.0 and math.copysign(1.0, value) < 0
            return math.isfinite(value) and abs(value) < 1e15 and not negative_zero
        if value is None or isinstance(value, bool | int):
            return not isinstance(value, int) or isinstance(value, bool) or abs(value) < 2**63
        if isinstance(value, str):
            threshold = self.codec.config.threshold
            return "\x00" not in value and (threshold is None or len(value) < max(threshold, 1))
        return False

    def _stamp(self, config: RunnableConfig, metadata: CheckpointMetadata, lease: Lease | None) -> dict[str, Any]:
        md: dict[str, Any] = dict(get_serializable_checkpoint_metadata(config, metadata))
        if VERSION_KEY not in md:
            version = (lease.version if lease else None) or self.graph_version
            if version:
                md[VERSION_KEY] = version
        return md

    def _encode(self, value: Any, where: Mapping[str, Any], root: str) -> Any:
        """``codec.encode``; on failure, the typed error naming where the value is."""
        try:
            return self.codec.encode(self.serde, value)
        except SerializationError as exc:
            raise self._unencodable(exc, value, where, root) from exc

    def _unencodable(
        self, exc: SerializationError, value: Any, where: Mapping[str, Any], root: str
    ) -> UnencodableValueError:
        """The typed error for a value the serializer refused, naming where it is."""
        inner = value.value if isinstance(value, _DeltaSnapshot) else value
        found = _values.find_unencodable(inner, _values.serializer_reject(self.serde), root)
        path, culprit, reason = found or (root, inner, str(exc))
        return UnencodableValueError(**where, path=path, value_type=type(culprit).__name__, reason=reason)

    def _check_texts(self, value: Any, where: Mapping[str, Any], root: str) -> None:
        """Refuse a state string with a lone surrogate before anything is sent.
        Inline, PostgreSQL's JSON refuses it (after the node ran); in a blob, LangGraph's
        serializer stores '?' instead (OPT_REPLACE_SURROGATES), so the run would go on
        with a string that differs from the stored one. Checked: a channel's own string
        value, and the graph input's (``{"channel": "text"}``); isascii() answers at
        C speed for nearly every string. Strings nested deeper are the serializer's."""
        texts: Any = ()
        if isinstance(value, str):
            texts = ((root, value),)
        elif root == "input" and isinstance(value, dict):
            texts = ((f"input[{k!r}]", v) for k, v in value.items() if isinstance(v, str))
        for path, text in texts:
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise UnencodableValueError(
                        **where, path=path, value_type="str",
                        reason=cast(str, _values.surrogate_problem(text)),
                    ) from exc

    def _write_error(
        self, exc: BaseException, operation: str, where: Mapping[str, Any], parts: Mapping[str, Any]
    ) -> DurableError | None:
        """The typed error for a write the database refused (nothing was committed:
        the write is one transaction), or None for errors handled elsewhere."""
        canceled = _values.canceled_error(exc, operation, **where)
        if canceled is not None:
            return cast(DurableError, canceled)
        if not isinstance(exc, psycopg.DataError):
            return None
        # Text PostgreSQL refuses (a NUL or a lone surrogate in metadata or an inline
        # value): find it, on this error path only.
        found = None
        for root, value in parts.items():
            found = found or _values.locate(value, _values.text_reject, root)
        path, culprit, reason = found or (operation, None, str(exc).splitlines()[0])
        return UnencodableValueError(**where, path=path, value_type=type(culprit).__name__, reason=reason)

    def _put_values(
        self, checkpoint: Checkpoint, new_versions: ChannelVersions, where: Mapping[str, Any]
    ) -> tuple[Checkpoint, list[tuple[Any, ...]], dict[bytes, bytes]]:
        """A put's first step: the checkpoint with its inline values only, the blob rows
        of the others (encoded) and their artifacts. Nothing is sent yet."""
        thread_id, checkpoint_ns = where["thread_id"], where["checkpoint_ns"]
        copy = checkpoint.copy()
        values = checkpoint["channel_values"]
        inline = copy["channel_values"] = dict(values)
        blob_values: dict[str, Any] = {}
        if _sealing.keyring_of(self.serde) is not None:
            return self._put_values_sealed(copy, checkpoint, new_versions, where)
        for k, v in values.items():
            if type(v) is str:
                # The usual channel value, its checks without isinstance (per channel
                # per put, on LangGraph's critical path, issue 14).
                if not v.isascii():
                    self._check_texts(v, where, _root(k))
                if not self._inline(v):
                    blob_values[k] = inline.pop(k)
                continue
            if isinstance(v, _DeltaSnapshot):
                blob_values[k] = inline.pop(k)
                inline[k] = True
            elif not self._inline(v):
                blob_values[k] = inline.pop(k)
            if (isinstance(v, str) and not v.isascii()) or (k == _START and isinstance(v, dict)):
                # Only these can fail _check_texts (tested here, not in it).
                self._check_texts(v, where, _root(k))
        artifacts: dict[bytes, bytes] = {}
        blob_rows: list[tuple[Any, ...]] = []
        for k, ver in new_versions.items():
            if k in blob_values:
                enc = self._encode(blob_values[k], where, _root(k))
                artifacts.update(enc.artifacts)
                blob_rows.append((thread_id, checkpoint_ns, k, ver, enc.type, enc.data))
        return copy, blob_rows, artifacts

    def _put_values_sealed(
        self, copy: Checkpoint, checkpoint: Checkpoint, new_versions: ChannelVersions, where: Mapping[str, Any]
    ) -> tuple[Checkpoint, list[tuple[Any, ...]], dict[bytes, bytes]]:
        """``_put_values`` with an encrypting serializer (issue 27): no value stays inline
        in the checkpoint's JSON (``None`` aside: it says nothing), every one goes to a
        blob through the (encrypting) serializer. A value that would have been inline gets its blob row at every put,
        not only when its channel changed: a checkpoint written before encryption was on
        kept it inline, so no blob of its (channel, version) may exist yet (the upsert
        leaves an existing one alone)."""
        thread_id, checkpoint_ns = where["thread_id"], where["checkpoint_ns"]
        inline = copy["channel_values"] = {}
        versions = checkpoint["channel_versions"]
        artifacts: dict[bytes, bytes] = {}
        blob_rows: list[tuple[Any, ...]] = []
        for k, v in checkpoint["channel_values"].items():
            if v is None:
                inline[k] = None  # no information (trigger channels): kept inline, as without a key
                continue
            if isinstance(v, _DeltaSnapshot):
                inline[k] = True
            elif (isinstance(v, str) and not v.isascii()) or (k == _START and isinstance(v, dict)):
                self._check_texts(v, where, _root(k))
            ver = new_versions.get(k)
            if ver is None and (isinstance(v, _DeltaSnapshot) or not self._inline(v)):
                continue  # stored as a blob when its channel changed, as without a key
            ver = versions.get(k) if ver is None else ver
            if ver is None:
                continue
            enc = self._encode(v, where, _root(k))
            artifacts.update(enc.artifacts)
            blob_rows.append((thread_id, checkpoint_ns, k, ver, enc.type, enc.data))
        return copy, blob_rows, artifacts

    @staticmethod
    def _put_json(copy: Checkpoint, md: dict[str, Any], where: Mapping[str, Any]) -> tuple[Jsonb, Jsonb]:
        """The checkpoint and metadata as JSONB parameters, dumped now (see _jsonb_now)."""
        try:
            # _jsonb_now's common case, inline (four Python calls per put, issue 14);
            # anything orjson refuses takes _jsonb_now's stdlib fallback below.
            return Jsonb(orjson.dumps(copy).decode(), dumps=_as_is), Jsonb(orjson.dumps(md).decode(), dumps=_as_is)
        except TypeError:
            pass
        try:
            return _jsonb_now(copy), _jsonb_now(md)
        except Exception as exc:  # metadata a caller put in config["metadata"]
            found = _values.find_unencodable(md, _json_problem, "metadata")
            path, culprit, reason = found or ("checkpoint", copy, f"{type(exc).__name__}: {exc}")
            raise UnencodableValueError(
                **where, path=path, value_type=type(culprit).__name__, reason=reason
            ) from exc

    def _op_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Op[RunnableConfig]:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        parent_id = configurable.get("checkpoint_id")
        _values.check_ids(thread_id, checkpoint_ns, parent_id)
        where = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint["id"]}
        copy, blob_rows, artifacts = self._put_values(checkpoint, new_versions, where)
        mode, guard, lease = self._guard(thread_id, config, checkpoint_ns, checkpoint["id"], parent_id)
        md = self._stamp(config, metadata, lease)
        cp_json, md_json = self._put_json(copy, _sealing.seal_metadata(_sealing.keyring_of(self.serde), md), where)
        _telemetry.checkpoint_bytes(cp_json, blob_rows)
        stmts: list[Stmt] = []
        new_refs: list[bytes] = []
        if artifacts:
            stmts, new_refs = self._artifact_stmts(thread_id, artifacts)
        if blob_rows:
            stmts.append(Stmt(UPSERT_CHECKPOINT_BLOBS_SQL, blob_rows, many=True))
        # The checkpoint row carries the guard (issue 14): fence (or foreign-lease check)
        # and order check (never behind the head: clock skew, durable_checkpoint_order)
        # in the upsert itself, so a put sends the stock saver's statements. The order
        # check stays with leases=False too: a writer with a slow clock would otherwise
        # make the next load resume from an older head and run its steps again.
        row: tuple[Any, ...] = (thread_id, checkpoint_ns, checkpoint["id"], parent_id, cp_json, md_json)
        # A run's put with a parent also checks the parent is on the server (issue 23,
        # _GUARD_PARENT: a failover may have lost it); guard_params added its parameters.
        child = mode == "lease" and checks_parent(lease, checkpoint_ns, parent_id)
        if VERSION_KEY not in md and parent_id:
            # No version known (a write outside a run, e.g. update_state from a script):
            # inherit the parent's, so editing a thread never makes it "unversioned".
            texts = GUARDED_UPSERT_CHILD_CHECKPOINT_INHERIT_SQL if child else GUARDED_UPSERT_CHECKPOINT_INHERIT_SQL
            row = (*row, thread_id, checkpoint_ns, parent_id)
        else:
            texts = GUARDED_UPSERT_CHILD_CHECKPOINT_SQL if child else GUARDED_UPSERT_CHECKPOINT_SQL
        sql = texts[mode]
        if mode == "foreign" and not checkpoint_ns and md.get(VERSION_KEY):
            # Outside a run: the row's version follows the head (SYNC_THREAD_VERSION_SQL).
            # Before the guarded upsert, whose FOR SHARE it must not upgrade (two such
            # puts would deadlock); a refused guard rolls it back (one implicit transaction).
            version = md[VERSION_KEY]
            stmts.append(Stmt(SYNC_THREAD_VERSION_SQL, (version, thread_id, version)))
        stmts.append(Stmt(sql, (*row, *guard)))
        failure = (where, parent_id, lease, {"state": copy["channel_values"], "metadata": md})
        # One pipeline, no BEGIN/COMMIT (_io._implicit).
        out = yield from self._put_batch(stmts, *failure)
        if lease is not None:
            if out.rowcounts and out.rowcounts[-1] == 0:
                # A run's put filtered out by an operator's cancel (_LEASE_PUT_PROBE): the
                # checkpoint is stored by a second, unfiltered put (its own implicit
                # transaction; the blobs above committed), and the run stops at its
                # next step boundary. Rare: only once per cancel.
                lease.cancel = True
                yield from self._put_batch([Stmt(CANCELLED_PUT_SQL[sql], (*row, *guard))], *failure)
            lease.acked[checkpoint_ns] = checkpoint["id"]
        OUTAGE.writable()  # "writable again" after an outage (_pool: two attribute reads)
        if new_refs:
            yield AfterCommit(lambda: self._known_refs.add(thread_id, new_refs))
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def _put_batch(
        self, stmts: list[Stmt], where: Mapping[str, Any], parent_id: str | None,
        lease: Lease | None, values: Mapping[str, Any],
    ) -> Op[Any]:
        """A put's final batch; a refused guard or a bad value as its typed error."""
        thread_id, checkpoint_ns, checkpoint_id = where["thread_id"], where["checkpoint_ns"], where["checkpoint_id"]
        try:
            return (yield Batch(stmts, final=True))
        except psycopg.Error as exc:
            err = self._fence_error(thread_id, lease, exc) or self._gone_error(
                thread_id, checkpoint_ns, checkpoint_id, parent_id, lease, exc
            )
            if err is not None:
                raise err from None
            err = self._order_error(thread_id, checkpoint_ns, checkpoint_id, exc) or self._write_error(
                exc, "put", where, values
            )
            if err is None:
                raise
            raise err from exc

    def _write_rows(
        self, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str, where: Mapping[str, Any]
    ) -> tuple[list[tuple[Any, ...]], dict[bytes, bytes]]:
        """A put_writes' rows (values checked and encoded) and their artifacts."""
        artifacts: dict[bytes, bytes] = {}
        rows: list[tuple[Any, ...]] = []
        thread_id, checkpoint_ns, checkpoint_id = where["thread_id"], where["checkpoint_ns"], where["checkpoint_id"]
        encode, serde = self.codec.encode, self.serde
        for idx, (channel, value) in enumerate(writes):
            if (isinstance(value, str) and not value.isascii()) or (channel == _START and isinstance(value, dict)):
                # Only these can fail it (see _put_values).
                self._check_texts(value, where, _write_root(channel))
            try:
                enc = encode(serde, value)
            except SerializationError as exc:
                raise self._unencodable(exc, value, where, _write_root(channel)) from exc
            if enc.artifacts:
                artifacts.update(enc.artifacts)
            rows.append(
                (
                    thread_id,
                    checkpoint_ns,
                    checkpoint_id,
                    task_id,
                    task_path,
                    WRITES_IDX_MAP.get(channel, idx),
                    channel,
                    enc.type,
                    enc.data,
                )
            )
        return rows, artifacts

    def _op_put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Op[None]:
        if not writes:
            return
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = configurable["checkpoint_id"]
        _values.check_ids(thread_id, checkpoint_ns, checkpoint_id)
        where = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
        # The stock rule: upsert when every write is a special one (error, interrupt...).
        query = UPSERT_CHECKPOINT_WRITES_SQL
        for w in writes:
            if w[0] not in WRITES_IDX_MAP:
                query = INSERT_CHECKPOINT_WRITES_SQL
                break
        rows, artifacts = self._write_rows(writes, task_id, task_path, where)
        mode, guard, lease = self._guard(thread_id, config, None, None)
        stmts: list[Stmt] = []
        new_refs: list[bytes] = []
        if artifacts:
            stmts, new_refs = self._artifact_stmts(thread_id, artifacts)
        upsert = query is UPSERT_CHECKPOINT_WRITES_SQL
        if 1 < len(rows) <= GUARDED_WRITES_MAX:
            # A step's few writes: one statement, the guard once (issue 26,
            # GUARDED_UPSERT_WRITES_SQL; leases=False: the stock columns and actions,
            # no guard), where stock sends one per write.
            if upsert:
                rows = _last_per_key(rows)
            texts = GUARDED_UPSERT_WRITES_SQL[mode] if upsert else GUARDED_INSERT_WRITES_SQL[mode]
            if len(rows) > 1:
                stmts.append(Stmt(texts[len(rows)], (*[v for r in rows for v in r], *guard)))
                rows = []
        if mode != "none":
            # The rows carry the guard (issue 14, see GUARDED_UPSERT_WRITE_SQL): it
            # runs before the first write row is inserted or locked. One write, or a
            # large fan-out: its first row guarded, the rest the stock statement.
            if rows:
                guarded = GUARDED_UPSERT_WRITE_SQL[mode] if upsert else GUARDED_INSERT_WRITE_SQL[mode]
                stmts.append(Stmt(guarded, [(*rows[0], *guard)], many=True))
                rows = rows[1:]
        if rows:
            stmts.append(Stmt(query, rows, many=True))
        try:
            yield Batch(stmts, final=True)
        except psycopg.Error as exc:
            err = self._fence_error(thread_id, lease, exc)
            if err is not None:
                raise err from None
            err = self._write_error(exc, "put_writes", where, {"writes": {w[0]: w[1] for w in writes}})
            if err is None:
                raise
            raise err from exc
        if new_refs:
            yield AfterCommit(lambda: self._known_refs.add(thread_id, new_refs))
