"""Loading: rows to ``CheckpointTuple``s, artifacts fetched in batch between the row
fetch and the decode, pre-v4 pending sends, the delta-channel walk."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from types import SimpleNamespace
from typing import Any, cast

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    Checkpoint,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    writes_sort_key,
)
from langgraph.checkpoint.postgres.base import (
    _DELTA_PAGE_SIZE,
    SELECT_PENDING_SENDS_SQL,
    SELECT_SQL,
    BasePostgresSaver,
    _build_delta_stage1_sql,
    _build_delta_stage2_sql,
    _DeltaStage2Row,
)
from langgraph.checkpoint.serde.types import TASKS

from langgraph_durable import _sealing, _values
from langgraph_durable._io import (
    Batch,
    Op,
    Stmt,
)
from langgraph_durable.core.idclock import _advance_id_clock
from langgraph_durable.core.view import LoadView
from langgraph_durable.errors import (
    CheckpointLoadError,
    DecryptionError,
    DurableError,
)
from langgraph_durable.keyring import decryption_error
from langgraph_durable.sql.artifacts import FETCH_ARTIFACTS_SQL

# Keys _op_load_rows adds to a checkpoint row for _load_checkpoint_tuple (not columns).
_ROW_LOCAL = "__durable_local"


_ROW_SENDS = "__durable_sends"


def _load_error(where: Mapping[str, Any], what: str, exc: BaseException) -> DurableError:
    """The typed error for stored bytes that do not decode (the caller chains ``exc``):
    ``DecryptionError`` when it is the key (a wrong one, or none: not damage, so the thread
    is refused, not quarantined), else ``CheckpointLoadError``."""
    key_error = decryption_error(
        exc, thread_id=where.get("thread_id"), where=what, checkpoint_id=where.get("checkpoint_id")
    )
    if key_error is not None:
        return key_error
    return CheckpointLoadError(
        f"cannot decode {what} of checkpoint {where.get('checkpoint_id')!r} of thread "
        f"{where.get('thread_id')!r}: {type(exc).__name__}: {exc}",
        thread_id=where.get("thread_id", ""),
        checkpoint_ns=where.get("checkpoint_ns", ""),
        checkpoint_id=where.get("checkpoint_id"),
    )


@contextmanager
def _canceled_as_typed(operation: str, config: RunnableConfig | None) -> Iterator[None]:
    """A statement the database canceled (statement_timeout...) as a typed error."""
    try:
        yield
    except psycopg.Error as exc:
        conf = (config or {}).get("configurable", {})
        err = _values.canceled_error(
            exc, operation, conf.get("thread_id"), conf.get("checkpoint_ns", ""), conf.get("checkpoint_id")
        )
        if err is None:
            raise
        raise err from exc


def _threads_config(thread_ids: Any) -> RunnableConfig:
    """What a typed error of a maintenance op on ``thread_ids`` names: the thread when
    there is one, else none (a list, or runs whose threads are not known yet)."""
    ids = [thread_ids] if isinstance(thread_ids, str) else list(thread_ids or [])
    return {"configurable": {"thread_id": str(ids[0]) if len(ids) == 1 else None}}


class _ResolvingSerde:
    """Serde facade for the stock delta helper: resolves artifact envelopes."""

    def __init__(
        self, saver: LoadOps, where: Mapping[str, Any], local: Mapping[bytes, bytes] | None = None
    ) -> None:
        self.saver = saver
        self.where = where
        self.local = local

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self.saver._decode(data[0], data[1], self.where, self.local)

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self.saver.serde.dumps_typed(obj)


class LoadOps(LoadView):
    """The read ops of the saver."""

    def _op_resolve(
        self,
        pairs: list[tuple[str, bytes]],
        where: Mapping[str, Any],
        locate: Callable[[bytes], Mapping[str, Any] | None] | None = None,
    ) -> Op[dict[bytes, bytes]]:
        """Fetch every artifact the (type, data) pairs need: batched, one round trip
        per nesting level (chunks, then elements). Returns what was fetched (verified),
        which the decode uses whatever the bounded cache has evicted meanwhile."""
        from langgraph_durable.errors import ArtifactNotFoundError

        local: dict[bytes, bytes] = {}
        while True:
            missing = self.codec.missing(pairs, local)
            if not missing:
                return local
            rows = yield Batch(
                [Stmt(FETCH_ARTIFACTS_SQL, (sorted(missing),), fetch=True, prepare=False)]
            )
            found = [(r["digest"], r["data"]) for r in rows[0]]
            self.codec.accept(found, serde=self.serde, local=local, locate=locate, **where)
            if len(found) < len(missing):
                got = {bytes(d) for d, _ in found}
                lost = min(missing - got)
                at = dict((locate(lost) if locate else None) or where)
                raise ArtifactNotFoundError(lost.hex(), **at)

    def _decode(
        self, tag: str, data: bytes, where: Mapping[str, Any], local: Mapping[bytes, bytes] | None = None
    ) -> Any:
        try:
            return self.codec.decode(self.serde, tag, data, local=local, **where)
        except DecryptionError as exc:
            raise _load_error(where, "a stored value", exc) from exc
        except DurableError:
            raise
        except Exception as exc:  # damaged bytes: msgpack, zstd, the serializer's own
            wrong_key = _sealing.decrypt_failure(
                self.serde, tag, exc, thread_id=where.get("thread_id"), where=f"a {tag!r} value",
                checkpoint_id=where.get("checkpoint_id"),
            )
            if wrong_key is not None:
                raise wrong_key from exc
            raise _load_error(where, f"a {tag!r} value", exc) from exc

    def _op_legacy_sends(self, rows: list[Any]) -> Op[dict[tuple[str, str], list[tuple[str, bytes]]]]:
        """Pending sends of checkpoints older than format v4, by (thread, parent id).

        Before v4, LangGraph kept a step's ``Send`` packets as ``TASKS`` writes of the
        parent checkpoint; the stock saver moves them into the child's ``TASKS`` channel
        when it reads the child (``BasePostgresSaver._migrate_pending_sends``, with the
        stock ``SELECT_PENDING_SENDS_SQL``). Same here, so a database the stock saver
        wrote long ago resumes with its sends. One round trip, only when such rows are
        loaded. Unlike the stock ``list()``, which looks only in the first row's thread,
        each thread's rows are looked up in their own thread."""
        by_thread: dict[str, list[str]] = {}
        for row in rows:
            stored = row["checkpoint"]
            v = stored.get("v") if isinstance(stored, dict) else None
            if isinstance(v, int) and v < 4 and row["parent_checkpoint_id"]:
                by_thread.setdefault(row["thread_id"], []).append(row["parent_checkpoint_id"])
        if not by_thread:
            return {}
        threads = sorted(by_thread)
        found = yield Batch(
            [Stmt(SELECT_PENDING_SENDS_SQL, (t, sorted(set(by_thread[t]))), fetch=True) for t in threads]
        )
        out: dict[tuple[str, str], list[tuple[str, bytes]]] = {}
        for thread_id, result in zip(threads, found, strict=True):
            for r in result:
                sends = [(bytes(t).decode(), bytes(b)) for t, b in r["sends"] or ()]
                if sends:
                    out[(thread_id, r["checkpoint_id"])] = sends
        return out

    def _op_load_rows(self, rows: list[Any]) -> Op[list[CheckpointTuple]]:
        legacy = yield from self._op_legacy_sends(rows)
        pairs: list[tuple[str, bytes]] = [p for sends in legacy.values() for p in sends]
        for row in rows:
            for _, t, v in row["channel_values"] or ():
                pairs.append((t.decode(), v))
            for w in row["pending_writes"] or ():
                pairs.append((w[2].decode(), w[3]))
        local: dict[bytes, bytes] | None = None
        if any(self.codec.is_ref(t) for t, _ in pairs):
            first = rows[0]
            where = {
                "thread_id": first["thread_id"],
                "checkpoint_ns": first["checkpoint_ns"],
                "checkpoint_id": first["checkpoint_id"],
            }
            try:
                local = yield from self._op_resolve(pairs, where, partial(self._locate, rows))
            except DecryptionError as exc:
                raise _load_error(where, "a stored value", exc) from exc
            except (DurableError, psycopg.Error):
                raise
            except Exception as exc:  # an envelope that does not parse
                raise _load_error(self._damaged_row(rows) or where, "an artifact envelope", exc) from exc
        for row in rows:
            row[_ROW_LOCAL] = local
            row[_ROW_SENDS] = legacy.get((row["thread_id"], row["parent_checkpoint_id"]))
        return [self._row_tuple(row) for row in rows]

    def _row_tuple(self, row: Any) -> CheckpointTuple:
        """One row to a tuple. The sync saver goes through the stock saver's name,
        ``_load_checkpoint_tuple`` (LangGraph's own tests patch it on an instance to
        alter the row first); the async one cannot (the stock async hook is a coroutine,
        and ops do not await), so it converts directly."""
        return self._load_tuple(row, row.get(_ROW_LOCAL), row.get(_ROW_SENDS))

    def _damaged_row(self, rows: list[Any]) -> Mapping[str, Any] | None:
        """The first of ``rows`` whose envelopes do not parse (error path only)."""
        for row in rows:
            try:
                self.codec.referenced(self._row_pairs(row))
            except Exception:
                return {k: row[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")}
        return None

    def _locate(self, rows: list[Any], digest: bytes) -> Mapping[str, Any] | None:
        """The first of ``rows`` (newest first) whose values need ``digest``: names
        the right checkpoint in an integrity error when ``list`` loads many."""
        for row in rows:
            try:
                found, _ = self.codec.referenced(self._row_pairs(row))
            except Exception:  # a damaged envelope: _damaged_row names that one
                continue
            if digest in found:
                return {k: row[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")}
        return None

    @staticmethod
    def _row_pairs(row: Any) -> list[tuple[str, bytes]]:
        pairs = [(t.decode(), v) for _, t, v in row["channel_values"] or ()]
        pairs += [(w[2].decode(), w[3]) for w in row["pending_writes"] or ()]
        return pairs

    def _load_tuple(
        self,
        value: Any,
        local: Mapping[bytes, bytes] | None = None,
        legacy_sends: list[tuple[str, bytes]] | None = None,
    ) -> CheckpointTuple:
        where = {
            "thread_id": value["thread_id"],
            "checkpoint_ns": value["checkpoint_ns"],
            "checkpoint_id": value["checkpoint_id"],
        }
        if _sealing.SEALED_METADATA_KEY in (value["metadata"] or ()):
            value["metadata"] = _sealing.open_metadata(
                _sealing.keyring_of(self.serde), value["metadata"],
                thread_id=value["thread_id"], checkpoint_id=value["checkpoint_id"],
            )
        stored, stored_md = value["checkpoint"], value["metadata"]
        problem = _values.checkpoint_problem(stored, stored_md)
        if problem is not None:
            # LangGraph would fail on this later, inside PregelLoop.__enter__ where no
            # exit handler runs: refuse it here, as a load error (fail closed).
            raise CheckpointLoadError(
                f"checkpoint {value['checkpoint_id']!r} of thread {value['thread_id']!r} is "
                f"malformed: {problem}",
                **where,
            )
        blobs, writes = self._decode_row(value, where, local, legacy_sends)
        checkpoint = cast(
            Checkpoint,
            {
                **value["checkpoint"],
                "channel_values": {**(value["checkpoint"].get("channel_values") or {}), **blobs},
            },
        )
        if legacy_sends:
            versions = dict(stored["channel_versions"])
            versions[TASKS] = (
                max(versions.values())
                if versions
                else BasePostgresSaver.get_next_version(cast(BasePostgresSaver, self), None, None)
            )
            checkpoint["channel_versions"] = versions
        _advance_id_clock(value["checkpoint_id"])
        return CheckpointTuple(
            {"configurable": {k: where[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")}},
            checkpoint,
            value["metadata"],
            (
                {
                    "configurable": {
                        "thread_id": value["thread_id"],
                        "checkpoint_ns": value["checkpoint_ns"],
                        "checkpoint_id": value["parent_checkpoint_id"],
                    }
                }
                if value["parent_checkpoint_id"]
                else None
            ),
            writes,
        )

    def _get_tuple_stmt(self, config: RunnableConfig) -> Stmt:
        """The statement reading the checkpoint ``get_tuple`` returns (the stock SQL):
        sent alone, or after the lease acquisition in a run start's one pipeline."""
        thread_id = str(config["configurable"]["thread_id"])
        checkpoint_id = get_checkpoint_id(config)
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        _values.check_ids(thread_id, checkpoint_ns, checkpoint_id)
        if checkpoint_id:
            args: tuple[Any, ...] = (thread_id, checkpoint_ns, checkpoint_id)
            where = "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
        else:
            args = (thread_id, checkpoint_ns)
            where = "WHERE thread_id = %s AND checkpoint_ns = %s ORDER BY checkpoint_id DESC LIMIT 1"
        return Stmt(SELECT_SQL + where, args, fetch=True)

    def _op_get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]:
        rows = yield Batch([self._get_tuple_stmt(config)])
        return (yield from self._op_tuple_of(rows[0]))

    def _op_tuple_of(self, rows: list[Any]) -> Op[CheckpointTuple | None]:
        """The tuple of ``_get_tuple_stmt``'s rows (artifacts fetched, values decoded):
        no statement at all when the checkpoint has no artifact and no pre-v4 sends."""
        if not rows:
            return None
        loaded = yield from self._op_load_rows(rows)
        return loaded[0]

    def _op_list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Op[list[CheckpointTuple]]:
        if config is not None:
            conf = config.get("configurable", {})
            _values.check_ids(conf.get("thread_id"), conf.get("checkpoint_ns"), conf.get("checkpoint_id"))
        ring = _sealing.keyring_of(self.serde)
        sealed = _sealing.sealed_filter_keys(ring, filter)
        if sealed:
            # Metadata keys stored sealed (issue 27): the database cannot compare them, so
            # the clear part filters in SQL and the rest here, on the decrypted metadata,
            # before any value is decoded; the limit applies to the matches.
            filter = {k: v for k, v in (filter or {}).items() if k not in sealed}
        where, args = cast(BasePostgresSaver, self)._search_where(config, filter, before)
        query = SELECT_SQL + where + " ORDER BY checkpoint_id DESC"
        params = list(args)
        if limit is not None and not sealed:
            query += " LIMIT %s"
            params.append(int(limit))
        rows = yield Batch([Stmt(query, params, fetch=True)])
        found = rows[0]
        if sealed:
            found = [r for r in found if _sealing.matches(self._opened_metadata(ring, r), sealed)]
            found = found if limit is None else found[: int(limit)]
        if not found:
            return []
        return (yield from self._op_load_rows(found))

    @staticmethod
    def _opened_metadata(ring: Any, row: Any) -> Any:
        """A row's metadata decrypted in place (``_load_tuple`` finds it opened)."""
        row["metadata"] = _sealing.open_metadata(
            ring, row["metadata"], thread_id=row["thread_id"], checkpoint_id=row["checkpoint_id"]
        )
        return row["metadata"]

    def _op_delta_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Op[Mapping[str, DeltaChannelHistory]]:
        """The stock two-stage walk (its SQL and pure helpers), with artifact
        resolution between the fetch and the decode."""
        if not channels:
            return {}
        channels = list(channels)
        thread_id = str(config["configurable"]["thread_id"])
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            target = yield from self._op_get_tuple(config)
            if target is None:
                return {ch: {"writes": []} for ch in channels}
            checkpoint_id = target.config["configurable"]["checkpoint_id"]
        chain_by_ch, seed_ver, seed_inline = yield from self._op_delta_stage1(
            thread_id, checkpoint_ns, checkpoint_id, channels
        )
        with_chain = [ch for ch in channels if chain_by_ch[ch]]
        with_seed = [ch for ch in channels if seed_ver[ch] is not None]
        stage2_sql = _build_delta_stage2_sql(channels_with_chain=with_chain, channels_with_seed=with_seed)
        stage2: list[Any] = []
        if stage2_sql:
            params = []
            for ch in with_chain:
                params.extend([thread_id, checkpoint_ns, ch, chain_by_ch[ch]])
            for ch in with_seed:
                params.extend([thread_id, checkpoint_ns, ch, seed_ver[ch]])
            rows = yield Batch([Stmt(stage2_sql, params, fetch=True)])
            stage2 = rows[0]
        where = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
        pairs = [(r["type"], r["blob"]) for r in stage2 if r["type"] and r["blob"] is not None]
        local: dict[bytes, bytes] | None = None
        if any(self.codec.is_ref(t) for t, _ in pairs):
            try:
                local = yield from self._op_resolve(pairs, where)
            except DecryptionError as exc:
                raise _load_error(where, "a stored value", exc) from exc
            except (DurableError, psycopg.Error):
                raise
            except Exception as exc:  # an envelope that does not parse
                raise _load_error(where, "an artifact envelope", exc) from exc
        # The stock helper only reads ``self.serde``: give it one that resolves refs.
        shim = SimpleNamespace(serde=_ResolvingSerde(self, where, local))
        return BasePostgresSaver._build_delta_channels_writes_history(
            cast(Any, shim),
            channels=channels,
            chain_by_ch=chain_by_ch,
            seed_ver_by_ch=seed_ver,
            seed_inline_by_ch=seed_inline,
            stage2_rows=cast("list[_DeltaStage2Row]", stage2),
        )

    def _op_delta_stage1(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, channels: list[str]
    ) -> Op[tuple[dict[str, list[str]], dict[str, str | None], dict[str, Any]]]:
        """Stage 1 of the delta walk: page back through the ancestors (the stock SQL and
        walk helpers) until every channel is seeded. Returns (chain, seed version, seed
        inline value) by channel, for stage 2."""
        stage1_sql = _build_delta_stage1_sql(channels, paged=True, include_cursor=True)
        parent_of: dict[str, str | None] = {}
        ver: list[dict[str, str | None]] = [{} for _ in channels]
        hb: list[dict[str, bool]] = [{} for _ in channels]
        inline: list[dict[str, Any]] = [{} for _ in channels]
        chain_by_ch: dict[str, list[str]] = {ch: [] for ch in channels}
        seed_ver: dict[str, str | None] = {ch: None for ch in channels}
        seed_inline: dict[str, Any] = {}
        cursors: dict[str, str | None] = {}
        seeded: set[str] = set()
        cursor: str | None = checkpoint_id
        while True:
            params: list[Any] = []
            for ch in channels:
                params.extend([ch, ch, ch, ch])
            params.extend([thread_id, checkpoint_ns, cursor, _DELTA_PAGE_SIZE])
            rows = yield Batch([Stmt(stage1_sql, params, fetch=True)])
            page = rows[0]
            if not page:
                break
            stock = cast(BasePostgresSaver, self)
            oldest = stock._ingest_stage1_page(page, channels, parent_of, ver, hb, inline)
            stock._try_advance_walks(
                checkpoint_id, channels, parent_of, ver, hb, inline, chain_by_ch,
                seed_ver, seed_inline, cursors, seeded,
            )
            if len(seeded) == len(channels) or len(page) < _DELTA_PAGE_SIZE:
                break
            cursor = oldest
            stage1_sql = _build_delta_stage1_sql(channels, paged=True)
        return chain_by_ch, seed_ver, seed_inline

    def _decode_row(
        self,
        value: Any,
        where: Mapping[str, Any],
        local: Mapping[bytes, bytes] | None,
        legacy_sends: list[tuple[str, bytes]] | None,
    ) -> tuple[dict[str, Any], list[tuple[str, str, Any]]]:
        """A row's blob values and pending writes, decoded (``_load_tuple``'s middle)."""
        try:
            blobs = {
                k.decode(): self._decode(t.decode(), v, where, local)
                for k, t, v in value["channel_values"] or ()
                if t.decode() != "empty"
            }
            if legacy_sends:
                # _migrate_pending_sends: the parent's sends become this checkpoint's
                # TASKS channel, at the highest version it has (or the first version).
                blobs[TASKS] = [self._decode(t, v, where, local) for t, v in legacy_sends]
            writes = [
                (tid.decode(), ch.decode(), self._decode(t.decode(), v, where, local))
                for tid, ch, t, v, _, _ in sorted(
                    value["pending_writes"] or (),
                    key=lambda w: writes_sort_key(w[4].decode(), w[0].decode(), int(w[5])),
                )
            ]
        except DecryptionError as exc:
            raise _load_error(where, "a stored value", exc) from exc
        except DurableError:
            raise
        except Exception as exc:
            raise _load_error(where, "a blob or pending write", exc) from exc
        return blobs, writes
