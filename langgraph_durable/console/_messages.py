"""Message lists as a conversation (issue 25): a ``messages`` channel, a pending write to
it or any list of LangChain messages (or their dict form) becomes a transcript of turns.

A turn is plain data for the template (which escapes every field: message content is
whatever a user or a model wrote). AI tool calls carry their name and arguments, the
ToolMessage that answered them and the ``@idempotent`` ledger row their tool recorded,
found by recomputing the ledger's tool key (``idempotency.keys.tool_key``) from the
thread, the ledger row's task and the call's ``tool_call_id``.

Bounded: at most ``MAX_TURNS`` turns (the latest) and ``MAX_CONTENT`` characters of one
content are kept, each cut said; a page costs what it shows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langgraph_durable.idempotency.keys import legacy_tool_key, tool_key

MAX_TURNS = 200
MAX_CONTENT = 32 * 1024
FOLD_CHARS = 600  # longer contents (or more lines) are folded in a <details>
FOLD_LINES = 8

_ROLES = {
    "human": "human", "user": "human", "ai": "ai", "assistant": "ai", "tool": "tool",
    "function": "tool", "system": "system", "developer": "system",
}


def _role_of(message: Any) -> str | None:
    """The turn's role, or None when ``message`` is not a message."""
    if isinstance(message, Mapping):
        if "content" not in message and "tool_calls" not in message:
            return None
        kind = message.get("type") or message.get("role")
    else:
        if not (hasattr(message, "content") and hasattr(message, "type")):
            return None
        kind = getattr(message, "type", None)
    if not isinstance(kind, str):
        return None
    kind = kind.removesuffix("MessageChunk").removesuffix("Chunk").lower()
    return _ROLES.get(kind, "other" if kind else None)


def _field(message: Any, name: str) -> Any:
    if isinstance(message, Mapping):
        return message.get(name)
    return getattr(message, name, None)


def is_messages(value: Any) -> bool:
    """True for a message, or a non-empty list of messages."""
    if isinstance(value, list | tuple):
        return bool(value) and all(_role_of(m) is not None for m in value)
    return _role_of(value) is not None


def _text(content: Any) -> str:
    """A content (a string, or a list of content blocks) as text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                parts.append(_json(block))
        return "\n".join(parts)
    return "" if content is None else _json(content)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, default=str, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):  # keys json cannot order (mixed types)
        return repr(value)


def folded(text: str) -> dict[str, Any]:
    """``text`` bounded to ``MAX_CONTENT`` characters, with whether to fold it and a
    one-line summary for the fold."""
    cut = max(0, len(text) - MAX_CONTENT)
    body = text[:MAX_CONTENT]
    fold = len(body) > FOLD_CHARS or body.count("\n") >= FOLD_LINES
    summary = " ".join(body[:160].split())
    return {"text": body, "chars": len(text), "cut": cut, "fold": fold, "summary": summary}


def _tool_calls(message: Any) -> list[dict[str, Any]]:
    out = []
    for call in _field(message, "tool_calls") or ():
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function") if isinstance(call.get("function"), Mapping) else None
        name = call.get("name") or (fn or {}).get("name")
        args = call.get("args", (fn or {}).get("arguments"))
        if isinstance(args, str):  # OpenAI dict form: arguments as JSON text
            try:
                args = json.loads(args)
            except ValueError:
                pass
        out.append({"id": call.get("id"), "name": name, "args": folded(_json(args)),
                    "result": None, "ledger": None})
    return out


def transcript(value: Any) -> dict[str, Any] | None:
    """The turns of ``value`` (a message or a list of them), the latest ``MAX_TURNS``;
    None when ``value`` is not messages."""
    if not is_messages(value):
        return None
    messages: Sequence[Any] = list(value) if isinstance(value, list | tuple) else [value]
    hidden = max(0, len(messages) - MAX_TURNS)
    turns = []
    for i, m in enumerate(messages[hidden:], start=hidden):
        role = _role_of(m) or "other"
        turns.append({
            "index": i,
            "role": role,
            "type": type(m).__name__ if not isinstance(m, Mapping) else str(m.get("type") or m.get("role")),
            "name": _field(m, "name"),
            "id": _field(m, "id"),
            "content": folded(_text(_field(m, "content"))),
            "tool_calls": _tool_calls(m) if role == "ai" else [],
            "tool_call_id": _field(m, "tool_call_id") if role == "tool" else None,
            "status": _field(m, "status") if role == "tool" else None,
        })
    _pair(turns)
    return {"turns": turns, "hidden": hidden, "count": len(messages)}


def _pair(turns: list[dict[str, Any]]) -> None:
    """Link each tool call to the ToolMessage that answered it (and back)."""
    results = {t["tool_call_id"]: t for t in turns if t["tool_call_id"]}
    for t in turns:
        for call in t["tool_calls"]:
            answer = results.get(call["id"])
            if answer is not None:
                call["result"] = answer["index"]
                answer["call_name"] = call["name"]


def tool_call_ids(transcripts: Iterable[dict[str, Any] | None]) -> set[str]:
    return {
        str(c["id"])
        for tr in transcripts if tr
        for t in tr["turns"] for c in t["tool_calls"] if c["id"]
    }


def ledger_links(
    thread_id: str,
    call_ids: Iterable[str],
    entries: Iterable[Any],
    task_nodes: Mapping[str, str | None],
) -> dict[str, Any]:
    """tool_call_id -> the ledger entry its ``@idempotent`` tool recorded, among
    ``entries`` (the thread's ledger rows). The key is recomputed for each task a tool
    row names: a root task runs in namespace ``NODE:TASK_ID``, the node read off the
    thread's writes (``task_nodes``; a task not found there is tried with every node
    named); then the legacy (thread, call id) keys."""
    by_key = {e.key: e for e in entries if str(e.key).startswith("tool:")}
    tasks = {e.task_id for e in by_key.values() if e.task_id}
    names = sorted({n for n in task_nodes.values() if n})
    spaces = [
        (f"{node}:{task}", task)
        for task in sorted(tasks)
        for node in ([task_nodes[task]] if task_nodes.get(task) else names)
    ]
    out: dict[str, Any] = {}
    for cid in call_ids:
        candidates = [tool_key(thread_id, ns, task, cid) for ns, task in spaces]
        candidates += [legacy_tool_key(thread_id, cid), legacy_tool_key(None, cid)]
        found = next((by_key[k] for k in candidates if k in by_key), None)
        if found is not None:
            out[cid] = found
    return out


def attach_ledger(transcripts: Iterable[dict[str, Any] | None], links: Mapping[str, Any]) -> None:
    for tr in transcripts:
        for t in tr["turns"] if tr else ():
            for call in t["tool_calls"]:
                call["ledger"] = links.get(str(call["id"]))


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return bool(
        a["index"] == b["index"] and a["role"] == b["role"] and a["id"] == b["id"]
        and a["content"]["text"] == b["content"]["text"]
    )


def trim_common(before: dict[str, Any] | None, after: dict[str, Any]) -> int:
    """Drop from ``after`` the turns it shares with ``before`` (the common prefix, what a
    diff need not repeat); the number of turns dropped."""
    if before is None:
        return 0
    old = {t["index"]: t for t in before["turns"]}
    keep = 0
    for t in after["turns"]:
        prev = old.get(t["index"])
        if prev is None or not _same(prev, t):
            break
        keep += 1
    after["turns"] = after["turns"][keep:]
    return keep + after["hidden"]


def result_text(value: Any) -> dict[str, Any]:
    """A recorded tool result as folded text: a message's content, a string, or JSON."""
    if _role_of(value) is not None:
        return folded(_text(_field(value, "content")))
    return folded(value if isinstance(value, str) else _json(value))
