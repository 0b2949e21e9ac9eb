"""``journaled(model)``: a re-executed node reads its recorded model answers.

A node killed after its model call but before its checkpoint runs again from its first
line on resume, and calls the model again: it pays twice and may decide differently
than the run that crashed. ``journaled`` wraps a chat model (or any ``Runnable``) so
that each call's result is recorded in the ``@idempotent`` ledger (``durable_ledger``)
under the task's position, and a re-execution of the same task replays it.

A model call is not a side effect, so the journal needs less than ``@idempotent``'s
protocol (claim, call, record): it reads the key, calls the model if nothing is
recorded, and records the result (``status = 'completed'`` at once). No claim means no
claim lease to wait out when a process died during the call (the resume simply calls
the model again) and no wait for the task's checkpoint before the call: a record made
under a task id that a crash discarded is never looked up again, and goes with its
thread. The choices specific to the journal:

- the key is ``llm:`` + a hash of (thread, checkpoint namespace, task id, the input's
  fingerprint, n) where n counts the calls *with that input* in this execution of the
  task. Including the input makes the journal insensitive to the order of calls with
  different inputs (``asyncio.gather``, fallbacks, branches) and means a changed prompt
  is a new call, never a conflict that blocks the thread;
- a failed call records nothing and gives its position back, so a retry of the same
  call takes the same key and a resume replays the retry's answer;
- when two executions record the same key (only if two processes ran the same task),
  the first record wins and both return it.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseLanguageModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import (
    Runnable,
    RunnableBinding,
    RunnableConfig,
    RunnableParallel,
    RunnableSequence,
)

from langgraph_durable._io import Batch, Flow, Hook, Op, Stmt, Tx
from langgraph_durable.core.base import _DurableBase
from langgraph_durable.errors import ConfigurationError, NoLedgerError, SerializationError
from langgraph_durable.idempotency.keys import (
    _PARENT,
    _canonical,
    _current_site,
    _digest,
    _dumps,
    _Parent,
    _Site,
)
from langgraph_durable.idempotency.protocol import ASYNC, SYNC, Mode, _op_one, within
from langgraph_durable.leases.owners import new_owner_id
from langgraph_durable.sql.ledger import JOURNAL_RECORD_SQL, LEDGER_READ_SQL

KEY_PREFIX = "llm:"
_PREVIEW_CHARS = 500
# A stream whose chunks cannot be added up is recorded as the list of its chunks.
_CHUNKS = "$journal_chunks"

# Per-execution counts of calls by input: {anchor: {(node attempt, fingerprint): n}}.
# The anchor is the one idempotency uses (the task's read function, one per task per
# run, kept through RetryPolicy retries), so a resume (a new run) counts from 0 again.
_COUNTS: weakref.WeakKeyDictionary[Any, dict[tuple[int, str], int]] = weakref.WeakKeyDictionary()
_COUNTS_LOCK = threading.Lock()

def _take_slot(site: _Site, fingerprint: str) -> tuple[Any, tuple[int, str], int]:
    with _COUNTS_LOCK:
        counts = _COUNTS.get(site.anchor)
        if counts is None:
            counts = _COUNTS[site.anchor] = {}
        slot = (site.attempt, fingerprint)
        n = counts.get(slot, 0)
        counts[slot] = n + 1
        return site.anchor, slot, n


def _give_back(taken: tuple[Any, tuple[int, str], int] | None) -> None:
    """A failed call records nothing: free its position if no later call with the same
    input took one, so the caller's retry gets the same key (and a resume replays the
    retry's answer instead of calling the model for the first try)."""
    if taken is None:
        return
    anchor, slot, n = taken
    with _COUNTS_LOCK:
        counts = _COUNTS.get(anchor)
        if counts is not None and counts.get(slot) == n + 1:
            counts[slot] = n


def _safe_canonical(value: Any, path: str, serde: Any) -> Any:
    """The canonical form, or the type's name for a value that has none (a client
    object passed as a keyword): the fingerprint then ignores that value instead of
    failing a call that works unjournaled."""
    try:
        return _canonical(value, path, serde)
    except Exception:
        return {"$opaque": type(value).__qualname__}


def _preview(value: Any, canon: Any) -> str:
    if isinstance(value, list | tuple) and value and all(isinstance(m, BaseMessage) for m in value):
        last = value[-1]
        text = f"{len(value)} messages, last {last.type}: {last.content!r}"
    else:
        text = _dumps(canon).decode()
    return text if len(text) <= _PREVIEW_CHARS else text[: _PREVIEW_CHARS - 3] + "..."


def _assemble(chunks: list[Any]) -> Any:
    """What a stream records: the sum of its chunks (an ``AIMessageChunk`` for a chat
    model), as LangChain's own ``Runnable.transform`` adds them up. A consumer that
    stopped early gets the sum of the chunks it saw: the same code re-executed stops at
    the same place, and the next call keeps its position."""
    if len(chunks) == 1 and not (isinstance(chunks[0], Mapping) and _CHUNKS in chunks[0]):
        return chunks[0]
    if chunks:
        total = chunks[0]
        try:
            for chunk in chunks[1:]:
                total = total + chunk
        except TypeError:
            pass
        else:
            return total
    return {_CHUNKS: list(chunks)}


def _replayed_chunks(value: Any) -> list[Any]:
    if isinstance(value, Mapping) and set(value) == {_CHUNKS}:
        return list(value[_CHUNKS])
    return [value]


def _is_model(runnable: Any) -> bool:
    while isinstance(runnable, RunnableBinding):
        runnable = runnable.bound
    return isinstance(runnable, BaseLanguageModel | JournaledRunnable)


def _journal_model_part(runnable: Runnable[Any, Any], make: Callable[[Runnable[Any, Any]], Runnable[Any, Any]]) -> Runnable[Any, Any]:
    """Journal what a model method returned. ``with_structured_output`` returns
    ``model.bind_tools(...) | parser`` (or ``{"raw": model} | parser`` with
    ``include_raw=True``): the model's message is recorded and re-parsed on replay, so the
    record stays a LangChain message (the parsed value may be a user's pydantic class,
    which the saver's serializer would have to be told about)."""
    if isinstance(runnable, JournaledRunnable):
        return runnable
    if isinstance(runnable, RunnableSequence):
        first = runnable.first
        if _is_model(first):
            return RunnableSequence(make(first), *runnable.middle, runnable.last, name=runnable.name)
        if isinstance(first, RunnableParallel) and any(_is_model(s) for s in first.steps__.values()):
            steps = {k: make(s) if _is_model(s) else s for k, s in first.steps__.items()}
            return RunnableSequence(RunnableParallel(steps), *runnable.middle, runnable.last, name=runnable.name)
    return make(runnable)


@dataclass
class _Entry:
    """One journaled call: where its record lives and what identifies it."""

    ledger: _DurableBase
    key: str
    name: str
    fingerprint: str
    preview: str
    thread_id: str | None  # binds the row to the thread (deleted with it)
    origin: str | None
    checkpoint_ns: str
    task_id: str
    ttl: float | None
    taken: tuple[Any, tuple[int, str], int] | None  # the position, given back on failure
    owner: str = ""

    def __post_init__(self) -> None:
        self.owner = new_owner_id()

    def params(self, result_type: str, result: bytes) -> dict[str, Any]:
        return {
            "key": self.key,
            "thread_id": self.thread_id,
            "origin": self.origin,
            "ns": self.checkpoint_ns,
            "task_id": self.task_id,
            "name": self.name,
            "fp": self.fingerprint,
            "preview": self.preview,
            "owner": self.owner,
            "result_type": result_type,
            "result": result,
            "ttl": self.ttl,
        }

    def parent(self) -> _Parent:
        """Calls made inside this one (an @idempotent function in a journaled chain) are
        keyed under it: when it replays they are not made and shift nothing."""
        outer = _PARENT.get()
        chain = (outer.chain if outer is not None else frozenset()) | {self.key}
        return _Parent(self.key, self.thread_id, self.origin, self.ttl, chain=chain)


def _op_record(entry: _Entry, result_type: str, result: bytes) -> Generator[Any, Any, list[dict[str, Any]]]:
    rows = yield Batch(
        [
            Stmt(JOURNAL_RECORD_SQL, entry.params(result_type, result)),
            Stmt(LEDGER_READ_SQL, (entry.key,), fetch=True, name="row"),
        ]
    )
    return list(rows["row"])


def _encode(entry: _Entry, result: Any) -> tuple[str, bytes]:
    try:
        return entry.ledger.serde.dumps_typed(result)
    except Exception as exc:
        raise SerializationError(
            f"the result of journaled {entry.name!r} (a {type(result).__qualname__}) cannot "
            f"be serialized by the saver's serializer: {exc}; nothing was recorded",
            value_type=type(result).__qualname__,
            key=entry.key,
            thread_id=entry.thread_id,
        ) from exc


def _decode(entry: _Entry, row: Mapping[str, Any]) -> Any:
    try:
        return entry.ledger.serde.loads_typed((row["result_type"], bytes(row["result"] or b"")))
    except Exception as exc:
        raise SerializationError(
            f"the recorded result of journaled {entry.name!r} (key {entry.key!r}, thread "
            f"{entry.thread_id!r}) cannot be decoded: {type(exc).__name__}: {exc}; "
            "Ledger(saver).forget(key) drops it so the model is called again",
            value_type=str(row["result_type"]),
            key=entry.key,
            thread_id=entry.thread_id,
        ) from exc


def _op_lookup(entry: _Entry) -> Op[tuple[bool, Any]]:
    """(True, the recorded value) when this call is recorded, else (False, None)."""
    rows = yield from _op_one(LEDGER_READ_SQL, (entry.key,))
    if rows and rows[0]["status"] == "completed" and not rows[0]["expired"]:
        return True, _decode(entry, rows[0])
    return False, None


def _op_store(entry: _Entry, result: Any) -> Op[Any]:
    """Record a live call's result; returns the decoded record, like every replay after
    it (another execution's, if it recorded first). Encodes before its first statement,
    so before the driver checks a connection out."""
    result_type, data = _encode(entry, result)
    rows = yield from _op_record(entry, result_type, data)
    row = rows[0] if rows else None
    if row is not None and row["status"] == "completed" and row["owner"] != entry.owner:
        return _decode(entry, row)  # another execution recorded first
    return entry.ledger.serde.loads_typed((result_type, data))


def _flow(entry: _Entry, call: Callable[[], Any], mode: Mode) -> Flow[Any]:
    """Read, call if nothing is recorded, record: sync or async alike (``mode``)."""
    # Store a deferred checkpoint first (checkpoint_policy): the journal key hashes
    # the task id, which only a stored checkpoint gives back on resume.
    yield Hook(mode.before_effect)
    found, value = yield Tx(lambda: _op_lookup(entry))
    if found:
        return value
    result = yield Hook(within, (lambda: _enter(entry), call))
    return (yield Tx(lambda: _op_store(entry, result)))


def _enter(entry: _Entry) -> Callable[[], None]:
    token = _PARENT.set(entry.parent())
    return lambda: _PARENT.reset(token)


def _resolve(ledger: Any) -> _DurableBase:
    found = ledger if isinstance(ledger, _DurableBase) else ledger()
    if not isinstance(found, _DurableBase):
        raise ConfigurationError(
            "ledger= must be a DurablePostgresSaver or AsyncDurablePostgresSaver (or a "
            f"callable returning one), got {type(found).__name__}"
        )
    return found


class JournaledRunnable(Runnable[Any, Any]):
    """A ``Runnable`` whose calls inside a durable graph run are recorded in the ledger
    and replayed when the same task runs again (a resume after a crash, a ``RetryPolicy``
    retry, ``Command(resume=...)``). Build it with :func:`journaled`.

    Methods of the wrapped model that return a ``Runnable`` (``bind_tools``,
    ``with_structured_output``, provider-specific ones) return a journaled one; other
    attributes are the wrapped model's."""

    def __init__(self, bound: Runnable[Any, Any], *, name: str | None = None, ledger: Any = None) -> None:
        self.bound = bound
        self.journal_name = name or bound.get_name()
        self.ledger = ledger
        self._options: dict[str, Any] = {"name": name, "ledger": ledger}

    # --- what LangChain asks of a Runnable --------------------------------------------

    def __repr__(self) -> str:
        return f"journaled({self.bound!r})"

    def get_name(self, suffix: str | None = None, *, name: str | None = None) -> str:
        return self.bound.get_name(suffix, name=name)

    @property
    def InputType(self) -> Any:
        return self.bound.InputType

    @property
    def OutputType(self) -> Any:
        return self.bound.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.bound.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.bound.get_output_schema(config)

    @property
    def config_specs(self) -> Any:
        return self.bound.config_specs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("bound", "ledger", "_options", "journal_name"):
            raise AttributeError(name)
        attr = getattr(self.bound, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def rewrap(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            if isinstance(out, Runnable) and out is not self.bound:
                return _journal_model_part(out, self._rewrap)
            return out

        rewrap.__name__ = getattr(attr, "__name__", name)
        rewrap.__doc__ = getattr(attr, "__doc__", None)
        return rewrap

    def _rewrap(self, runnable: Runnable[Any, Any]) -> JournaledRunnable:
        return JournaledRunnable(runnable, **self._options)

    # --- one call ------------------------------------------------------------------------

    def _ledger(self, site: _Site) -> _DurableBase | None:
        if self.ledger is not None:
            return _resolve(self.ledger)
        if site.checkpointer is None:
            return None  # a graph without a checkpointer cannot be resumed
        if not isinstance(site.checkpointer, _DurableBase):
            raise NoLedgerError(
                f"journaled {self.journal_name!r} has no ledger: the running graph's "
                f"checkpointer is a {type(site.checkpointer).__name__}. Compile the graph "
                "with a DurablePostgresSaver / AsyncDurablePostgresSaver, or pass "
                "journaled(model, ledger=saver).",
                thread_id=site.thread_id,
                checkpoint_id=site.checkpoint_id,
            )
        return site.checkpointer

    def _prepare(self, input: Any, kwargs: Mapping[str, Any], mode: str) -> _Entry | None:
        """The journal entry of this call, or None to call through (no task, a graph
        without checkpointer, ``durability="exit"``: nothing could be resumed)."""
        site = _current_site()
        if site is None or site.durability == "exit":
            return None
        ledger = self._ledger(site)
        if ledger is None:
            return None
        serde = ledger.serde
        canon_input = _safe_canonical(input, "input", serde)
        canon = {
            "input": canon_input,
            "kwargs": {k: _safe_canonical(v, k, serde) for k, v in sorted(kwargs.items())},
            "mode": mode,
        }
        fingerprint = hashlib.sha256(_dumps({"name": self.journal_name, "args": canon})).hexdigest()
        parent = _PARENT.get()
        taken: tuple[Any, tuple[int, str], int] | None = None
        ttl: float | None = None
        if parent is not None:
            # Inside an @idempotent call (or a journaled chain): keyed under it, so a
            # replayed outer call, which does not run, shifts nothing.
            key = KEY_PREFIX + _digest("journal-nested", parent.key, str(parent.counter()), fingerprint)
            thread_id, ttl = parent.thread_id, parent.ttl
        else:
            taken = _take_slot(site, fingerprint)
            key = KEY_PREFIX + _digest(
                "journal", site.thread_id or "", site.checkpoint_ns, site.task_id, fingerprint, str(taken[2])
            )
            thread_id = site.thread_id
        return _Entry(
            ledger=ledger,
            key=key,
            name=self.journal_name,
            fingerprint=fingerprint,
            preview=_preview(input, canon_input),
            thread_id=thread_id,
            origin=site.thread_id,
            checkpoint_ns=site.checkpoint_ns,
            task_id=site.task_id,
            ttl=ttl,
            taken=taken,
        )

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        entry = self._prepare(input, kwargs, "invoke")
        if entry is None:
            return self.bound.invoke(input, config, **kwargs)
        try:
            return SYNC.flows(entry.ledger).run_flow(
                _flow(entry, lambda: self.bound.invoke(input, config, **kwargs), SYNC)
            )
        except Exception:
            _give_back(entry.taken)
            raise

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        entry = self._prepare(input, kwargs, "invoke")
        if entry is None:
            return await self.bound.ainvoke(input, config, **kwargs)
        try:
            return await ASYNC.flows(entry.ledger).run_flow(
                _flow(entry, lambda: self.bound.ainvoke(input, config, **kwargs), ASYNC)
            )
        except Exception:
            _give_back(entry.taken)
            raise

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        entry = self._prepare(input, kwargs, "stream")
        if entry is None:
            yield from self.bound.stream(input, config, **kwargs)
            return
        try:
            found, value = entry.ledger.run_op(lambda: _op_lookup(entry))
            if not found:
                chunks: list[Any] = []
                inner = _under(entry, self.bound.stream(input, config, **kwargs))
                try:
                    for chunk in inner:
                        chunks.append(chunk)
                        try:
                            yield chunk
                        except GeneratorExit:
                            # The consumer stopped early: record what it saw, so a
                            # re-execution sees the same (see _assemble).
                            break
                finally:
                    inner.close()
                entry.ledger.run_op(lambda: _op_store(entry, _assemble(chunks)))
        except Exception:
            _give_back(entry.taken)
            raise
        if found:
            yield from _replayed_chunks(value)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        entry = self._prepare(input, kwargs, "stream")
        if entry is None:
            async for chunk in self.bound.astream(input, config, **kwargs):
                yield chunk
            return
        try:
            found, value = await entry.ledger.arun_op(lambda: _op_lookup(entry))
            if not found:
                chunks: list[Any] = []
                ainner = _aunder(entry, self.bound.astream(input, config, **kwargs))
                try:
                    async for chunk in ainner:
                        chunks.append(chunk)
                        try:
                            yield chunk
                        except GeneratorExit:
                            break
                finally:
                    await ainner.aclose()
                await entry.ledger.arun_op(lambda: _op_store(entry, _assemble(chunks)))
        except Exception:
            _give_back(entry.taken)
            raise
        if found:
            for chunk in _replayed_chunks(value):
                yield chunk


def _under(entry: _Entry, it: Iterator[Any]) -> Generator[Any, None, None]:
    """Iterate ``it`` with ``entry`` as the enclosing call only while its code runs (the
    context variable must not leak to the consumer between chunks)."""
    parent = entry.parent()
    try:
        while True:
            token = _PARENT.set(parent)
            try:
                chunk = next(it)
            except StopIteration:
                return
            finally:
                _PARENT.reset(token)
            yield chunk
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


async def _aunder(entry: _Entry, it: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    parent = entry.parent()
    ait = aiter(it)
    try:
        while True:
            token = _PARENT.set(parent)
            try:
                chunk = await anext(ait)
            except StopAsyncIteration:
                return
            finally:
                _PARENT.reset(token)
            yield chunk
    finally:
        aclose = getattr(ait, "aclose", None)
        if aclose is not None:
            await aclose()


def journaled(runnable: Runnable[Any, Any], *, name: str | None = None, ledger: Any = None) -> Runnable[Any, Any]:
    """Record the calls of a chat model (or any ``Runnable``) so a re-executed task
    replays them: ``model = journaled(ChatOpenAI(...))``.

    Inside a run of a graph compiled with a durable saver, ``invoke`` / ``ainvoke`` /
    ``batch`` / ``stream`` / ``astream`` record each call's result (a stream: the sum of
    its chunks) in the ledger; the same task running again (a resume after a crash, a
    ``RetryPolicy`` retry, ``Command(resume=...)``) gets the recorded result without
    calling the model. A fork (time travel, ``update_state``, ``copy_thread``) runs new
    tasks and calls the model anew. Outside a graph task, in a graph without
    checkpointer and under ``durability="exit"`` it calls straight through; with a
    checkpointer that is not durable it raises ``NoLedgerError``. See docs/journal.md.

    ``name``: the call's name in its fingerprint and in the ledger (default: the
    runnable's name); ``ledger``: a durable saver (or a zero-argument callable returning
    one) used instead of the running graph's checkpointer.
    """
    if not isinstance(runnable, Runnable):
        raise ConfigurationError(
            f"journaled() needs a LangChain Runnable (a chat model), got {type(runnable).__name__}"
        )
    if isinstance(runnable, JournaledRunnable):
        return runnable
    if ledger is not None and not isinstance(ledger, _DurableBase) and not callable(ledger):
        raise ConfigurationError(
            "ledger= must be a DurablePostgresSaver or AsyncDurablePostgresSaver (or a "
            f"callable returning one), got {type(ledger).__name__}"
        )
    return _journal_model_part(runnable, lambda r: JournaledRunnable(r, name=name, ledger=ledger))


__all__ = ["JournaledRunnable", "journaled"]
