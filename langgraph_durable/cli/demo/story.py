"""``langgraph-durable demo``: a research pipeline killed with SIGKILL and resumed.

The story of the package in one run. A customer orders a research report; the
pipeline plans, fetches sources, runs four analyses in parallel, charges the customer,
drafts three sections in parallel, assembles the report and emails it. The demo

1. starts a worker process (``python -m langgraph_durable.demo worker``) that runs the
   graph on a ``DurablePostgresSaver``, and a second one as a standby (imported and
   connected, it does not touch the thread until told to);
2. kills worker 1 with a real SIGKILL while a draft section is half written (after its
   sibling sections finished and their writes reached Postgres);
3. tells worker 2 to resume: it meets the dead worker's lease (``ThreadBusyError``),
   waits for it to expire (the fencing that stops two workers from running one
   thread) and resumes with ``graph.invoke(None, config)``;
4. shows, live, which steps were restored from the checkpoint and which ran, and
   counts the payments in a table: the customer is charged exactly once.

Workers report progress as JSON lines on stdout; every step execution is also logged
in ``lgd_demo_step_runs``, so the final verdict comes from the database, not from
what the display saw. Side effects go to ``lgd_demo_payments`` / ``lgd_demo_emails``,
tables that do not deduplicate: a second charge would show up as a second row.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import operator
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from psycopg.rows import dict_row, tuple_row

from langgraph_durable.embedded import ENV_DSN

CUSTOMER = "ACME Robotics"
TOPIC = "warehouse automation market, 2027 outlook"
PRICE_CENTS = 49_900
SOURCES = [
    "industry-report.pdf",
    "analyst-call-transcript.txt",
    "competitor-filings.html",
    "customer-survey.csv",
    "trade-press-roundup.html",
    "patent-search.json",
]
ANALYSES = ["analyze_market", "analyze_competitors", "analyze_risks", "analyze_pricing"]
DRAFTS = ["draft_summary", "draft_findings", "draft_recommendations"]
# Supersteps in execution order (the graph below wires exactly these).
SUPERSTEPS: list[list[str]] = [
    ["plan"],
    ["fetch_sources"],
    ANALYSES,
    ["charge_customer"],
    DRAFTS,
    ["assemble_report"],
    ["email_customer"],
]
STEPS = [node for group in SUPERSTEPS for node in group]
EFFECT_STEPS = ("charge_customer", "email_customer")
DEFAULT_KILL_AT = "draft_recommendations"
# The demo's lease TTL (the saver's default is 30 s): a killed worker's lease stays
# live for up to this long, so the resume visibly waits it out (the fencing), briefly.
DEFAULT_LEASE_TTL = 2.0

# Seconds of simulated work per step (ticks of 0.2 s, scaled by --speed).
DURATIONS = {
    "plan": 0.4,
    "fetch_sources": 1.2,
    "analyze_market": 0.8,
    "analyze_competitors": 1.2,
    "analyze_risks": 1.0,
    "analyze_pricing": 1.4,
    "charge_customer": 1.0,
    "draft_summary": 0.6,
    "draft_findings": 0.8,
    "draft_recommendations": 2.4,
    "assemble_report": 0.4,
    "email_customer": 0.6,
}
TICK = 0.2

DEMO_TABLES_SQL = [
    """CREATE TABLE IF NOT EXISTS lgd_demo_payments (
        id BIGSERIAL PRIMARY KEY,
        thread_id TEXT NOT NULL,
        customer TEXT NOT NULL,
        amount_cents INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        charged_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    """CREATE TABLE IF NOT EXISTS lgd_demo_emails (
        id BIGSERIAL PRIMARY KEY,
        thread_id TEXT NOT NULL,
        recipient TEXT NOT NULL,
        subject TEXT NOT NULL,
        pid INTEGER NOT NULL,
        sent_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    """CREATE TABLE IF NOT EXISTS lgd_demo_step_runs (
        id BIGSERIAL PRIMARY KEY,
        thread_id TEXT NOT NULL,
        node TEXT NOT NULL,
        worker INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        finished_at TIMESTAMPTZ
    )""",
]


# ====================================================================== the graph
def _merge(a: dict[str, str] | None, b: dict[str, str] | None) -> dict[str, str]:
    return {**(a or {}), **(b or {})}


class ResearchState(TypedDict, total=False):
    topic: str
    customer: str
    plan: list[str]
    sources: list[dict[str, str]]
    analyses: Annotated[dict[str, str], _merge]
    receipt: dict[str, Any]
    sections: Annotated[dict[str, str], _merge]
    report: str
    delivery: dict[str, Any]
    log: Annotated[list[str], operator.add]


def _text(seed: str, words: int) -> str:
    """Deterministic filler text (a fetched document, an analysis)."""
    vocab = (
        "robots throughput pallets demand margin capex labor forecast vendor pilot "
        "retrofit software uptime integration shuttle picking sortation growth risk"
    ).split()
    digest = hashlib.sha256(seed.encode()).digest()
    out = []
    for i in range(words):
        if i % 32 == 0:
            digest = hashlib.sha256(digest).digest()
        out.append(vocab[digest[i % 32] % len(vocab)])
    return " ".join(out)


@dataclass
class _WorkerContext:
    """What nodes of the worker process need: where to report and where to write."""

    dsn: str
    worker: int
    speed: float
    out: Any = field(default_factory=lambda: sys.stdout)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def emit(self, event: str, **data: Any) -> None:
        line = json.dumps({"e": event, "t": time.time(), **data})
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True)


_CTX: _WorkerContext | None = None


def _ctx() -> _WorkerContext:
    if _CTX is None:
        raise RuntimeError("demo nodes run inside `python -m langgraph_durable.demo worker`")
    return _CTX


@contextlib.contextmanager
def _step(node: str, thread_id: str) -> Iterator[Callable[[str], None]]:
    """Log the execution in lgd_demo_step_runs and report start / progress / end.

    Yields ``work(note)``: one simulated slice of the step's work, reported as
    progress. The row's ``finished_at`` is set only when the body completes, so a
    step killed mid-way stays unfinished in the log."""
    ctx = _ctx()
    with ctx.connect() as conn:
        row = conn.execute(
            "INSERT INTO lgd_demo_step_runs (thread_id, node, worker, pid) VALUES (%s, %s, %s, %s) "
            "RETURNING id",
            (thread_id, node, ctx.worker, os.getpid()),
        ).fetchone()
    assert row is not None
    run_id = row[0]
    ctx.emit("start", node=node)
    ticks = max(1, round(DURATIONS[node] / TICK))
    done = 0

    def work(note: str = "") -> None:
        nonlocal done
        time.sleep(TICK / ctx.speed)
        done = min(done + 1, ticks)
        ctx.emit("progress", node=node, done=done, total=ticks, note=note)

    yield work
    while done < ticks:
        work()
    with ctx.connect() as conn:
        conn.execute("UPDATE lgd_demo_step_runs SET finished_at = now() WHERE id = %s", (run_id,))
    ctx.emit("end", node=node)


def _thread_id(config: RunnableConfig) -> str:
    return str(config["configurable"]["thread_id"])


# --- side effects ----------------------------------------------------------------
@contextlib.contextmanager
def _effect_conn(conn: psycopg.Connection[Any] | None) -> Iterator[psycopg.Connection[Any]]:
    """The connection an effect writes through: the one @idempotent(transactional=True)
    hands in (the ledger's transaction, so effect and record commit together), else a
    connection of our own."""
    if conn is not None:
        yield conn
        return
    with _ctx().connect() as own:
        yield own


def charge_card(
    thread_id: str, customer: str, amount_cents: int, conn: psycopg.Connection[Any] | None = None
) -> dict[str, Any]:
    """The payment: one row in a table that does NOT deduplicate."""
    with _effect_conn(conn) as c:
        # tuple rows whatever the connection's row factory (the ledger's is dict_row).
        row = (
            c.cursor(row_factory=tuple_row)
            .execute(
                "INSERT INTO lgd_demo_payments (thread_id, customer, amount_cents, pid) "
                "VALUES (%s, %s, %s, %s) RETURNING id",
                (thread_id, customer, amount_cents, os.getpid()),
            )
            .fetchone()
        )
    assert row is not None
    return {
        "payment_id": int(row[0]),
        "amount_cents": amount_cents,
        "customer": customer,
        "pid": os.getpid(),
    }


def send_email(
    thread_id: str, recipient: str, subject: str, conn: psycopg.Connection[Any] | None = None
) -> dict[str, Any]:
    """The delivery: one row per email sent."""
    with _effect_conn(conn) as c:
        # tuple rows whatever the connection's row factory (the ledger's is dict_row).
        row = (
            c.cursor(row_factory=tuple_row)
            .execute(
                "INSERT INTO lgd_demo_emails (thread_id, recipient, subject, pid) "
                "VALUES (%s, %s, %s, %s) RETURNING id",
                (thread_id, recipient, subject, os.getpid()),
            )
            .fetchone()
        )
    assert row is not None
    return {"email_id": int(row[0]), "recipient": recipient, "pid": os.getpid()}


def _idempotent_decorator() -> Callable[..., Any] | None:
    """The package's ``@idempotent`` when this installation has it.

    With it, each effect runs in transactional mode: the row and its ledger record
    commit together, so even a kill inside the effect's node cannot repeat it. Without
    it, the effects still happen once here for a weaker reason: each effect is alone in
    its node, a resume restores a checkpointed node instead of calling it again, and
    the demo then refuses to kill inside an effect node (the window @idempotent
    closes)."""
    for name in ("langgraph_durable.idempotency", "langgraph_durable.idempotent"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        deco = getattr(module, "idempotent", None)
        if callable(deco):
            return deco
    return None


def has_idempotent() -> bool:
    return _idempotent_decorator() is not None


def killable() -> list[str]:
    """Steps the demo may kill worker 1 in: every step when effects are idempotent."""
    return list(STEPS) if has_idempotent() else [s for s in STEPS if s not in EFFECT_STEPS]


def _guarded(fn: Callable[..., Any]) -> tuple[Callable[..., Any], bool]:
    deco = _idempotent_decorator()
    if deco is None:
        return fn, False
    return deco(transactional=True)(fn), True


# --- nodes -----------------------------------------------------------------------
def plan(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
    with _step("plan", _thread_id(config)) as work:
        work("scoping the question")
    return {"plan": list(SOURCES), "log": ["plan"]}


def fetch_sources(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
    docs = []
    with _step("fetch_sources", _thread_id(config)) as work:
        for name in state["plan"]:
            # Each document is a few KB: above the artifact threshold, so it is
            # stored once, by reference, however many checkpoints carry it.
            docs.append({"name": name, "text": _text(name, 600)})
            work(name)
    return {"sources": docs, "log": ["fetch_sources"]}


def _analysis(node: str) -> Callable[[ResearchState, RunnableConfig], dict[str, Any]]:
    def analyze(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
        with _step(node, _thread_id(config)) as work:
            corpus = " ".join(d["text"][:200] for d in state["sources"])
            work("reading sources")
            finding = f"{node.removeprefix('analyze_')}: " + _text(node + corpus, 120)
        return {"analyses": {node: finding}, "log": [node]}

    analyze.__name__ = node
    return analyze


def _charge_node(charge: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def charge_customer(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
        with _step("charge_customer", _thread_id(config)) as work:
            receipt = charge(_thread_id(config), state["customer"], PRICE_CENTS)
            # A receipt made by another process was replayed from the ledger.
            replayed = receipt["pid"] != os.getpid()
            _ctx().emit("effect", kind="payment", node="charge_customer", replayed=replayed)
            work("payment replayed from the ledger" if replayed else "payment captured")
        return {"receipt": receipt, "log": ["charge_customer"]}

    return charge_customer


def _draft(node: str) -> Callable[[ResearchState, RunnableConfig], dict[str, Any]]:
    def draft(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
        with _step(node, _thread_id(config)) as work:
            ticks = max(1, round(DURATIONS[node] / TICK))
            for i in range(ticks):
                work(f"paragraph {i + 1}/{ticks}")
            body = _text(node + "".join(sorted(state["analyses"].values())), 150)
        return {"sections": {node.removeprefix("draft_"): body}, "log": [node]}

    draft.__name__ = node
    return draft


def assemble_report(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
    with _step("assemble_report", _thread_id(config)) as work:
        parts = [f"# {state['topic']}", f"Prepared for {state['customer']}"]
        for name in ("summary", "findings", "recommendations"):
            parts += [f"## {name.title()}", state["sections"][name]]
        work("typesetting")
    return {"report": "\n\n".join(parts), "log": ["assemble_report"]}


def _email_node(send: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def email_customer(state: ResearchState, config: RunnableConfig) -> dict[str, Any]:
        with _step("email_customer", _thread_id(config)) as work:
            sent = send(_thread_id(config), state["customer"], f"Your report: {state['topic']}")
            replayed = sent["pid"] != os.getpid()
            _ctx().emit("effect", kind="email", node="email_customer", replayed=replayed)
            work("email replayed from the ledger" if replayed else "delivered")
        return {"delivery": sent, "log": ["email_customer"]}

    return email_customer


def build_graph() -> tuple[Any, bool]:
    """The pipeline's ``StateGraph`` builder, and whether effects use @idempotent."""
    from langgraph.graph import END, START, StateGraph

    charge, guarded = _guarded(charge_card)
    send, _ = _guarded(send_email)
    # Any: the node factories' closures are beyond StateGraph's overloads.
    builder: Any = StateGraph(ResearchState)
    builder.add_node("plan", plan)
    builder.add_node("fetch_sources", fetch_sources)
    for node in ANALYSES:
        builder.add_node(node, _analysis(node))
    builder.add_node("charge_customer", _charge_node(charge))
    for node in DRAFTS:
        builder.add_node(node, _draft(node))
    builder.add_node("assemble_report", assemble_report)
    builder.add_node("email_customer", _email_node(send))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "fetch_sources")
    for node in ANALYSES:
        builder.add_edge("fetch_sources", node)
    builder.add_edge(ANALYSES, "charge_customer")
    for node in DRAFTS:
        builder.add_edge("charge_customer", node)
    builder.add_edge(DRAFTS, "assemble_report")
    builder.add_edge("assemble_report", "email_customer")
    builder.add_edge("email_customer", END)
    return builder, guarded


# ====================================================================== the worker
def worker_main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process: start the run, or resume it."""
    parser = argparse.ArgumentParser(prog="python -m langgraph_durable.demo worker")
    parser.add_argument("--thread-id", required=True)
    parser.add_argument("--phase", choices=("start", "resume"), required=True)
    parser.add_argument("--lease-ttl", type=float, default=DEFAULT_LEASE_TTL)
    parser.add_argument("--speed", type=float, default=1.0)
    args = parser.parse_args(argv)
    # The DSN comes through the environment, not argv: argv is visible to every user
    # of the machine (ps), and a DSN may carry a password.
    dsn = os.environ.get(ENV_DSN)
    if not dsn:
        print(f"{ENV_DSN} is not set", file=sys.stderr)
        return 2
    global _CTX
    _CTX = _WorkerContext(dsn=dsn, worker=1 if args.phase == "start" else 2, speed=args.speed)
    ctx = _CTX

    from langgraph_durable import DurablePostgresSaver, ThreadBusyError

    builder, guarded = build_graph()
    ctx.emit("worker", pid=os.getpid(), phase=args.phase, idempotent=guarded)
    config: Any = {"configurable": {"thread_id": args.thread_id}}
    with DurablePostgresSaver.from_conn_string(dsn, lease_ttl=args.lease_ttl) as saver:
        graph = builder.compile(checkpointer=saver)
        if args.phase == "start":
            graph.invoke(
                {"topic": TOPIC, "customer": CUSTOMER, "log": []}, config, durability="sync"
            )
        else:
            # Standby: everything is imported and connected; wait for the driver's
            # "go" (sent right after the SIGKILL), so the resume meets the dead
            # worker's lease however slow this machine starts Python.
            ctx.emit("ready")
            if sys.stdin.readline().strip() != "go":
                return 0
            snapshot = graph.get_state(config)
            ctx.emit(
                "loaded",
                step=(snapshot.metadata or {}).get("step"),
                next=list(snapshot.next),
                finished=[t.name for t in snapshot.tasks if t.result is not None],
                completed=list((snapshot.values or {}).get("log", [])),
            )
            # A lease that outlives several TTLs belongs to a live worker, not the
            # dead one: give up rather than wait forever.
            give_up = time.monotonic() + 4 * args.lease_ttl + 10
            while True:
                try:
                    graph.invoke(None, config, durability="sync")
                    break
                except ThreadBusyError as exc:
                    if time.monotonic() > give_up:
                        raise
                    # The killed worker's lease is still live: no second worker may run
                    # this thread until it expires (fencing). Wait, then take over.
                    left = float(getattr(exc, "expires_in", None) or 0.0)
                    ctx.emit("busy", expires_in=left, owner=getattr(exc, "owner", None))
                    time.sleep(min(max(left, 0.05), 0.25))
        final = graph.get_state(config)
        ctx.emit(
            "finished",
            report_chars=len((final.values or {}).get("report", "")),
            next=list(final.next),
        )
    return 0


# ====================================================================== the driver
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
        sys.executable, "-m", "langgraph_durable.demo", "worker",
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
    from langgraph_durable.inspect import node_of

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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:])
    print("usage: python -m langgraph_durable.demo worker ... (run `langgraph-durable demo`)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
