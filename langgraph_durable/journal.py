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
  the first record wins and both return it;
- a node attempt that *raised* rejected what it got: before the next attempt (a
  ``RetryPolicy`` retry, or a resume of a run that ended with the task's error) looks
  anything up, the task's records are superseded (deleted), except those recorded before
  a durable effect of the task (an ``@idempotent`` or tool call), which may depend on
  them. A crash (no exception) is not a rejection: its records are replayed;
- only a stream that ran to its end is recorded: one its consumer stopped (``break``,
  ``close()``, an exception while consuming) did not complete and records nothing.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
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

from langgraph_durable import _sealing
from langgraph_durable._io import AfterCommit, Batch, Flow, Hook, Op, Stmt, Tx
from langgraph_durable.core.base import _DurableBase
from langgraph_durable.errors import (
    ConfigurationError,
    DurableError,
    NoLedgerError,
    SerializationError,
)
from langgraph_durable.idempotency.call import aready
from langgraph_durable.idempotency.keys import (
    _PARENT,
    _canonical,
    _current_site,
    _digest,
    _dumps,
    _Parent,
    _Site,
)
from langgraph_durable.idempotency.protocol import ASYNC, SYNC, Mode, within
from langgraph_durable.leases.owners import new_owner_id
from langgraph_durable.sql.ledger import (
    JOURNAL_RECORD_SQL,
    JOURNAL_SUPERSEDE_SQL,
    JOURNAL_TASK_FAILED_SQL,
    LEDGER_READ_ANY_SQL,
    LEDGER_READ_SQL,
)

logger = logging.getLogger("langgraph_durable.journal")

KEY_PREFIX = "llm:"
_PREVIEW_CHARS = 500
# A stream whose chunks cannot be added up is recorded as the list of its chunks.
_CHUNKS = "$journal_chunks"


@dataclass
class _Execution:
    """This run's execution of one task, kept through its ``RetryPolicy`` attempts."""

    uid: str = field(default_factory=lambda: secrets.token_hex(8))
    # Calls by input: {(node attempt, fingerprint): n}. Attempts count from 0 each, so a
    # retry takes the keys of the attempt before it.
    counts: dict[tuple[int, str], int] = field(default_factory=dict)
    # Whether a lookup of this execution checked the task's last run for a failure.
    failed_run_checked: bool = False
    # The latest attempt whose lookups saw the records of the attempts before it
    # superseded: a later attempt (the one before it raised) supersedes first.
    settled_attempt: int = 1


# One per task execution. The anchor is the one idempotency uses (the task's read
# function, one per task per run, kept through RetryPolicy retries), so a resume (a new
# run) starts a new execution: it counts from 0 again and checks for a failed run.
_EXECUTIONS: weakref.WeakKeyDictionary[Any, _Execution] = weakref.WeakKeyDictionary()
_EXECUTIONS_LOCK = threading.Lock()


def _execution(site: _Site) -> _Execution:
    with _EXECUTIONS_LOCK:
        found = _EXECUTIONS.get(site.anchor)
        if found is None:
            found = _EXECUTIONS[site.anchor] = _Execution()
        return found


def _take_slot(site: _Site, fingerprint: str) -> tuple[Any, tuple[int, str], int]:
    execution = _execution(site)
    with _EXECUTIONS_LOCK:
        slot = (site.attempt, fingerprint)
        n = execution.counts.get(slot, 0)
        execution.counts[slot] = n + 1
        return execution, slot, n


def _give_back(taken: tuple[Any, tuple[int, str], int] | None) -> None:
    """A failed call records nothing: free its position if no later call with the same
    input took one, so the caller's retry gets the same key (and a resume replays the
    retry's answer instead of calling the model for the first try)."""
    if taken is None:
        return
    execution, slot, n = taken
    with _EXECUTIONS_LOCK:
        if execution.counts.get(slot) == n + 1:
            execution.counts[slot] = n


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
    """What a stream that ran to its end records: the sum of its chunks (an
    ``AIMessageChunk`` for a chat model), as LangChain's own ``Runnable.transform`` adds
    them up; the list of the chunks if they cannot be added."""
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


@dataclass(frozen=True)
class _Guard:
    """What a lookup must settle first about earlier attempts of its task that raised.

    An attempt that raised rejected what it got (an answer a parser refused, a tool
    call that failed validation...): if the next attempt replayed it, it would fail
    the same way for ever. Two signs that an earlier attempt raised: this attempt is a
    ``RetryPolicy`` retry (``supersede``), or the task's last run ended with its
    ``__error__`` write (``check_failed_run``, asked once per execution). Either way
    the task's records are superseded before this lookup, in its transaction."""

    execution: _Execution
    attempt: int
    thread_id: str
    graph_ns: str  # the namespace of the graph that runs the task (its writes' ns)
    checkpoint_id: str
    task_id: str
    supersede: bool
    check_failed_run: bool

    @property
    def tag(self) -> str:
        """Ends the owner of every record this attempt makes (spared by supersede)."""
        return f"{self.execution.uid}.{self.attempt}"

    def statement(self) -> Stmt | None:
        if self.supersede:
            return self.supersede_stmt()
        if self.check_failed_run:
            params = {
                "thread_id": self.thread_id,
                "graph_ns": self.graph_ns,
                "checkpoint_id": self.checkpoint_id,
                "task_id": self.task_id,
            }
            return Stmt(JOURNAL_TASK_FAILED_SQL, params, fetch=True, name="failed")
        return None

    def supersede_stmt(self) -> Stmt:
        params = {"thread_id": self.thread_id, "task_id": self.task_id, "mine": "%#" + self.tag}
        return Stmt(JOURNAL_SUPERSEDE_SQL, params, fetch=True, name="superseded")

    def settled(self, name: str, outcome: Mapping[str, Any] | None) -> None:
        """Once committed: later lookups of this attempt need not check again."""
        with _EXECUTIONS_LOCK:
            self.execution.failed_run_checked = True
            self.execution.settled_attempt = max(self.execution.settled_attempt, self.attempt)
        if outcome is not None:
            _log_superseded(name, self, outcome)


def _log_superseded(name: str, guard: _Guard, outcome: Mapping[str, Any]) -> None:
    why = f"attempt {guard.attempt - 1} raised" if guard.supersede else "its last run raised"
    superseded, kept = int(outcome["superseded"]), int(outcome["kept"])
    if superseded:
        logger.info(
            "journaled %s: task %s of thread %s %s; %d recorded answer(s) superseded, "
            "the model is asked again", name, guard.task_id, guard.thread_id, why, superseded,
        )
    if kept:
        logger.warning(
            "journaled %s: task %s of thread %s %s, but %d answer(s) it got are kept and "
            "replayed: they were recorded before %r (ledger key %r) ran, which may depend "
            "on them. If the node rejects one of them it fails again: validate a model's "
            "answer before acting on it (docs/journal.md)",
            name, guard.task_id, guard.thread_id, why, kept, outcome["pin_name"], outcome["pin_key"],
        )


def _guard(site: _Site) -> _Guard | None:
    if not site.thread_id or not site.checkpoint_id:
        return None
    try:
        execution = _execution(site)
    except TypeError:  # an anchor we cannot track (unknown runtime): no attempts to tell
        return None
    with _EXECUTIONS_LOCK:
        supersede = site.attempt > execution.settled_attempt
        check = not execution.failed_run_checked
    return _Guard(
        execution=execution,
        attempt=site.attempt,
        thread_id=site.thread_id,
        graph_ns=site.checkpoint_ns.rpartition("|")[0],
        checkpoint_id=site.checkpoint_id,
        task_id=site.task_id,
        supersede=supersede,
        check_failed_run=check,
    )


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
    guard: _Guard | None = None
    owner: str = ""
    legacy_keys: tuple[str, ...] = ()  # the record's keys under older fingerprint forms

    def __post_init__(self) -> None:
        self.owner = new_owner_id()
        if self.guard is not None:
            self.owner += "#" + self.guard.tag

    def params(self, result_type: str, result: bytes) -> dict[str, Any]:
        return {
            "key": self.key,
            "thread_id": self.thread_id,
            "origin": self.origin,
            "ns": self.checkpoint_ns,
            "task_id": self.task_id,
            "name": self.name,
            "fp": self.fingerprint,
            "preview": _sealing.seal_text(_sealing.keyring_of(self.ledger.serde), self.preview),
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
        wrong_key = _sealing.decrypt_failure(
            entry.ledger.serde, str(row["result_type"]), exc, thread_id=entry.thread_id or entry.origin,
            where=f"the recorded answer of journaled {entry.name!r} (key {entry.key!r})",
        )
        if wrong_key is not None:
            raise wrong_key from exc
        raise SerializationError(
            f"the recorded result of journaled {entry.name!r} (key {entry.key!r}, thread "
            f"{entry.thread_id!r}) cannot be decoded: {type(exc).__name__}: {exc}; "
            "Ledger(saver).forget(key) drops it so the model is called again",
            value_type=str(row["result_type"]),
            key=entry.key,
            thread_id=entry.thread_id,
        ) from exc


def _op_lookup(entry: _Entry) -> Op[tuple[bool, Any]]:
    """(True, the recorded value) when this call is recorded, else (False, None). The
    records of earlier attempts that raised are superseded first, in the same
    transaction (``_Guard``); no extra round trip unless there is something to supersede."""
    guard = entry.guard
    read = Stmt(LEDGER_READ_SQL, (entry.key,), fetch=True, name="row")
    legacy = [Stmt(LEDGER_READ_ANY_SQL, (list(entry.legacy_keys),), fetch=True, name="legacy")] if entry.legacy_keys else []
    first = guard.statement() if guard is not None else None
    rows = yield Batch([read, *legacy] if first is None else [first, read, *legacy])
    if guard is not None and first is not None:
        superseding = first.name == "superseded"
        if not superseding and rows["failed"][0]["failed"]:
            rows = yield Batch([guard.supersede_stmt(), read, *legacy])
            superseding = True
        outcome = rows["superseded"][0] if superseding else None
        yield AfterCommit(lambda: guard.settled(entry.name, outcome))
    found = list(rows["row"])
    if legacy:
        order = {k: i for i, k in enumerate(entry.legacy_keys)}
        found += sorted(rows["legacy"], key=lambda r: order.get(r["key"], len(order)))
    for row in found:
        if row["status"] == "completed" and not row["expired"]:
            return True, _decode(entry, row)
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
        plain = hashlib.sha256(_dumps({"name": self.journal_name, "args": canon})).hexdigest()
        fingerprint = _sealing.keyed_fingerprint(_sealing.digest_secret(ledger), plain)
        # The keys this record had under the fingerprint forms before the stored digest
        # secret (digest27): looked up too, in the same round trip, so a call recorded
        # before it replays instead of running again.
        legacy = _sealing.legacy_fingerprints(serde, plain, fingerprint)
        parent = _PARENT.get()
        taken: tuple[Any, tuple[int, str], int] | None = None
        ttl: float | None = None
        if parent is not None:
            # Inside an @idempotent call (or a journaled chain): keyed under it, so a
            # replayed outer call, which does not run, shifts nothing.
            n = str(parent.counter())
            key = KEY_PREFIX + _digest("journal-nested", parent.key, n, fingerprint)
            legacy_keys = tuple(KEY_PREFIX + _digest("journal-nested", parent.key, n, fp) for fp in legacy)
            thread_id, ttl = parent.thread_id, parent.ttl
        else:
            taken = _take_slot(site, fingerprint)
            parts = ("journal", site.thread_id or "", site.checkpoint_ns, site.task_id)
            key = KEY_PREFIX + _digest(*parts, fingerprint, str(taken[2]))
            legacy_keys = tuple(KEY_PREFIX + _digest(*parts, fp, str(taken[2])) for fp in legacy)
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
            guard=_guard(site),
            legacy_keys=legacy_keys,
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

    async def _aready(self) -> None:
        """The ledger's digest secret read before the fingerprint (digest27): an async
        saver cannot wait for it on its own loop. Nothing once it is read."""
        site = _current_site()
        if site is None or site.durability == "exit":
            return
        try:
            ledger = self._ledger(site)
        except DurableError:
            return  # raised again, as before, by _prepare
        await aready(ledger=ledger)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        await self._aready()
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
            SYNC.before_effect()
            found, value = entry.ledger.run_op(lambda: _op_lookup(entry))
        except Exception:
            _give_back(entry.taken)
            raise
        if found:
            yield from _replayed_chunks(value)
            return
        chunks: list[Any] = []
        inner = _under(entry, self.bound.stream(input, config, **kwargs))
        try:
            for chunk in inner:
                chunks.append(chunk)
                # GeneratorExit here (the consumer's break, close() or exception: they
                # cannot be told apart) leaves: the call did not complete, so nothing is
                # recorded and a re-execution calls the model again. The position stays
                # taken: the calls after this one keep their keys.
                yield chunk
            entry.ledger.run_op(lambda: _op_store(entry, _assemble(chunks)))
        except Exception:
            _give_back(entry.taken)
            raise
        finally:
            inner.close()

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        await self._aready()
        entry = self._prepare(input, kwargs, "stream")
        if entry is None:
            async for chunk in self.bound.astream(input, config, **kwargs):
                yield chunk
            return
        try:
            await ASYNC.before_effect()
            found, value = await entry.ledger.arun_op(lambda: _op_lookup(entry))
        except Exception:
            _give_back(entry.taken)
            raise
        if found:
            for chunk in _replayed_chunks(value):
                yield chunk
            return
        chunks: list[Any] = []
        ainner = _aunder(entry, self.bound.astream(input, config, **kwargs))
        try:
            async for chunk in ainner:
                chunks.append(chunk)
                yield chunk  # GeneratorExit: not recorded, as in stream()
            await entry.ledger.arun_op(lambda: _op_store(entry, _assemble(chunks)))
        except Exception:
            _give_back(entry.taken)
            raise
        finally:
            await ainner.aclose()


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
