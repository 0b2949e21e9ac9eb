"""The demo's story: a research pipeline whose side effects (a charge, an email)
must happen exactly once however the worker running it dies."""


from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from psycopg.rows import tuple_row

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
        raise RuntimeError("demo nodes run inside `python -m langgraph_durable.cli.demo worker`")
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


def killable() -> list[str]:
    """Steps the demo may kill worker 1 in: every step, effects included (they are
    @idempotent, see ``_guarded``)."""
    return list(STEPS)


def _guarded(fn: Callable[..., Any]) -> tuple[Callable[..., Any], bool]:
    """``fn`` under the package's ``@idempotent`` in transactional mode: the effect's
    row and its ledger record commit together, so even a kill inside the effect's node
    cannot repeat it."""
    from langgraph_durable.idempotency import idempotent

    return idempotent(transactional=True)(fn), True


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
