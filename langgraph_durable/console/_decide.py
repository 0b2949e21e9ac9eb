"""The console's thread decisions (issue 25): resume, answer an interrupt, cancel, fork
and delete. Each is a pair: ``plan`` (read-only, for the confirmation page: what will
change, or why it is refused) and ``run`` (the operator API in ``ops.control``, which
records the audit row and refuses with a typed ``DurableError`` where unsafe: the
confirmation page's refusal is a courtesy, the API's is the rule).

Release, rewind, resolve and forget stay in ``_app`` (quarantine and ledger)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from langgraph_durable.ops import control
from langgraph_durable.ops import inspection as lgi

if TYPE_CHECKING:
    from langgraph_durable.saver import DurablePostgresSaver

DECISIONS = ("resume", "answer", "cancel", "fork", "delete")


class Refused(Exception):
    """The confirmation page's refusal: the decision is unsafe or meaningless now."""


def _thread(saver: DurablePostgresSaver, tid: str, *, values: bool) -> dict[str, Any]:
    if not tid:
        raise Refused("no thread given")
    info = lgi.show_thread(saver, tid, values=values)
    if not info.get("checkpoints") and info.get("status") is None:
        raise Refused(f"thread {tid!r} has no checkpoint")
    lease = info.get("lease") or None
    info["live_lease"] = bool(lease and lease.get("live") and not lease.get("note"))
    return info


def _exists(saver: DurablePostgresSaver, tid: str) -> bool:
    try:
        info = lgi.show_thread(saver, tid)
    except LookupError:
        return False
    return bool(info.get("checkpoints") or info.get("status"))


def _no_live_lease(info: dict[str, Any], what: str) -> None:
    if info["live_lease"]:
        owner = info["lease"]["owner"]
        raise Refused(
            f"thread {info['thread_id']!r} is running now (live lease held by {owner}): "
            f"{what} is refused while a run holds it; cancel it first"
        )


def _json_value(text: str, what: str) -> Any:
    if not text.strip():
        raise Refused(f"the {what} box is empty: type the JSON value (a placeholder is never submitted)")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Refused(f"the {what} is not valid JSON: {exc}") from None


def served(saver: DurablePostgresSaver, version: str | None) -> list[control.WorkerInfo]:
    return list(control.workers_serving(saver, version))


def plan(
    saver: DurablePostgresSaver, action: str, form: Any, *, has_graph: bool, archive_url: str | None
) -> dict[str, Any]:
    tid = str(form.get("thread") or "")
    # Decoded values only for an answer (the interrupt's payload is shown).
    info = _thread(saver, tid, values=action == "answer")
    state, status = info.get("state"), info.get("status")
    out: dict[str, Any] = {
        "thread": tid, "status": status or "untracked", "state": state,
        "graph_version": info.get("graph_version"), "lease": info.get("lease"),
        "head": (info.get("checkpoint") or {}).get("id"),
    }
    if action == "resume":
        _no_live_lease(info, "resume")
        if info.get("quarantine"):
            raise Refused(f"thread {tid!r} is quarantined: release or rewind it instead")
        if state == "done":
            raise Refused(f"thread {tid!r} is done: nothing to resume (fork it to run again)")
        if info.get("interrupts"):
            if control.answer_queued(saver, tid):
                raise Refused(f"thread {tid!r}: {control.ANSWER_QUEUED} (resume changes nothing)")
            raise Refused(f"thread {tid!r} waits on an interrupt: answer it instead")
        out["served_by"] = served(saver, info.get("graph_version"))
    elif action == "answer":
        _no_live_lease(info, "an answer")
        if control.answer_queued(saver, tid):
            raise Refused(f"thread {tid!r}: {control.ANSWER_QUEUED}")
        if not info.get("interrupts"):
            raise Refused(f"thread {tid!r} does not wait on an interrupt (state {state})")
        out["interrupts"] = info["interrupts"]
        out["value"] = _json_value(str(form.get("value") or ""), "answer")
        out["value_text"] = str(form.get("value"))
        mode = str(form.get("mode") or "queue")
        if mode == "now" and not has_graph:
            raise Refused("this console was started without --graph: the answer can only be queued")
        out["mode"] = mode if mode in ("queue", "now") else "queue"
        out["served_by"] = served(saver, info.get("graph_version"))
    elif action == "cancel":
        lease = info.get("lease") or {}
        if not lease.get("live"):
            raise Refused(f"thread {tid!r} has no live lease: nothing is running to cancel")
        if lease.get("note"):
            raise Refused(f"thread {tid!r}: {lease['note']}: nothing is running to cancel")
    elif action == "fork":
        cp = str(form.get("cp") or "latest")
        out["checkpoint"] = lgi.resolve_checkpoint(saver, tid, cp)
        new = str(form.get("new_thread") or "").strip() or None
        if new is not None and _exists(saver, new):
            raise Refused(f"thread {new!r} exists already: choose another id (or leave it empty)")
        out["new_thread"] = new
    elif action == "delete":
        _no_live_lease(info, "delete")
        out["checkpoints"] = info.get("checkpoints")
        out["archive_url"] = archive_url or os.environ.get(control.ARCHIVE_URL_ENV) or None
    return out


def run(
    saver: DurablePostgresSaver, action: str, form: Any, graph: Any, archive_url: str | None
) -> tuple[str, str]:
    """Carry the decision out; (message, where to go next)."""
    tid = str(form["thread"])
    page = "/thread?id=" + quote(tid, safe="")
    if action == "resume":
        return _queued("resume queued", control.queue_resume(saver, tid)), page
    if action == "answer":
        value = json.loads(str(form["value"]))
        if str(form.get("mode")) == "now":
            if graph is None:
                raise ValueError("this console was started without --graph")
            control.answer_now(graph, tid, value)
            return f"answered {tid}: the run went on in the console's process", page
        return _queued("answer queued", control.queue_answer(saver, tid, value)), page
    if action == "cancel":
        control.request_cancel(saver, tid)
        return (f"cancel requested for {tid}: the run stops at its next step boundary "
                "(status stopped, resumable)"), page
    if action == "fork":
        new = control.fork(saver, tid, str(form["cp"]), str(form.get("new_thread") or "").strip() or None)
        return f"forked {tid} at {form['cp']} into {new}", "/thread?id=" + quote(new, safe="")
    if action == "delete":
        where = control.delete_thread(saver, tid, archive_url=archive_url)
        return (f"deleted {tid}" + (f" (archived first: {where})" if where else " (no archive configured)"),
                "/threads")
    raise ValueError(f"unknown decision {action!r}")


def _queued(what: str, r: control.ResumeQueued) -> str:
    who = ", ".join(w.name or w.worker_id for w in r.served_by)
    if who:
        return f"{what} for {r.thread_id}: served by {who}"
    return (f"{what} for {r.thread_id}, but NO live worker serves graph version "
            f"{r.graph_version or '(unversioned)'}: nothing will pick it up until one starts")
