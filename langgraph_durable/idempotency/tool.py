"""``@idempotent`` on a LangChain tool: one key per tool call.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import (
    Callable,
)
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForToolRun,
    CallbackManagerForToolRun,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, PrivateAttr

from langgraph_durable.errors import (
    ConfigurationError,
)
from langgraph_durable.idempotency.call import _build_call, _Call, _Spec
from langgraph_durable.idempotency.keys import _TOOL_CALL_ID
from langgraph_durable.idempotency.protocol import _arun, _run, within

logger = logging.getLogger("langgraph_durable.idempotency")

# --- tools ------------------------------------------------------------------------------


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _config_param(fn: Callable[..., Any]) -> str | None:
    """The parameter annotated RunnableConfig, like langchain_core finds it."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    for pname, hint in hints.items():
        if hint is RunnableConfig:
            return pname
    return None


class IdempotentTool(BaseTool):
    """A LangChain tool whose calls go through the ledger. ``ToolNode`` sees the same
    name, description and argument schema as the wrapped tool; a tool call's key is
    derived from the thread, the task running the calling AI message and the model's
    ``tool_call_id`` (providers reuse ``call_0`` on every turn)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tool: BaseTool
    _spec: _Spec = PrivateAttr()

    def run(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        token = _TOOL_CALL_ID.set(kwargs.get("tool_call_id"))
        try:
            return super().run(tool_input, *args, **kwargs)
        finally:
            _TOOL_CALL_ID.reset(token)

    async def arun(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        token = _TOOL_CALL_ID.set(kwargs.get("tool_call_id"))
        try:
            return await super().arun(tool_input, *args, **kwargs)
        finally:
            _TOOL_CALL_ID.reset(token)

    def _prepare_tool(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], invoke: Callable[[], Any]
    ) -> _Call:
        spec = self._spec
        for_fp: dict[str, Any] = {f"${i}": a for i, a in enumerate(args)}
        for k, v in self._filter_injected_args(dict(kwargs)).items():
            if k not in spec.exclude:
                for_fp[k] = v
        return _build_call(
            spec, for_fp, (args, kwargs), _TOOL_CALL_ID.get(), lambda key: lambda _conn: invoke()
        )

    def _restore(self, value: Any) -> Any:
        # msgpack turns the (content, artifact) tuple into a list.
        if self.tool.response_format == "content_and_artifact" and isinstance(value, list) and len(value) == 2:
            return tuple(value)
        return value

    def _tool_call(
        self, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], config: RunnableConfig, run_manager: Any
    ) -> _Call:
        """The call of the inner tool's ``_run`` or ``_arun`` (``method``): its own
        tool_call_id hidden from calls nested in it."""
        extra: dict[str, Any] = {}
        if _accepts(method, "run_manager"):
            extra["run_manager"] = run_manager
        if cp := _config_param(method):
            extra[cp] = config

        def enter() -> Callable[[], None]:
            token = _TOOL_CALL_ID.set(None)
            return lambda: _TOOL_CALL_ID.reset(token)

        return self._prepare_tool(args, kwargs, lambda: within(enter, lambda: method(*args, **kwargs, **extra)))

    def _run(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        call = self._tool_call(self.tool._run, args, kwargs, config, run_manager)
        return self._restore(_run(call))

    async def _arun(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        call = self._tool_call(self.tool._arun, args, kwargs, config, run_manager)
        return self._restore(await _arun(call))


def _wrap_tool(tool: BaseTool, **options: Any) -> IdempotentTool:
    if options["transactional"]:
        raise ConfigurationError(
            "transactional=True is for functions (they receive the connection); wrap the "
            "function, then build the tool from it"
        )
    if options["ttl"] is not None and options["key"] is None:
        raise ConfigurationError("ttl applies to explicit keys only (key=)")
    spec = _Spec(
        fn=tool._run,
        name=options["name"] or tool.name,
        key=options["key"],
        ttl=options["ttl"],
        on_unknown=options["on_unknown"],
        cache_failures=options["cache_failures"],
        transactional=False,
        wait_timeout=options["wait_timeout"],
        claim_ttl=options["claim_ttl"],
        exclude=options["exclude"],
        ledger=options["ledger"],
        is_async=False,
        signature=None,
        public=None,
        takes_key=False,
    )
    wrapped = IdempotentTool(
        tool=tool,
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        return_direct=tool.return_direct,
        response_format=tool.response_format,
        tags=tool.tags,
        metadata=tool.metadata,
        handle_tool_error=tool.handle_tool_error,
        handle_validation_error=tool.handle_validation_error,
        extras=getattr(tool, "extras", None),
    )
    wrapped._spec = spec
    return wrapped


