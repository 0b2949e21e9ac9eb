"""The demo's live display: one row per step, one column per worker."""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langgraph_durable.cli.demo.story import EFFECT_STEPS, STEPS


@dataclass
class StepView:
    node: str
    runs: dict[int, str] = field(default_factory=dict)  # worker -> running|done|killed
    progress: dict[int, tuple[int, int]] = field(default_factory=dict)
    restored: bool = False
    replayed: bool = False  # its side effect came back from the @idempotent ledger


@dataclass
class DemoState:
    thread_id: str
    target: str
    kill_at: str
    phase: str = "starting"
    pids: dict[int, int] = field(default_factory=dict)
    steps: dict[str, StepView] = field(default_factory=lambda: {s: StepView(s) for s in STEPS})
    payments: int = 0
    emails: int = 0
    idempotent: bool = False


def render(st: DemoState) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    table = Table(expand=False)
    table.add_column("step", no_wrap=True)
    table.add_column(f"worker 1\npid {st.pids.get(1, '-')}", no_wrap=True)
    table.add_column(f"worker 2 (standby)\npid {st.pids.get(2, '-')}", no_wrap=True)
    for node in STEPS:
        v = st.steps[node]
        label = node + (" [bold magenta]$[/]" if node in EFFECT_STEPS else "")
        table.add_row(label, _cell(v, 1), _cell(v, 2))
    head = (
        f"thread [bold]{st.thread_id}[/] on {st.target}\n"
        f"kill point: worker 1 is killed with SIGKILL {_kill_point(st.kill_at)}\n"
        f"[bold]{st.phase}[/]\n"
        f"payments for this thread: [bold]{st.payments}[/]   emails: [bold]{st.emails}[/]"
    )
    legend = (
        "[dim][green]↺ restored[/] = result loaded from the checkpoint, the step did not run "
        "again · [magenta]$[/] = side effect[/]"
    )
    return Group(
        Panel(head, title="langgraph-durable demo: research pipeline", expand=False),
        table,
        legend,
    )


def _kill_point(step: str) -> str:
    if step in EFFECT_STEPS:
        return f"inside {step}, after its side effect, before its checkpoint"
    return f"halfway through {step}"


def _cell(v: StepView, worker: int) -> str:
    state = v.runs.get(worker)
    done, total = v.progress.get(worker, (0, 1))
    if state == "running":
        return f"[yellow]▶ {_bar(done, total)}[/]"
    if state == "killed":
        return f"[bold red]✗ killed at {done}/{total}[/]"
    if worker == 1:
        return "[green]✓ done[/]" if state == "done" else "[dim]·[/]"
    if state is None:
        return "[green]↺ restored from checkpoint[/]" if v.restored else "[dim]·[/]"
    first = v.runs.get(1)
    if first == "killed" and v.replayed:
        return "[yellow]✓ re-executed, effect replayed[/]"
    if first == "killed":
        return "[yellow]✓ re-executed (was in flight)[/]"
    if first == "done":
        return "[red]✓ ran again[/]"
    return "✓ executed"


def _bar(done: int, total: int, width: int = 8) -> str:
    filled = round(width * done / max(total, 1))
    return "█" * filled + "░" * (width - filled) + f" {done}/{total}"
