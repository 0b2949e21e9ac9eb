"""CLI command: ``langgraph-durable demo`` (crash a research pipeline, resume it)."""

from __future__ import annotations

from typing import Annotated

import typer

from langgraph_durable.cli._common import (
    DsnOption,
    JsonOption,
    console,
    err_console,
    escape,
    print_json,
)


def demo(
    dsn: DsnOption = None,
    thread_id: Annotated[
        str | None,
        typer.Option("--thread-id", help="Thread id of the run (default: research-<random>)."),
    ] = None,
    kill_at: Annotated[
        str,
        typer.Option(
            "--kill-at",
            help="Step during which worker 1 is killed (any step, the two side effects too).",
        ),
    ] = "draft_recommendations",
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl",
            help="Lease TTL of the demo's workers in seconds (the saver's default is 30): "
            "how long the dead worker's lease fences the thread off.",
        ),
    ] = 2.0,
    speed: Annotated[
        float,
        typer.Option("--speed", help="Speed factor of the simulated work (2 = twice as fast)."),
    ] = 1.0,
    json_out: JsonOption = False,
) -> None:
    """Run a research pipeline, SIGKILL its worker mid-step, resume it in a new process.

    Shows live which steps were restored from the checkpoint and which ran, and
    counts the payments: the customer is charged exactly once. Uses the embedded
    PostgreSQL unless --dsn or LANGGRAPH_DURABLE_DSN names a server.
    """
    from langgraph_durable.cli import demo as demo_mod
    from langgraph_durable.embedded import EMBEDDED, is_embedded, resolve_dsn

    # The demo chooses the embedded server itself (a library never does by default).
    dsn = dsn or EMBEDDED
    local = is_embedded(dsn)

    if speed <= 0:
        raise typer.BadParameter("--speed must be positive")
    if kill_at not in demo_mod.killable():
        raise typer.BadParameter(f"--kill-at must be one of: {', '.join(demo_mod.killable())}")
    if not json_out:
        console.print(
            "[dim]"
            + ("starting PostgreSQL ..." if local else "connecting to the PostgreSQL server ...")
            + "[/]"
        )
    target = "the embedded PostgreSQL" if local else "a PostgreSQL server"
    resolved = resolve_dsn(dsn)
    try:
        summary = demo_mod.run_demo(
            resolved,
            thread_id=thread_id,
            kill_at=kill_at,
            lease_ttl=lease_ttl,
            speed=speed,
            console=console.resolve(),
            live=not json_out,
            target=target,
        )
    except demo_mod.DemoError as exc:
        if not json_out:
            console.print()  # end the live display's last line
        err_console.print(f"[red]demo failed:[/] {escape(str(exc))}")
        raise typer.Exit(1) from None
    if json_out:
        print_json(summary)
    else:
        _report(summary)
    if summary["payments"] != 1 or summary["emails"] != 1 or not summary["all_steps_done"]:
        raise typer.Exit(1)


def _report(s: dict[str, object]) -> None:
    restored = s["restored"]
    re_executed = s["re_executed"]
    after = s["executed_after_resume"]
    assert isinstance(restored, list) and isinstance(re_executed, list) and isinstance(after, list)
    console.print()
    console.print(
        f"[green]resumed[/] {len(restored)} steps restored from the checkpoint, not re-run: "
        + ", ".join(restored)
    )
    console.print(
        f"[yellow]re-executed[/] {len(re_executed)} step in flight at the kill: "
        + (", ".join(re_executed) or "-")
    )
    console.print(f"executed after resume: {', '.join(after) or '-'}")
    if s["ran_twice"]:
        console.print(f"[red]ran twice[/]: {s['ran_twice']}")
    once = "[bold green]exactly once[/]" if s["payments"] == 1 else "[bold red]NOT exactly once[/]"
    how = (
        "with @idempotent"
        if s.get("idempotent")
        else "its node's writes were checkpointed before the kill"
    )
    console.print(
        f"payments for thread {s['thread_id']}: [bold]{s['payments']}[/] ({once}; {how}); "
        f"emails sent: [bold]{s['emails']}[/]"
    )
    wait = s["lease_wait_seconds"]
    fencing = (
        f"waited {wait}s for the dead worker's lease (lease_ttl {s['lease_ttl']}s)"
        if wait is not None
        else "the dead worker's lease was taken over at once (its process is gone)"
    )
    console.print(
        f"thread status: {s['status']}  ·  all steps done: {s['all_steps_done']}  ·  {fencing}"
    )
    console.print(
        f"[dim]inspect it: langgraph-durable threads show {s['thread_id']}  ·  "
        f"langgraph-durable threads history {s['thread_id']}[/]"
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("demo")(demo)
