"""One wrapped call: the decorator's options (``_Spec``) and a call prepared from them
(``_Call``: key, fingerprint, ledger, how to invoke the function).
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
from collections.abc import (
    Callable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, cast

from langgraph_durable import _sealing
from langgraph_durable.core.base import _DurableBase
from langgraph_durable.errors import (
    ConfigurationError,
    DurableError,
    InvalidIdempotencyKeyError,
    NoLedgerError,
    UnstableKeyError,
)
from langgraph_durable.idempotency.keys import (
    _PARENT,
    CONN_PARAM,
    KEY_PARAM,
    MAX_KEY_LENGTH,
    OnUnknown,
    _current_site,
    _digest,
    _fingerprint,
    _next_index,
    _owner,
    _Parent,
    _Site,
    _task_state,
    _TaskState,
    legacy_tool_key,
    tool_key,
)

logger = logging.getLogger("langgraph_durable.idempotency")

# --- the decorator's configuration ------------------------------------------------------


@dataclass
class _Spec:
    fn: Callable[..., Any]
    name: str
    key: Callable[..., str] | None
    ttl: float | None
    on_unknown: OnUnknown
    cache_failures: tuple[type[BaseException], ...]
    transactional: bool
    wait_timeout: float
    claim_ttl: float | None
    exclude: frozenset[str]
    ledger: Any
    is_async: bool
    signature: inspect.Signature | None  # the full signature (None for tools)
    public: inspect.Signature | None  # without conn / idempotency_key
    takes_key: bool

    def caches(self, exc: BaseException) -> bool:
        return bool(self.cache_failures) and isinstance(exc, self.cache_failures)


def _seconds(value: float | dt.timedelta | None, what: str) -> float | None:
    if value is None:
        return None
    secs = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if not isinstance(secs, int | float) or isinstance(secs, bool) or secs < 0:
        raise ConfigurationError(f"{what} must be a non-negative number of seconds, got {value!r}")
    return float(secs)


def _failures(value: bool | type[BaseException] | Sequence[type[BaseException]]) -> tuple[type[BaseException], ...]:
    if value is True:
        return (Exception,)
    if value is False or value is None:
        return ()
    if isinstance(value, type) and issubclass(value, BaseException):
        return (value,)
    if isinstance(value, Sequence) and all(
        isinstance(t, type) and issubclass(t, BaseException) for t in value
    ):
        return tuple(value)
    raise ConfigurationError(
        f"cache_failures must be a bool or exception types, got {value!r}"
    )



# --- one call ---------------------------------------------------------------------------


@dataclass
class _Call:
    spec: _Spec
    ledger: _DurableBase
    key: str
    fingerprint: str
    preview: str
    thread_id: str | None  # binds the row to the thread (deleted with it)
    origin: str | None  # the thread the call happened in
    checkpoint_ns: str | None
    task_id: str | None
    ttl: float | None
    claim_ttl: float | None
    invoke: Callable[[Any], Any]  # conn (transactional) or None -> result / awaitable
    # (thread_id, checkpoint_id) that must be stored before the key is used, and the
    # task state that remembers it is.
    await_checkpoint: tuple[str, str] | None = None
    task_state: _TaskState | None = None
    # A tool call's key under the scheme before task ids (thread + tool_call_id): used
    # instead of ``key`` when this very task recorded the call under it (an upgrade
    # in the middle of a thread), see _adopt_legacy_key.
    legacy_key: str | None = None
    # The other forms a row of this call may carry (issue 27, digest27): the unkeyed
    # fingerprint (recorded before encryption) and the key-derived keyed forms of the
    # code before the stored digest secret; a row with one of them still matches.
    legacy_fingerprints: tuple[str, ...] = ()
    owner: str = field(default_factory=_owner)
    lost: bool = False

    @property
    def serde(self) -> Any:
        return self.ledger.serde

    def params(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "thread_id": self.thread_id,
            "origin": self.origin,
            "ns": self.checkpoint_ns,
            "task_id": self.task_id,
            "name": self.spec.name,
            "fp": self.fingerprint,
            # Sealed with an encrypting serializer (issue 27): the arguments are user data.
            "preview": _sealing.seal_text(_sealing.keyring_of(self.serde), self.preview),
            "owner": self.owner,
            "claim_ttl": None if self.spec.transactional else self.claim_ttl,
            "ttl": self.ttl,
        }


def _resolve_ledger(spec: _Spec, site: _Site | None) -> _DurableBase:
    explicit = spec.ledger
    if explicit is not None:
        ledger = explicit if isinstance(explicit, _DurableBase) else explicit()
        if not isinstance(ledger, _DurableBase):
            raise ConfigurationError(
                f"ledger= must be a DurablePostgresSaver or AsyncDurablePostgresSaver "
                f"(or a callable returning one), got {type(ledger).__name__}"
            )
        return ledger
    if site is not None and isinstance(site.checkpointer, _DurableBase):
        return site.checkpointer
    raise NoLedgerError(
        f"@idempotent {spec.name!r} has no ledger: {_no_ledger_why(site)}. Compile the graph "
        "with the durable saver: `with DurablePostgresSaver.from_conn_string(DSN) as saver: "
        "graph = builder.compile(checkpointer=saver)` (AsyncDurablePostgresSaver for "
        "async), or pass @idempotent(ledger=saver)."
    )


def _no_ledger_why(site: _Site | None) -> str:
    """Why there is no ledger, in the user's terms (not "a NoneType")."""
    if site is None:
        return "it was called outside a LangGraph run"
    if site.checkpointer is None:
        return "the graph was compiled without a checkpointer (builder.compile() with no checkpointer=)"
    kind = type(site.checkpointer).__name__
    return f"the graph's checkpointer is a {kind}, which keeps no ledger of calls"


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidIdempotencyKeyError(key, "must be a str")
    if not key:
        raise InvalidIdempotencyKeyError(key, "must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidIdempotencyKeyError(key, f"longer than {MAX_KEY_LENGTH} characters")
    if "\x00" in key:
        raise InvalidIdempotencyKeyError(key, "contains a NUL character")
    return key


@dataclass
class _Key:
    """Where a call's key came from: the key, the thread it belongs to (None: it
    outlives threads), its ttl, the pre-upgrade tool key, the task it was derived from."""

    key: str
    thread_id: str | None
    ttl: float | None = None
    legacy_key: str | None = None
    state: _TaskState | None = None
    await_checkpoint: tuple[str, str] | None = None


def _derive_key(
    spec: _Spec,
    site: _Site | None,
    ledger: _DurableBase,
    parent: _Parent | None,
    key_args: tuple[tuple[Any, ...], dict[str, Any]],
    tool_call_id: str | None,
) -> _Key:
    if spec.key is not None:
        # The operation's own identity outlives the thread.
        return _Key(_check_key(spec.key(*key_args[0], **key_args[1])), None, ttl=spec.ttl)
    if tool_call_id and site is not None:
        # Providers that number calls per message send `call_0` on every turn, so the
        # tool_call_id alone does not name a call: the task that runs the calling AI
        # message does. Its resumes and retries rebuild the same task id (a replay of
        # the same message dedups), a later turn is another task (the tool runs). The
        # message's own id is not needed, so messages without one are no special case.
        state, await_checkpoint = _stable_task(site, ledger)
        key = tool_key(site.thread_id, site.checkpoint_ns, site.task_id, tool_call_id)
        legacy_key = legacy_tool_key(site.thread_id, tool_call_id)
        return _Key(key, site.thread_id, legacy_key=legacy_key, state=state, await_checkpoint=await_checkpoint)
    if tool_call_id:
        # Outside a task (a ToolCall invoked directly, ledger=): the caller owns the ids.
        return _Key(legacy_tool_key(None, tool_call_id), None)
    if parent is not None:
        key = "call:" + _digest("nested", parent.key, str(parent.counter()))
        return _Key(key, parent.thread_id, ttl=parent.ttl)
    if site is not None:
        state, await_checkpoint = _stable_task(site, ledger)
        index = _next_index(site, state)
        key = "call:" + _digest(
            "task", site.thread_id or "", site.checkpoint_ns, site.task_id, str(index)
        )
        return _Key(key, site.thread_id, state=state, await_checkpoint=await_checkpoint)
    raise InvalidIdempotencyKeyError(
        None,
        f"{spec.name!r} was called outside a LangGraph task, so no key can be derived "
        "from where it runs; give it key= or pass idempotency_key=",
    )


async def aready(spec: _Spec | None = None, ledger: Any = None) -> None:
    """From async code, before a fingerprint is computed: read the ledger's digest
    secret if its saver has not yet (an async saver cannot wait for it on its own loop;
    once read, nothing is done here). A call without a ledger fails later, as before."""
    if ledger is None and spec is not None:
        try:
            ledger = _resolve_ledger(spec, _current_site())
        except DurableError:
            return
    ensure = getattr(ledger, "_aensure_digest_secret", None)
    if ensure is not None and not ledger.codec.digest.loaded:
        await ensure()


def _build_call(
    spec: _Spec,
    args_for_fp: Mapping[str, Any],
    key_args: tuple[tuple[Any, ...], dict[str, Any]],
    tool_call_id: str | None,
    invoke_factory: Callable[[str], Callable[[Any], Any]],
) -> _Call:
    site = _current_site()
    ledger = _resolve_ledger(spec, site)
    plain, preview = _fingerprint(spec.name, args_for_fp, ledger.serde)
    fingerprint = _sealing.keyed_fingerprint(_sealing.digest_secret(ledger), plain)
    parent = _PARENT.get()
    origin = site.thread_id if site else (parent.origin if parent else None)
    derived = _derive_key(spec, site, ledger, parent, key_args, tool_call_id)
    key = derived.key
    if parent is not None and key in parent.chain:
        raise InvalidIdempotencyKeyError(
            key,
            "is the key of an enclosing idempotent call that is still running; a nested "
            "call with it would wait for itself. Give the nested call its own key",
        )
    return _Call(
        spec=spec,
        ledger=ledger,
        key=key,
        fingerprint=fingerprint,
        legacy_fingerprints=_sealing.legacy_fingerprints(ledger.serde, plain, fingerprint),
        preview=preview,
        thread_id=derived.thread_id,
        origin=origin,
        checkpoint_ns=site.checkpoint_ns if site else None,
        task_id=site.task_id if site else None,
        ttl=derived.ttl,
        claim_ttl=spec.claim_ttl if spec.claim_ttl is not None else ledger.lease_ttl,
        invoke=invoke_factory(key),
        await_checkpoint=derived.await_checkpoint,
        task_state=derived.state,
        legacy_key=derived.legacy_key,
    )


def _stable_task(site: _Site, ledger: _DurableBase) -> tuple[_TaskState, tuple[str, str] | None]:
    """For a key derived from the task id: refuse a task id that a resume would not
    rebuild, and name the checkpoint that must be stored before the key is used."""
    if site.durability == "exit":
        raise UnstableKeyError(
            site.thread_id,
            site.checkpoint_id,
            "durability='exit' stores no checkpoint before the run ends, so a resumed "
            "task runs under new task ids; use durability 'async' or 'sync'",
        )
    state = _task_state(site)
    await_checkpoint = None
    if not state.stored and site.thread_id and site.checkpoint_id and _same_db(
        site.checkpointer, ledger
    ):
        await_checkpoint = (site.thread_id, site.checkpoint_id)
    return state, await_checkpoint


def _same_db(checkpointer: Any, ledger: _DurableBase) -> bool:
    """Whether the graph's checkpoints live where the ledger can see them."""
    if not isinstance(checkpointer, _DurableBase):
        return False
    if checkpointer is ledger:
        return True
    mine, theirs = cast(Any, ledger), cast(Any, checkpointer)
    return bool(
        getattr(mine, "_conninfo", None) == getattr(theirs, "_conninfo", None)
        and mine.schema == theirs.schema
    )


def _prepare(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
    assert spec.signature is not None and spec.public is not None
    # Bind first: a wrong call is a TypeError before anything is written or counted.
    bound = spec.public.bind(*args, **kwargs)
    full = spec.public.bind(*args, **kwargs)
    full.apply_defaults()
    for_fp = {
        n: v
        for i, (n, v) in enumerate(full.arguments.items())
        if n not in spec.exclude and not (i == 0 and n in ("self", "cls"))
    }
    signature = spec.signature

    def invoke_factory(key: str) -> Callable[[Any], Any]:
        def invoke(conn: Any) -> Any:
            arguments = dict(bound.arguments)
            if spec.takes_key:
                arguments[KEY_PARAM] = key
            if spec.transactional:
                arguments[CONN_PARAM] = conn
            call_args = inspect.BoundArguments(signature, arguments)
            return spec.fn(*call_args.args, **call_args.kwargs)

        return invoke

    return _build_call(spec, for_fp, (args, kwargs), None, invoke_factory)


