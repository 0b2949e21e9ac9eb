"""`langgraph-durable demo` end to end: a real worker process killed with SIGKILL,
resumed by a new process, against the test database.

The command runs as a subprocess (the console script of this interpreter), and the
verdict is checked twice: in what the demo prints, and in the database it wrote
(payments, emails, the per-step execution log, the thread's row and final state).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.cli.demo import STEPS

CLI = str(Path(sys.executable).with_name("langgraph-durable"))


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    # COLUMNS: a wide console, so assertions never depend on where rich wraps lines.
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LANGGRAPH_DURABLE_DSN", None)
    # The timeout only stops a hung demo from hanging the suite; nothing is timed.
    return subprocess.run(
        [CLI, "demo", *args], capture_output=True, text=True, env=env, timeout=600
    )


def step_runs(dsn: str, thread_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT node, worker, pid, finished_at IS NOT NULL AS finished "
            "FROM lgd_demo_step_runs WHERE thread_id = %s ORDER BY id",
            (thread_id,),
        ).fetchall()


def count(dsn: str, table: str, thread_id: str) -> int:
    query = {
        "payments": "SELECT count(*) FROM lgd_demo_payments WHERE thread_id = %s",
        "emails": "SELECT count(*) FROM lgd_demo_emails WHERE thread_id = %s",
    }[table]
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, (thread_id,)).fetchone()
    assert row is not None
    return int(row[0])


def final_state(dsn: str, thread_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        saved = saver.get_tuple({"configurable": {"thread_id": thread_id}})
        assert saved is not None
        with saver.connection() as conn:
            row = conn.execute(
                "SELECT status, lease_owner, lease_token FROM durable_threads WHERE thread_id = %s",
                (thread_id,),
            ).fetchone()
    assert row is not None
    return dict(saved.checkpoint["channel_values"]), dict(row)


def test_demo_kills_resumes_and_charges_once(dsn: str) -> None:
    tid = "demo-default"
    proc = demo("--dsn", dsn, "--thread-id", tid)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr

    # What the user sees.
    assert "SIGKILL sent to worker 1" in out and "exit code -9" in out
    # Fencing: the killed worker is a dead process of this machine, so the standby takes
    # its lease over at once with a new token (a remote worker would wait it out).
    assert "took the thread over at once with a new fencing" in " ".join(out.split())
    assert "resumed with graph.invoke(None, config)" in out
    assert "↺ restored from checkpoint" in out
    assert "re-executed (was in flight)" in out
    assert f"payments for thread {tid}: 1 (exactly once" in out
    assert "emails sent: 1" in out

    # What the database says.
    assert count(dsn, "payments", tid) == 1
    assert count(dsn, "emails", tid) == 1
    runs = step_runs(dsn, tid)
    assert {r["node"] for r in runs if r["finished"]} == set(STEPS)  # every step done
    pids = {w: {r["pid"] for r in runs if r["worker"] == w} for w in (1, 2)}
    assert len(pids[1]) == 1 and len(pids[2]) == 1 and pids[1] != pids[2]
    restored = [n for n in STEPS if {r["worker"] for r in runs if r["node"] == n} == {1}]
    # Everything before the kill point, the payment included, ran once, in worker 1.
    assert restored == STEPS[: STEPS.index("draft_recommendations")]
    killed = [r for r in runs if r["node"] == "draft_recommendations"]
    assert [(r["worker"], r["finished"]) for r in killed] == [(1, False), (2, True)]
    for node in ("assemble_report", "email_customer"):
        assert [r["worker"] for r in runs if r["node"] == node] == [2]

    values, thread = final_state(dsn, tid)
    assert thread["status"] == "done" and thread["lease_owner"] is None
    assert thread["lease_token"] == 2  # one takeover: worker 2 fenced worker 1 out
    assert sorted(values["log"]) == sorted(STEPS)  # each step's result recorded once
    assert values["receipt"]["amount_cents"] == 49_900
    assert values["report"].startswith("# warehouse automation")


def test_demo_json_kill_inside_the_payment_step(dsn: str) -> None:
    """Killed inside charge_customer, after the charge committed and before the step's
    writes were checkpointed: the step runs again in worker 2 and @idempotent replays
    the recorded payment instead of charging a second time. Reported as JSON."""
    tid = "demo-charge"
    proc = demo("--dsn", dsn, "--thread-id", tid, "--kill-at", "charge_customer", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["thread_id"] == tid and summary["kill_at"] == "charge_customer"
    assert summary["idempotent"] is True
    assert summary["payments"] == 1 == count(dsn, "payments", tid)
    assert summary["emails"] == 1 == count(dsn, "emails", tid)
    assert summary["all_steps_done"] and summary["status"] == "done"
    assert summary["re_executed"] == ["charge_customer"]
    assert summary["effects_replayed"] == ["charge_customer"]
    assert summary["restored"] == STEPS[: STEPS.index("charge_customer")]
    assert summary["ran_twice"] == []
    assert summary["killed_pid"] != summary["resumed_pid"]

    runs = step_runs(dsn, tid)
    charge_runs = [(r["worker"], r["finished"]) for r in runs if r["node"] == "charge_customer"]
    assert charge_runs == [(1, False), (2, True)]  # it really did run twice...
    with psycopg.connect(dsn) as conn:
        payers = conn.execute(
            "SELECT pid FROM lgd_demo_payments WHERE thread_id = %s", (tid,)
        ).fetchall()
    assert payers == [(summary["killed_pid"],)]  # ...and charged once, in worker 1
    values, thread = final_state(dsn, tid)
    assert values["receipt"]["pid"] == summary["killed_pid"]
    assert sorted(values["log"]) == sorted(STEPS)


def test_demo_refuses_a_used_thread_and_bad_kill_point(dsn: str) -> None:
    used = demo("--dsn", dsn, "--thread-id", "demo-default")
    assert used.returncode == 1
    assert "already has checkpoints" in used.stderr
    bad = demo("--dsn", dsn, "--kill-at", "no_such_step")
    assert bad.returncode == 2
    assert "--kill-at" in bad.stderr


@pytest.mark.parametrize("argv", [["worker"], []])
def test_worker_entry_point_needs_its_arguments(argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LANGGRAPH_DURABLE_DSN"}
    proc = subprocess.run(
        [sys.executable, "-m", "langgraph_durable.cli.demo", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
