"""``journaled(model)``: a re-executed node reads its recorded model answers.

A node killed after its model call but before its checkpoint runs again from its first
line on resume, and calls the model again: it pays twice and may decide differently
than the run that crashed. ``journaled`` wraps a chat model (or any ``Runnable``) so
that each call's result is recorded in the ``@idempotent`` ledger (``durable_ledger``)
under the task's position, and a re-execution of the same task replays it.

The record uses the ledger's protocol unchanged (claim, call, record; see
``idempotency``) with journal-specific choices:

- the key is ``llm:`` + a hash of (thread, checkpoint namespace, task id, the input's
  fingerprint, n) where n counts the calls *with that input* in this execution of the
  task. Including the input makes the journal insensitive to the order of calls with
  different inputs (``asyncio.gather``, fallbacks, branches) and means a changed prompt
  is a new call, never a conflict that blocks the thread;
- a dead claim (the process died during the model call) is taken over and the model
  called again (``on_unknown="retry"``): a model call has no effect but its cost;
- a failed call records nothing and gives its position back, so a retry of the same
  call takes the same key and a resume replays the retry's answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping
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

from langgraph_durable.errors import ConfigurationError, NoLedgerError, SerializationError
from langgraph_durable.idempotency import (
    _PARENT,
    _RENEWER,
    _adrive,
    _Call,
    _canonical,
    _current_site,
    _digest,
    _drive,
    _dumps,
    _Invoke,
    _Op,
    _Parent,
    _protocol,
    _resolve_ledger,
    _seconds,
    _Site,
    _Spec,
    _stable_task,
    _Wait,
)
from langgraph_durable.saver import _DurableBase

KEY_PREFIX = "llm:"
DEFAULT_WAIT_TIMEOUT = 300.0  # a reasoning model may answer after minutes
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


class JournaledRunnable(Runnable[Any, Any]):
    """A ``Runnable`` whose calls inside a durable graph run are recorded in the ledger
    and replayed when the same task runs again (a resume after a crash, a ``RetryPolicy``
    retry). Build it with :func:`journaled`.

    Methods of the wrapped model that return a ``Runnable`` (``bind_tools``,
    ``with_structured_output``, provider-specific ones) return a journaled one; other
    attributes are the wrapped model's."""

    def __init__(
        self,
        bound: Runnable[Any, Any],
        *,
        name: str | None = None,
        ledger: Any = None,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        claim_ttl: float | None = None,
    ) -> None:
        self.bound = bound
        self.journal_name = name or bound.get_name()
        self._options: dict[str, Any] = {
            "name": name,
            "ledger": ledger,
            "wait_timeout": wait_timeout,
            "claim_ttl": claim_ttl,
        }
        self._spec = _Spec(
            fn=bound.invoke,
            name=self.journal_name,
            key=None,
            ttl=None,
            on_unknown="retry",
            cache_failures=(),
            transactional=False,
            wait_timeout=wait_timeout,
            claim_ttl=claim_ttl,
            exclude=frozenset(),
            ledger=ledger,
            is_async=False,
            signature=None,
            public=None,
            takes_key=False,
        )

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
        if name.startswith("__") or name in ("bound", "_options", "_spec", "journal_name"):
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
        if self._spec.ledger is None and site.checkpointer is None:
            return None  # a graph without a checkpointer cannot be resumed
        if self._spec.ledger is None and not isinstance(site.checkpointer, _DurableBase):
            raise NoLedgerError(
                f"journaled {self.journal_name!r} has no ledger: the running graph's "
                f"checkpointer is a {type(site.checkpointer).__name__}. Compile the graph "
                "with a DurablePostgresSaver / AsyncDurablePostgresSaver, or pass "
                "journaled(model, ledger=saver).",
                thread_id=site.thread_id,
                checkpoint_id=site.checkpoint_id,
            )
        return _resolve_ledger(self._spec, site)

    def _prepare(
        self,
        input: Any,
        kwargs: Mapping[str, Any],
        mode: str,
        invoke: Callable[[_Call], Callable[[Any], Any]] | None,
    ) -> tuple[_Call, tuple[Any, tuple[int, str], int] | None] | None:
        """The ledger call for this model call, or None to call through (no task, a
        graph without checkpointer, ``durability="exit"``: nothing could be resumed)."""
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
        await_checkpoint = None
        state = None
        ttl: float | None = None
        if parent is not None:
            # Inside an @idempotent call (or a journaled chain): keyed under it, so a
            # replayed outer call, which does not run, shifts nothing.
            key = KEY_PREFIX + _digest("journal-nested", parent.key, str(parent.counter()), fingerprint)
            thread_id, ttl = parent.thread_id, parent.ttl
        else:
            state, await_checkpoint = _stable_task(site, ledger)
            taken = _take_slot(site, fingerprint)
            key = KEY_PREFIX + _digest(
                "journal", site.thread_id or "", site.checkpoint_ns, site.task_id, fingerprint, str(taken[2])
            )
            thread_id = site.thread_id
        call = _Call(
            spec=self._spec,
            ledger=ledger,
            key=key,
            fingerprint=fingerprint,
            preview=_preview(input, canon_input),
            thread_id=thread_id,
            origin=site.thread_id,
            checkpoint_ns=site.checkpoint_ns,
            task_id=site.task_id,
            ttl=ttl,
            claim_ttl=self._spec.claim_ttl if self._spec.claim_ttl is not None else ledger.lease_ttl,
            invoke=lambda _conn: None,
            await_checkpoint=await_checkpoint,
            task_state=state,
        )
        if invoke is not None:
            call.invoke = invoke(call)
        return call, taken

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        def factory(call: _Call) -> Callable[[Any], Any]:
            def run(_conn: Any) -> Any:
                return _serializable(call, self.bound.invoke(input, config, **kwargs))

            return run

        prepared = self._prepare(input, kwargs, "invoke", factory)
        if prepared is None:
            return self.bound.invoke(input, config, **kwargs)
        call, taken = prepared
        try:
            return _drive(call, _protocol(call))
        except Exception:
            _give_back(taken)
            raise

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        def factory(call: _Call) -> Callable[[Any], Any]:
            async def run(_conn: Any) -> Any:
                return _serializable(call, await self.bound.ainvoke(input, config, **kwargs))

            return run

        prepared = self._prepare(input, kwargs, "invoke", factory)
        if prepared is None:
            return await self.bound.ainvoke(input, config, **kwargs)
        call, taken = prepared
        try:
            return await _adrive(call, _protocol(call))
        except Exception:
            _give_back(taken)
            raise

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        prepared = self._prepare(input, kwargs, "stream", None)
        if prepared is None:
            yield from self.bound.stream(input, config, **kwargs)
            return
        call, taken = prepared
        gen = _protocol(call)
        send: Any = None
        throw: BaseException | None = None
        ran = False
        try:
            while True:
                try:
                    cmd = gen.throw(throw) if throw is not None else gen.send(send)
                except StopIteration as stop:
                    value = stop.value
                    break
                send, throw = None, None
                try:
                    if isinstance(cmd, _Op):
                        send = call.ledger.run_op(cmd.factory)
                    elif isinstance(cmd, _Wait):
                        time.sleep(cmd.seconds)
                    else:
                        assert isinstance(cmd, _Invoke)
                        ran = True
                        chunks: list[Any] = []
                        inner = _under(call, self.bound.stream(input, config, **kwargs))
                        _RENEWER.add(call)
                        try:
                            for chunk in inner:
                                chunks.append(chunk)
                                try:
                                    yield chunk
                                except GeneratorExit:
                                    # The consumer stopped early: record what it saw,
                                    # so a re-execution sees the same (see _assemble).
                                    break
                        finally:
                            _RENEWER.remove(call)
                            inner.close()
                        send = _serializable(call, _assemble(chunks))
                except BaseException as exc:
                    throw = exc
        except Exception:
            _give_back(taken)
            raise
        if not ran:
            yield from _replayed_chunks(value)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        prepared = self._prepare(input, kwargs, "stream", None)
        if prepared is None:
            async for chunk in self.bound.astream(input, config, **kwargs):
                yield chunk
            return
        call, taken = prepared
        gen = _protocol(call)
        send: Any = None
        throw: BaseException | None = None
        ran = False
        try:
            while True:
                try:
                    cmd = gen.throw(throw) if throw is not None else gen.send(send)
                except StopIteration as stop:
                    value = stop.value
                    break
                send, throw = None, None
                try:
                    if isinstance(cmd, _Op):
                        send = await call.ledger.arun_op(cmd.factory)
                    elif isinstance(cmd, _Wait):
                        await asyncio.sleep(cmd.seconds)
                    else:
                        assert isinstance(cmd, _Invoke)
                        ran = True
                        chunks: list[Any] = []
                        ainner = _aunder(call, self.bound.astream(input, config, **kwargs))
                        _RENEWER.add(call)
                        try:
                            async for chunk in ainner:
                                chunks.append(chunk)
                                try:
                                    yield chunk
                                except GeneratorExit:
                                    break
                        finally:
                            _RENEWER.remove(call)
                            await ainner.aclose()
                        send = _serializable(call, _assemble(chunks))
                except BaseException as exc:
                    throw = exc
        except Exception:
            _give_back(taken)
            raise
        if not ran:
            for chunk in _replayed_chunks(value):
                yield chunk


def _serializable(call: _Call, result: Any) -> Any:
    """Refuse a result the saver's serializer cannot store while the claim is still
    ours: the protocol then drops the claim (a model call may run again) instead of
    marking the position failed for good, as it does for an effect."""
    try:
        call.serde.dumps_typed(result)
    except Exception as exc:
        raise SerializationError(
            f"the result of journaled {call.spec.name!r} (a {type(result).__qualname__}) "
            f"cannot be serialized by the saver's serializer: {exc}",
            value_type=type(result).__qualname__,
            key=call.key,
            thread_id=call.thread_id,
        ) from exc
    return result


def _parent_of(call: _Call) -> _Parent:
    outer = _PARENT.get()
    chain = (outer.chain if outer is not None else frozenset()) | {call.key}
    return _Parent(call.key, call.thread_id, call.origin, call.ttl, chain=chain)


def _under(call: _Call, it: Iterator[Any]) -> Generator[Any, None, None]:
    """Iterate ``it`` with ``call`` as the enclosing call only while its code runs (the
    context variable must not leak to the consumer between chunks)."""
    parent = _parent_of(call)
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


async def _aunder(call: _Call, it: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    parent = _parent_of(call)
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


def journaled(
    runnable: Runnable[Any, Any],
    *,
    name: str | None = None,
    ledger: Any = None,
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    claim_ttl: float | None = None,
) -> Runnable[Any, Any]:
    """Record the calls of a chat model (or any ``Runnable``) so a re-executed task
    replays them: ``model = journaled(ChatOpenAI(...))``.

    Inside a run of a graph compiled with a durable saver, ``invoke`` / ``ainvoke`` /
    ``batch`` / ``stream`` / ``astream`` record each call's result (a stream: the sum of
    its chunks) in the ledger; the same task running again (a resume after a crash, a
    ``RetryPolicy`` retry) gets the recorded result without calling the model. A fork
    (time travel, ``update_state``, ``copy_thread``) runs new tasks and calls the model
    anew. Outside a graph task, in a graph without checkpointer and under
    ``durability="exit"`` it calls straight through. See docs/journal.md.

    ``name``: the call's name in its fingerprint and in the ledger (default: the
    runnable's name); ``ledger``: a saver used instead of the running graph's;
    ``wait_timeout``: how long a call waits for the same call in flight elsewhere;
    ``claim_ttl``: the claim lease (default: the saver's ``lease_ttl``).
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
    wait = _seconds(wait_timeout, "wait_timeout")
    claim = _seconds(claim_ttl, "claim_ttl")
    if claim is not None and claim <= 0.5:
        raise ConfigurationError("claim_ttl must be above 0.5 s")
    options = {
        "name": name,
        "ledger": ledger,
        "wait_timeout": DEFAULT_WAIT_TIMEOUT if wait is None else wait,
        "claim_ttl": claim,
    }
    return _journal_model_part(runnable, lambda r: JournaledRunnable(r, **options))



__all__ = ["JournaledRunnable", "journaled"]
