"""The demo's driver: spawns the two workers, kills the first with SIGKILL at the
chosen step, lets the second resume, and sums up from the database."""


from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from langgraph_durable.cli.demo.render import DemoState, render
from langgraph_durable.cli.demo.story import (
    DEFAULT_KILL_AT,
    DEFAULT_LEASE_TTL,
    DEMO_TABLES_SQL,
    EFFECT_STEPS,
    STEPS,
    SUPERSTEPS,
    killable,
)
from langgraph_durable.embedded import ENV_DSN


def _open_events(proc: subprocess.Popen[str], worker: int, q: queue.Queue[Any]) -> threading.Thread:
    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    q.put((worker, json.loads(line)))
        q.put((worker, {"e": "eof"}))

    t = threading.Thread(target=pump, name=f"demo-worker-{worker}-events", daemon=True)
    t.start()
    return t


def _spawn(
    dsn: str, thread_id: str, phase: str, lease_ttl: float, speed: float, log: Any
) -> subprocess.Popen[str]:
    env = {**os.environ, ENV_DSN: dsn, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable, "-m", "langgraph_durable.cli.demo", "worker",
        "--thread-id", thread_id, "--phase", phase,
        "--lease-ttl", str(lease_ttl), "--speed", str(speed),
    ]  # fmt: skip
    stdin = subprocess.PIPE if phase == "resume" else subprocess.DEVNULL
    return subprocess.Popen(
        cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=log, text=True, env=env
    )


def _prepare(dsn: str, thread_id: str) -> None:
    from langgraph_durable import DurablePostgresSaver

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in DEMO_TABLES_SQL:
            conn.execute(stmt)
        used = conn.execute(
            "SELECT 1 FROM checkpoints WHERE thread_id = %s LIMIT 1", (thread_id,)
        ).fetchone()
    if used:
        raise DemoError(
            f"thread {thread_id!r} already has checkpoints: pick another --thread-id "
            "(the demo shows a fresh run)"
        )


class DemoError(RuntimeError):
    """The demo could not run as planned (a worker failed, the thread id is taken)."""


def _persisted_nodes(conn: psycopg.Connection[Any], thread_id: str) -> set[str]:
    """Nodes whose writes for the current step are in Postgres (restorable)."""
    from langgraph_durable.ops.inspection import node_of

    rows = conn.execute(
        "SELECT DISTINCT task_path FROM checkpoint_writes WHERE thread_id = %s "
        "AND checkpoint_ns = '' AND checkpoint_id = (SELECT max(checkpoint_id) FROM checkpoints "
        "WHERE thread_id = %s AND checkpoint_ns = '')",
        (thread_id, thread_id),
    ).fetchall()
    return {n for (p,) in rows if (n := node_of(p))}


def _effect_counts(conn: psycopg.Connection[Any], thread_id: str) -> tuple[int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM lgd_demo_payments WHERE thread_id = %s), "
        "(SELECT count(*) FROM lgd_demo_emails WHERE thread_id = %s)",
        (thread_id, thread_id),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def summarize(dsn: str, thread_id: str) -> dict[str, Any]:
    """The verdict, from the database: per step, which worker ran it and how it ended."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        runs = conn.execute(
            "SELECT node, worker, pid, finished_at IS NOT NULL AS finished "
            "FROM lgd_demo_step_runs WHERE thread_id = %s ORDER BY id",
            (thread_id,),
        ).fetchall()
        payments = conn.execute(
            "SELECT id, amount_cents, pid FROM lgd_demo_payments WHERE thread_id = %s ORDER BY id",
            (thread_id,),
        ).fetchall()
        emails = conn.execute(
            "SELECT id, pid FROM lgd_demo_emails WHERE thread_id = %s ORDER BY id", (thread_id,)
        ).fetchall()
        thread = conn.execute(
            "SELECT status, attempts, lease_token FROM durable_threads WHERE thread_id = %s",
            (thread_id,),
        ).fetchone()
        effect_pids = {
            "charge_customer": [p["pid"] for p in payments],
            "email_customer": [
                r["pid"]
                for r in conn.execute(
                    "SELECT pid FROM lgd_demo_emails WHERE thread_id = %s", (thread_id,)
                ).fetchall()
            ],
        }
    steps = []
    for node in STEPS:
        mine = [r for r in runs if r["node"] == node]
        w1 = [r for r in mine if r["worker"] == 1]
        w2 = [r for r in mine if r["worker"] == 2]
        if w1 and not w2:
            outcome = "restored" if all(r["finished"] for r in w1) else "lost"
        elif w1 and w2:
            outcome = "re-executed" if not any(r["finished"] for r in w1) else "ran twice"
        elif w2:
            outcome = "executed after resume"
        else:
            outcome = "never ran"
        # An effect step that ran again in worker 2 while its only effect row was made
        # by worker 1: the second call was answered from the @idempotent ledger.
        w1_pids = {r["pid"] for r in w1}
        replayed = (
            node in effect_pids
            and bool(w2)
            and bool(effect_pids[node])
            and set(effect_pids[node]) <= w1_pids
        )
        steps.append(
            {
                "step": node,
                "outcome": outcome,
                "effect_replayed": replayed,
                "worker1_runs": len(w1),
                "worker2_runs": len(w2),
                "finished": any(r["finished"] for r in mine),
            }
        )
    return {
        "thread_id": thread_id,
        "status": thread["status"] if thread else None,
        "lease_token": thread["lease_token"] if thread else None,
        "steps": steps,
        "all_steps_done": all(s["finished"] for s in steps),
        "restored": [s["step"] for s in steps if s["outcome"] == "restored"],
        "re_executed": [s["step"] for s in steps if s["outcome"] == "re-executed"],
        "executed_after_resume": [
            s["step"] for s in steps if s["outcome"] == "executed after resume"
        ],
        "ran_twice": [s["step"] for s in steps if s["outcome"] == "ran twice"],
        "effects_replayed": [s["step"] for s in steps if s["effect_replayed"]],
        "payments": len(payments),
        "emails": len(emails),
        "payment_rows": [dict(p) for p in payments],
    }


def run_demo(
    dsn: str,
    *,
    thread_id: str | None = None,
    kill_at: str = DEFAULT_KILL_AT,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    speed: float = 1.0,
    console: Any = None,
    live: bool = True,
    target: str = "",
) -> dict[str, Any]:
    """Run the whole demo against ``dsn`` and return the summary (see ``summarize``)
    plus ``killed_pid``, ``resumed_pid``, ``kill_at``, ``lease_wait_seconds`` and
    ``idempotent``. ``live=False`` runs it without any output."""
    if kill_at not in killable():
        raise DemoError(f"kill_at must be one of {', '.join(killable())}")
    thread_id = thread_id or f"research-{uuid.uuid4().hex[:8]}"
    _prepare(dsn, thread_id)
    driver = _Driver(dsn, thread_id, kill_at, lease_ttl, speed, console, live, target)
    return driver.run()


class _Driver:
    """Runs worker 1, kills it, runs worker 2, and keeps the display in step.

    Single-threaded: reader threads only move worker stdout lines into a queue; all
    state changes, database polls and the kill decision happen in ``run``'s loop."""

    def __init__(
        self,
        dsn: str,
        thread_id: str,
        kill_at: str,
        lease_ttl: float,
        speed: float,
        console: Any,
        live: bool,
        target: str,
    ) -> None:
        from rich.console import Console

        self.dsn = dsn
        self.lease_ttl = lease_ttl
        self.speed = speed
        self.console = console or Console()
        self.live = live
        self.st = DemoState(thread_id=thread_id, target=target, kill_at=kill_at)
        self.events: queue.Queue[Any] = queue.Queue()
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.eof: set[int] = set()
        self.killed = False
        self.resumed = False
        self.busy_since: float | None = None
        self.lease_wait: float | None = None

    def say(self, text: str) -> None:
        if self.live:
            self.console.print(text)

    def spawn(self, worker: int, phase: str, log: Any) -> None:
        proc = _spawn(self.dsn, self.st.thread_id, phase, self.lease_ttl, self.speed, log)
        self.procs[worker] = proc
        _open_events(proc, worker, self.events)

    def run(self) -> dict[str, Any]:
        from rich.live import Live

        st = self.st
        log = tempfile.TemporaryFile(mode="w+")
        try:
            with (
                psycopg.connect(self.dsn, autocommit=True) as conn,
                Live(render(st), console=self.console, refresh_per_second=8)
                if self.live
                else contextlib.nullcontext() as view,
            ):
                self.spawn(1, "start", log)
                self.spawn(2, "resume", log)
                st.phase = "worker 1 running the pipeline"
                # A hung worker must not hang the demo forever.
                deadline = time.monotonic() + 300 / self.speed
                last_poll = 0.0
                while not self._finished(log):
                    if time.monotonic() > deadline:
                        raise DemoError("the demo did not finish within its time limit")
                    try:
                        worker, ev = self.events.get(timeout=0.1)
                        self.apply(worker, ev)
                    except queue.Empty:
                        pass
                    if time.monotonic() - last_poll > 0.3:
                        last_poll = time.monotonic()
                        st.payments, st.emails = _effect_counts(conn, st.thread_id)
                    if not self.killed and _should_kill(st, conn):
                        self.kill(log)
                    if view is not None:
                        view.update(render(st))
                st.payments, st.emails = _effect_counts(conn, st.thread_id)
                summary = summarize(self.dsn, st.thread_id)
                for s in summary["steps"]:
                    st.steps[s["step"]].restored = s["outcome"] == "restored"
                st.phase = f"done: thread status {summary['status']!r}"
                if view is not None:
                    view.update(render(st))
        finally:
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            log.close()
        summary["killed_pid"] = self.procs[1].pid
        summary["resumed_pid"] = self.procs[2].pid
        summary["kill_at"] = st.kill_at
        summary["lease_ttl"] = self.lease_ttl
        summary["lease_wait_seconds"] = (
            None if self.lease_wait is None else round(self.lease_wait, 2)
        )
        summary["idempotent"] = st.idempotent
        return summary

    def _finished(self, log: Any) -> bool:
        if 1 in self.eof and not self.killed:
            code = self.procs[1].wait()
            raise DemoError(
                f"worker 1 exited (code {code}) before the kill point" + _stderr_tail(log)
            )
        if 2 in self.eof:
            code = self.procs[2].wait()
            if code != 0:
                raise DemoError(f"worker 2 failed (exit code {code})" + _stderr_tail(log))
            return True
        return False

    def kill(self, log: Any) -> None:
        st = self.st
        done, total = st.steps[st.kill_at].progress.get(1, (0, 1))
        os.kill(self.procs[1].pid, signal.SIGKILL)
        code = self.procs[1].wait()
        self.killed = True
        for v in st.steps.values():
            if v.runs.get(1) == "running":
                v.runs[1] = "killed"
        self.say(
            f"[bold red]SIGKILL[/] sent to worker 1 (pid {self.procs[1].pid}, exit code {code}) "
            f"while {st.kill_at} was {done}/{total} done"
            + (" (its side effect had already happened)" if st.kill_at in EFFECT_STEPS else "")
        )
        standby = self.procs[2]
        assert standby.stdin is not None
        standby.stdin.write("go\n")
        standby.stdin.flush()
        st.phase = "worker 1 is dead; worker 2 takes over"
        self.say(
            f"worker 2 (pid {standby.pid}), a separate process that never touched this thread, "
            "now resumes it: same thread id, no input"
        )

    def apply(self, worker: int, ev: dict[str, Any]) -> None:
        """Fold one worker event into the display state."""
        st = self.st
        kind = ev["e"]
        if kind == "worker":
            st.pids[worker] = int(ev["pid"])
            st.idempotent = bool(ev.get("idempotent"))
        elif kind == "ready":
            self.say(
                f"worker 2 (pid {st.pids.get(worker)}) is up as a standby: a separate process, "
                "idle until worker 1 dies"
            )
        elif kind == "start":
            st.steps[ev["node"]].runs[worker] = "running"
            st.steps[ev["node"]].progress[worker] = (0, 1)
            if worker == 2 and not self.resumed:
                self._announce_resume(ev["t"])
        elif kind == "progress":
            st.steps[ev["node"]].progress[worker] = (ev["done"], ev["total"])
        elif kind == "end":
            st.steps[ev["node"]].runs[worker] = "done"
        elif kind == "loaded":
            # Steps worker 1 finished that the checkpoint already covers: the resume
            # loads their results instead of running them.
            covered = set(ev["completed"]) | set(ev["finished"])
            for node, v in st.steps.items():
                v.restored = v.runs.get(1) == "done" and node in covered
            self.say(
                f"[bold]worker 2[/] read the checkpoint of step {ev['step']}: "
                f"{len(ev['completed'])} steps complete, "
                f"{len(ev['finished'])} finished in the interrupted step "
                f"({', '.join(ev['finished']) or '-'}); next: {', '.join(ev['next'])}"
            )
        elif kind == "busy":
            if self.busy_since is None:
                self.busy_since = float(ev["t"])
                self.say(
                    "[yellow]ThreadBusyError[/]: the killed worker's lease is still live. "
                    "Waiting for the crashed worker's lease to expire (fencing) ..."
                )
            left = max(0.0, float(ev["expires_in"]))
            st.phase = (
                f"waiting for the crashed worker's lease to expire (fencing): {left:.1f}s left"
            )
        elif kind == "effect":
            if ev.get("replayed"):
                st.steps[ev["node"]].replayed = True
                self.say(
                    f"[bold]{ev['node']}[/] ran again in worker 2, but @idempotent replayed the "
                    f"recorded {ev['kind']} from the ledger: no second {ev['kind']}"
                )
        elif kind == "finished":
            st.phase = "worker 2 finished the pipeline"
        elif kind == "eof":
            self.eof.add(worker)

    def _announce_resume(self, t: float) -> None:
        self.resumed = True
        if self.busy_since is not None:
            self.lease_wait = max(0.0, t - self.busy_since)
            self.say(
                f"lease expired after {self.lease_wait:.1f}s of waiting: worker 2 took the "
                "thread over (new fencing token; the dead worker could no longer write)"
            )
        else:
            self.say(
                "worker 2 found the lease held by a process of this machine that is dead "
                "(its pid is gone) and took the thread over at once with a new fencing "
                "token; a worker on another machine would wait out the "
                f"{self.lease_ttl:g}s lease instead"
            )
        self.st.phase = "worker 2 resumed the thread with graph.invoke(None, config)"
        self.say(
            f"[bold]worker 2[/] (pid {self.st.pids.get(2)}) resumed with graph.invoke(None, config)"
        )


def _stderr_tail(log: Any, lines: int = 15) -> str:
    log.seek(0)
    tail = log.read().splitlines()[-lines:]
    return ("\n" + "\n".join(tail)) if tail else ""


def _should_kill(st: DemoState, conn: psycopg.Connection[Any]) -> bool:
    """Kill worker 1 once the chosen step is half done (an effect step: once its effect
    happened, the first progress tick, leaving the rest of the step as margin) and every
    sibling step that already finished has its writes in Postgres, so what the display
    calls "restored" is restorable. A step that finishes before that point is killed at
    the next."""
    step = st.steps[st.kill_at]
    if 1 not in st.pids:
        return False
    state = step.runs.get(1)
    if state is None:
        return False
    done, total = step.progress.get(1, (0, 1))
    reached = done >= 1 if st.kill_at in EFFECT_STEPS else done * 2 >= total
    if state == "running" and not reached:
        return False
    group = next(g for g in SUPERSTEPS if st.kill_at in g)
    finished = {n for n in group if st.steps[n].runs.get(1) == "done" and n != st.kill_at}
    if state == "running" and not finished <= _persisted_nodes(conn, st.thread_id):
        return False
    # Past the kill step (it finished first on a slow machine): kill now, wherever we are.
    return True


# ====================================================================== rendering
