"""``threads resume | answer | cancel | fork | delete``: the operator decisions of
``ops.control`` (issue 25) from the command line, each audited (via ``cli``) and refused
with a message and exit code 1 where it does not apply."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from langgraph_durable.cli._common import DsnOption, JsonOption, SchemaOption, escape

ThreadArg = Annotated[str, typer.Argument(help="The thread id.")]


def _workers_line(queued: Any) -> str:
    if not queued.served_by:
        return (f"no live worker serves graph version {queued.graph_version!r}: nobody will pick "
                "it up until one starts (`langgraph-durable workers`)")
    names = ", ".join(f"{w.host}:{w.pid}" for w in queued.served_by)
    return f"served by {len(queued.served_by)} live worker(s): {names}"


def _queued(queued: Any, what: str, json_out: bool) -> None:
    from langgraph_durable.cli._common import console, print_json

    if json_out:
        print_json({"thread_id": queued.thread_id, "graph_version": queued.graph_version,
                    "served_by": [w.to_dict() for w in queued.served_by]})
        return
    console.print(f"{what} thread {escape(queued.thread_id)}; {escape(_workers_line(queued))}")


def resume(thread_id: ThreadArg, dsn: DsnOption = None, schema: SchemaOption = None,
           json_out: JsonOption = False) -> None:
    """Queue a thread for the recovery workers (and say which live workers serve it)."""
    from langgraph_durable.cli._common import saver_or_exit
    from langgraph_durable.ops import control

    with saver_or_exit(dsn, schema, json_out) as saver:
        _queued(control.queue_resume(saver, thread_id), "queued", json_out)


def answer(
    thread_id: ThreadArg,
    value: Annotated[str, typer.Argument(help="The answer as JSON (Command(resume=value)).")],
    dsn: DsnOption = None, schema: SchemaOption = None, json_out: JsonOption = False,
) -> None:
    """Answer the interrupt a thread waits on; a worker runs it."""
    from langgraph_durable.cli._common import fail, saver_or_exit
    from langgraph_durable.ops import control

    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise fail(json_out, "InvalidJSON", f"the answer is not JSON: {exc}", {"value": value}) from None
    with saver_or_exit(dsn, schema, json_out) as saver:
        _queued(control.queue_answer(saver, thread_id, parsed), "answer queued for", json_out)


def cancel(thread_id: ThreadArg, dsn: DsnOption = None, schema: SchemaOption = None,
           json_out: JsonOption = False) -> None:
    """Ask the run holding a thread to stop at its next step boundary (status stopped)."""
    from langgraph_durable.cli._common import console, print_json, saver_or_exit
    from langgraph_durable.ops import control

    with saver_or_exit(dsn, schema, json_out) as saver:
        control.request_cancel(saver, thread_id)
    if json_out:
        print_json({"thread_id": thread_id, "cancel_requested": True})
    else:
        console.print(f"cancel requested for thread {escape(thread_id)}: it stops at its next step boundary")


def fork(
    thread_id: ThreadArg,
    checkpoint_id: Annotated[str, typer.Argument(help="The checkpoint to fork from.")],
    new_thread: Annotated[str | None, typer.Option("--new-thread", help="The new thread's id.")] = None,
    dsn: DsnOption = None, schema: SchemaOption = None, json_out: JsonOption = False,
) -> None:
    """Copy the state at a checkpoint into a new thread (time travel)."""
    from langgraph_durable.cli._common import console, print_json, saver_or_exit
    from langgraph_durable.ops import control

    with saver_or_exit(dsn, schema, json_out) as saver:
        new = control.fork(saver, thread_id, checkpoint_id, new_thread)
    if json_out:
        print_json({"thread_id": thread_id, "checkpoint_id": checkpoint_id, "new_thread_id": new})
    else:
        console.print(f"forked into thread {escape(new)} (stopped: `threads resume {escape(new)}` runs it)")


def delete(
    thread_id: ThreadArg,
    archive: Annotated[str | None, typer.Option("--archive", help="Archive here first (dir or fsspec URL).")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Really delete.")] = False,
    dsn: DsnOption = None, schema: SchemaOption = None, json_out: JsonOption = False,
) -> None:
    """Delete a thread whole, archived first with --archive (or LANGGRAPH_DURABLE_ARCHIVE_URL)."""
    from langgraph_durable.cli._common import console, fail, print_json, saver_or_exit
    from langgraph_durable.ops import control

    if not yes:
        raise fail(json_out, "NotConfirmed", f"deleting thread {thread_id!r} needs --yes", {"thread_id": thread_id})
    with saver_or_exit(dsn, schema, json_out) as saver:
        location = control.delete_thread(saver, thread_id, archive_url=archive)
    if json_out:
        print_json({"thread_id": thread_id, "deleted": True, "archive": location})
    else:
        console.print(f"deleted thread {escape(thread_id)}" + (f", archived to {escape(location)}" if location else ""))


def register(app: typer.Typer) -> None:
    """Add the decisions to the ``threads`` group."""
    from langgraph_durable.cli._threads import threads_app

    for name, fn in (("resume", resume), ("answer", answer), ("cancel", cancel), ("fork", fork), ("delete", delete)):
        threads_app.command(name)(fn)
