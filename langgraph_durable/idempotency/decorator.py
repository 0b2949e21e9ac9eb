"""``@idempotent``: wraps a function, a coroutine function, a tool or a runnable.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import logging
from collections.abc import (
    Callable,
    Mapping,
    Sequence,
)
from typing import Any, overload

from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool

from langgraph_durable.core.base import _DurableBase
from langgraph_durable.errors import (
    ConfigurationError,
)
from langgraph_durable.idempotency.call import _failures, _prepare, _seconds, _Spec, aready
from langgraph_durable.idempotency.keys import CONN_PARAM, KEY_PARAM, F, OnUnknown
from langgraph_durable.idempotency.protocol import _arun, _run
from langgraph_durable.idempotency.tool import _wrap_tool

logger = logging.getLogger("langgraph_durable.idempotency")

@overload
def idempotent(fn: F, /) -> F: ...


@overload
def idempotent(
    fn: None = None,
    /,
    *,
    key: Callable[..., str] | None = ...,
    name: str | None = ...,
    ttl: float | dt.timedelta | None = ...,
    on_unknown: OnUnknown = ...,
    cache_failures: bool | type[BaseException] | Sequence[type[BaseException]] = ...,
    transactional: bool = ...,
    wait_timeout: float | dt.timedelta = ...,
    claim_ttl: float | dt.timedelta | None = ...,
    exclude: Sequence[str] = ...,
    ledger: Any = ...,
) -> Callable[[F], F]: ...


def idempotent(
    fn: Any = None,
    /,
    *,
    key: Callable[..., str] | None = None,
    name: str | None = None,
    ttl: float | dt.timedelta | None = None,
    on_unknown: OnUnknown = "raise",
    cache_failures: bool | type[BaseException] | Sequence[type[BaseException]] = False,
    transactional: bool = False,
    wait_timeout: float | dt.timedelta = 60.0,
    claim_ttl: float | dt.timedelta | None = None,
    exclude: Sequence[str] = (),
    ledger: Any = None,
) -> Any:
    """Make a function (sync or async) or a LangChain tool run at most once per key.

    The key is, in order: ``key(*args, **kwargs)``, the model's ``tool_call_id`` within
    its task (wrapped tools called by ``ToolNode``), the enclosing idempotent call's key plus an
    index (nested calls), else a hash of (thread, checkpoint namespace, task id, index
    of the call within the task). See docs/idempotency.md for the full semantics.

    ``ledger``: a ``DurablePostgresSaver`` / ``AsyncDurablePostgresSaver`` (or a
    zero-argument callable returning one) used instead of the running graph's saver;
    required outside a durable run (else ``NoLedgerError``).
    """
    if on_unknown not in ("raise", "retry"):
        raise ConfigurationError(f"on_unknown must be 'raise' or 'retry', got {on_unknown!r}")
    if not isinstance(transactional, bool):
        raise ConfigurationError("transactional must be a bool")
    if key is not None and not callable(key):
        raise ConfigurationError("key must be a callable returning the key string")
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
        "key": key,
        "name": name,
        "ttl": _seconds(ttl, "ttl"),
        "on_unknown": on_unknown,
        "cache_failures": _failures(cache_failures),
        "transactional": transactional,
        "wait_timeout": wait if wait is not None else 60.0,
        "claim_ttl": claim,
        "exclude": frozenset(exclude),
        "ledger": ledger,
    }
    if isinstance(exclude, str):
        raise ConfigurationError("exclude must be a sequence of parameter names, not a str")

    def decorate(target: Any) -> Any:
        return _decorate(target, **options)

    if fn is None:
        return decorate
    return decorate(fn)


def _journal_runnable(target: Runnable[Any, Any], options: Mapping[str, Any]) -> Any:
    """``idempotent(model)``: a model call is recorded, not deduplicated as an effect,
    so it is ``journaled(model)`` (langgraph_durable.journal); the options that only
    make sense for effects are refused."""
    from langgraph_durable.journal import journaled

    effect_only: dict[str, Any] = {
        "key": None, "ttl": None, "on_unknown": "raise", "cache_failures": (),
        "transactional": False, "exclude": frozenset(), "wait_timeout": 60.0, "claim_ttl": None,
    }
    bad = sorted(k for k, default in effect_only.items() if options[k] != default)
    if bad:
        raise ConfigurationError(
            f"idempotent(<Runnable>) journals the runnable's calls (journaled()); "
            f"options {bad} apply to side effects only"
        )
    return journaled(target, name=options["name"], ledger=options["ledger"])


def _decorate(target: Any, **options: Any) -> Any:
    from langgraph.func import _TaskFunction

    if isinstance(target, _TaskFunction):
        raise ConfigurationError(
            "@idempotent must be applied below @task (@task above, @idempotent on the "
            "function): a @task call returns a future, not a result to record"
        )
    if isinstance(target, BaseTool):
        return _wrap_tool(target, **options)
    if isinstance(target, Runnable):
        return _journal_runnable(target, options)
    if not callable(target):
        raise ConfigurationError(f"@idempotent needs a function or a BaseTool, got {target!r}")
    return _wrap_function(_function_spec(target, options))


def _function_spec(fn: Callable[..., Any], options: Mapping[str, Any]) -> _Spec:
    """The options checked against ``fn``'s signature, as a ``_Spec``."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the signature of {fn!r}") from exc
    params = signature.parameters
    takes_key = KEY_PARAM in params
    _check_signature(fn, params, options)
    hide = {CONN_PARAM} if options["transactional"] else set()
    if takes_key:
        hide.add(KEY_PARAM)
    public = signature.replace(parameters=[p for n, p in params.items() if n not in hide])
    return _Spec(
        fn=fn,
        name=options["name"] or getattr(fn, "__qualname__", None) or repr(fn),
        key=options["key"],
        ttl=options["ttl"],
        on_unknown=options["on_unknown"],
        cache_failures=options["cache_failures"],
        transactional=options["transactional"],
        wait_timeout=options["wait_timeout"],
        claim_ttl=options["claim_ttl"],
        exclude=options["exclude"],
        ledger=options["ledger"],
        is_async=inspect.iscoroutinefunction(fn),
        signature=signature,
        public=public,
        takes_key=takes_key,
    )


def _check_signature(fn: Callable[..., Any], params: Mapping[str, inspect.Parameter], options: Mapping[str, Any]) -> None:
    for hidden in (CONN_PARAM, KEY_PARAM):
        p = params.get(hidden)
        if p is not None and p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigurationError(f"parameter {hidden!r} of {fn!r} must accept a keyword")
    if options["transactional"] and CONN_PARAM not in params:
        raise ConfigurationError(
            f"transactional=True: {getattr(fn, '__qualname__', fn)!r} must declare a "
            f"'{CONN_PARAM}' parameter to receive the psycopg connection"
        )
    if options["ttl"] is not None and options["key"] is None:
        raise ConfigurationError(
            "ttl applies to keys from key= only: derived keys live exactly as long as "
            "their thread"
        )
    unknown = options["exclude"] - set(params)
    if unknown:
        raise ConfigurationError(f"exclude names unknown parameters: {sorted(unknown)}")


def _wrap_function(spec: _Spec) -> Any:
    fn = spec.fn
    if spec.is_async:

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            await aready(spec)  # the digest secret, before the fingerprint (digest27)
            call = _prepare(spec, args, kwargs)
            return await _arun(call)

        wrapper: Any = awrapper
    else:

        @functools.wraps(fn)
        def swrapper(*args: Any, **kwargs: Any) -> Any:
            call = _prepare(spec, args, kwargs)
            return _run(call)

        wrapper = swrapper
    # Tools built from the wrapper (@tool above @idempotent) must not see the
    # parameters the wrapper fills in.
    wrapper.__signature__ = spec.public
    wrapper.__idempotent__ = spec
    return wrapper
