"""Storage benchmark of artifact-by-reference compaction (issue #5).

Three contenders, side by side in ONE run on the SAME PostgreSQL, each in a database
of its own (so ``pg_total_relation_size`` of every table counts only its rows):

* ``stock``  -- ``langgraph.checkpoint.postgres.PostgresSaver``, ``operator.add`` lists;
* ``delta``  -- the stock saver with the list fields declared as LangGraph's
  ``DeltaChannel`` (beta; the user changes the state schema);
* ``durable`` -- ``DurablePostgresSaver`` with its defaults, the unchanged schema.

Workloads (sizes from the issue):

* chat: a 200-turn chat of 1.5 KB messages next to 50 documents of 20 KB; bytes are
  measured (after VACUUM) every 25 turns, the latest checkpoint's load time at the end;
* research: 60 fetched sources of 8 KB, 4 analyses and a synthesis, in 10 threads that
  fetch the same sources;
* small state: a loop graph whose state never crosses the threshold, durability "sync":
  median time per superstep, and per short invoke (lease taken and released).

Run: ``python bench/bench_storage.py [--dsn postgresql://...] [--quick]``; prints one
table, writes ``bench/storage_bytes_vs_turns.png`` and ``bench/storage_results.json``.
"""

from __future__ import annotations

import argparse
import gc as pygc
import json
import operator
import os
import random
import statistics
import string
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from psycopg import conninfo as ci

from langgraph_durable import ArtifactConfig, DurablePostgresSaver
from langgraph_durable.artifacts import ArtifactCodec

HERE = Path(__file__).resolve().parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"

# --------------------------------------------------------------------------- data

_VOCAB_RNG = random.Random(7)
VOCAB = [
    "".join(_VOCAB_RNG.choices(string.ascii_lowercase, k=_VOCAB_RNG.randint(2, 11)))
    for _ in range(4000)
]
_WEIGHTS = [1 / (i + 1) for i in range(len(VOCAB))]
_TOKENS = string.ascii_letters + string.digits + "     "

# Two kinds of content (--content):
# * "tokens" (default): random letters, digits and spaces (ids, code, tool output). The
#   stock saver's pglz cannot compress it, which is what the reference run
#   measured (35.3 MB at 200 turns; this workload gives the stock saver ~40 MB);
# * "prose": pseudo-words with a Zipf frequency, compressible like English (zstd ~3x,
#   pglz ~2x): the stock saver stores about half as much, the package a bit less too.
CONTENT = "tokens"


def text(seed: str, size: int) -> str:
    rng = random.Random(seed)
    if CONTENT == "tokens":
        return "".join(rng.choices(_TOKENS, k=size))
    out: list[str] = []
    n = 0
    while n < size:
        s = " ".join(rng.choices(VOCAB, _WEIGHTS, k=24)) + ". "
        out.append(s)
        n += len(s)
    return "".join(out)[:size]


MSG_SIZE = 1536
DOC_SIZE = 20 * 1024
N_DOCS = 50
SOURCE_SIZE = 8 * 1024
N_SOURCES = 60
N_ANALYSES = 4


def concat(state: list[Any], writes: Sequence[list[Any]]) -> list[Any]:
    """``operator.add`` in the batched form ``DeltaChannel`` wants."""
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


# --------------------------------------------------------------------------- graphs


def chat_graph(delta: bool) -> StateGraph:
    if delta:

        class DeltaChat(TypedDict, total=False):
            messages: Annotated[list[Any], DeltaChannel(concat)]
            documents: list[str]
            turn: int

        state: Any = DeltaChat
    else:

        class Chat(TypedDict, total=False):
            messages: Annotated[list[Any], operator.add]
            documents: list[str]
            turn: int

        state = Chat

    def chat(s: dict[str, Any]) -> dict[str, Any]:
        # One message per turn, user and assistant alternating (0.3 MB at 200 turns).
        i = s["turn"]
        cls = HumanMessage if i % 2 == 0 else AIMessage
        return {"messages": [cls(content=text(f"msg-{i}", MSG_SIZE), id=f"m{i}")]}

    g = StateGraph(state)
    g.add_node("chat", chat)
    g.add_edge(START, "chat")
    g.add_edge("chat", END)
    return g


def research_graph(delta: bool) -> StateGraph:
    if delta:

        class DeltaResearch(TypedDict, total=False):
            topic: str
            round: int
            sources: Annotated[list[str], DeltaChannel(concat)]
            analyses: Annotated[list[str], DeltaChannel(concat)]
            synthesis: str

        state: Any = DeltaResearch
    else:

        class Research(TypedDict, total=False):
            topic: str
            round: int
            sources: Annotated[list[str], operator.add]
            analyses: Annotated[list[str], operator.add]
            synthesis: str

        state = Research

    per_round = 10

    def plan(s: dict[str, Any]) -> dict[str, Any]:
        return {"round": s.get("round", 0) + 1}

    def fan_fetch(s: dict[str, Any]) -> list[Send]:
        r = s["round"] - 1
        return [Send("fetch", {"i": r * per_round + k}) for k in range(per_round)]

    def fetch(s: dict[str, Any]) -> dict[str, Any]:
        # Every thread fetches the same 60 sources: the same bytes.
        return {"sources": [text(f"source-{s['i']}", SOURCE_SIZE)]}

    def after_fetch(s: dict[str, Any]) -> str:
        return "plan" if len(s["sources"]) < N_SOURCES else "fan_analyze"

    def gather(s: dict[str, Any]) -> dict[str, Any]:
        return {}

    def fan_analyze(s: dict[str, Any]) -> list[Send]:
        return [Send("analyze", {"topic": s["topic"], "k": k}) for k in range(N_ANALYSES)]

    def analyze(s: dict[str, Any]) -> dict[str, Any]:
        return {"analyses": [text(f"{s['topic']}-analysis-{s['k']}", 4096)]}

    def synthesize(s: dict[str, Any]) -> dict[str, Any]:
        return {"synthesis": text(f"{s['topic']}-synthesis", 6144)}

    g = StateGraph(state)
    g.add_node("plan", plan)
    g.add_node("fetch", fetch)
    g.add_node("gather", gather)
    g.add_node("analyze", analyze)
    g.add_node("synthesize", synthesize)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", fan_fetch, ["fetch"])
    g.add_edge("fetch", "gather")
    g.add_conditional_edges("gather", after_fetch, {"plan": "plan", "fan_analyze": "gather_analyses"})
    g.add_node("gather_analyses", gather)
    g.add_conditional_edges("gather_analyses", fan_analyze, ["analyze"])
    g.add_edge("analyze", "synthesize")
    g.add_edge("synthesize", END)
    return g


class Small(TypedDict, total=False):
    n: int
    note: str
    tags: list[str]


def small_graph(steps: int, stamps: list[float]) -> StateGraph:
    def step(s: Small) -> dict[str, Any]:
        stamps.append(time.perf_counter())
        n = s.get("n", 0) + 1
        return {"n": n, "note": f"step {n}", "tags": [f"t{n % 7}", f"u{n % 5}"]}

    g = StateGraph(Small)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] % steps else END, ["step", END])
    return g


# --------------------------------------------------------------------------- contenders


@dataclass
class Contender:
    name: str
    label: str
    delta: bool
    opener: Callable[[str], Any]
    results: dict[str, Any] = field(default_factory=dict)


@contextmanager
def open_stock(dsn: str) -> Iterator[PostgresSaver]:
    with PostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
        yield saver


@contextmanager
def open_durable(dsn: str, **options: Any) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn, **options) as saver:
        saver.setup()
        yield saver


def durable_with(threshold: int | None, chunk: int, level: int) -> Callable[[str], Any]:
    """An opener for a package saver with a given artifact configuration (--sweep)."""

    @contextmanager
    def opener(dsn: str) -> Iterator[DurablePostgresSaver]:
        with DurablePostgresSaver.from_conn_string(
            dsn, artifact_threshold=threshold, compression_level=level
        ) as saver:
            saver.setup()
            # chunk_size is a codec setting (ArtifactConfig), not a saver argument.
            saver.codec = ArtifactCodec(
                ArtifactConfig(threshold=threshold, compression_level=level, chunk_size=chunk)
            )
            yield saver

    return opener


# (label, threshold, chunk size, zstd level); the default is ArtifactConfig()'s.
SWEEP = [
    ("threshold 256", 256, 16, 3),
    ("threshold 512", 512, 16, 3),
    ("threshold 1024 (default)", 1024, 16, 3),
    ("threshold 2048", 2048, 16, 3),
    ("threshold 4096", 4096, 16, 3),
    ("chunk 8", 1024, 8, 3),
    ("chunk 32", 1024, 32, 3),
    ("chunk 64", 1024, 64, 3),
    ("zstd level 1", 1024, 16, 1),
    ("zstd level 9", 1024, 16, 9),
    ("zstd level 19", 1024, 16, 19),
]


def run_sweep(admin: str, turns: int, loads: int, threads: int) -> str:
    """The package alone under each SWEEP configuration: what the defaults rest on."""
    lines = [
        f"{'configuration':<26} | chat {turns // 2:>3} | chat {turns:>3} | ratio | research | "
        "load cold ms | chat write s"
    ]
    for label, threshold, chunk, level in SWEEP:
        c = Contender("durable", label, False, durable_with(threshold, chunk, level))
        dsn = make_db(admin, "sweep_chat")
        try:
            t0 = time.perf_counter()
            run_chat(c, dsn, turns, turns // 2, loads)
            write_s = time.perf_counter() - t0
        finally:
            drop_db(admin, dsn)
        dsn = make_db(admin, "sweep_research")
        try:
            run_research(c, dsn, threads)
        finally:
            drop_db(admin, dsn)
        b = c.results["chat_bytes"]
        lines.append(
            f"{label:<26} | {mb(b[turns // 2]):>8} | {mb(b[turns]):>8} | "
            f"{b[turns] / b[turns // 2]:.2f}x | {mb(c.results['research_bytes']):>8} | "
            f"{c.results['load_cold_ms']:>12.1f} | {write_s:>12.1f}"
        )
        print(lines[-1], file=sys.stderr)
    return "\n".join(lines)


def contenders() -> list[Contender]:
    return [
        Contender("stock", "stock PostgresSaver", False, open_stock),
        Contender("delta", "stock + DeltaChannel", True, open_stock),
        Contender("durable", "langgraph-durable", False, open_durable),
    ]


# --------------------------------------------------------------------------- databases


def make_db(admin: str, label: str) -> str:
    name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    params = ci.conninfo_to_dict(admin)
    params["dbname"] = name
    return ci.make_conninfo(**params)


def drop_db(admin: str, dsn: str) -> None:
    name = ci.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
        )


# The tables the workloads write to, directly or through a trigger (the status counts)
# or once per graph (the version registry); the others -- migration bookkeeping, the
# empty quarantine, ledger, audit, worker and secret tables -- hold no workload data; all
# tables are in the JSON. Before stop 32 the counts and registry (~0.15 MB at 200 chat
# turns) were left out of this sum.
WRITTEN = (
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
    "durable_artifacts",
    "durable_artifact_refs",
    "durable_threads",
    "durable_thread_counts",
    "durable_graph_versions",
)


def written_bytes(tables: dict[str, int]) -> int:
    return sum(n for name, n in tables.items() if name in WRITTEN)


def storage_bytes(dsn: str) -> dict[str, int]:
    """VACUUM, then pg_total_relation_size (heap + TOAST + indexes + free-space and
    visibility maps) of every table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM")
        rows = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = 'public'"
        ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


# --------------------------------------------------------------------------- workloads


def run_chat(c: Contender, dsn: str, turns: int, every: int, loads: int) -> None:
    sizes: dict[int, int] = {}
    with c.opener(dsn) as saver:
        graph = chat_graph(c.delta).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "chat"}}
        docs = [text(f"doc-{i}", DOC_SIZE) for i in range(N_DOCS)]
        turn_s: list[float] = []
        for i in range(turns):
            update: dict[str, Any] = {"turn": i}
            if i == 0:
                update["documents"] = docs
            t0 = time.perf_counter()
            graph.invoke(update, cfg, durability="sync")
            turn_s.append(time.perf_counter() - t0)
            if (i + 1) % every == 0:
                sizes[i + 1] = written_bytes(storage_bytes(dsn))
        c.results["chat_bytes"] = sizes
        # Write cost of a turn late in the chat (the list is long by then).
        c.results["chat_turn_ms"] = statistics.median(turn_s[-25:]) * 1000
        c.results["chat_tables"] = storage_bytes(dsn)
        state = graph.get_state(cfg).values
        assert len(state["messages"]) == turns and len(state["documents"]) == N_DOCS
    # Load times: a fresh saver per measurement (cold artifact cache) and one warm saver.
    cold: list[float] = []
    for _ in range(loads):
        with c.opener(dsn) as saver:
            graph = chat_graph(c.delta).compile(checkpointer=saver)
            t0 = time.perf_counter()
            snap = graph.get_state(cfg)
            cold.append(time.perf_counter() - t0)
            assert len(snap.values["messages"]) == turns
    warm: list[float] = []
    with c.opener(dsn) as saver:
        graph = chat_graph(c.delta).compile(checkpointer=saver)
        graph.get_state(cfg)
        for _ in range(loads):
            t0 = time.perf_counter()
            graph.get_state(cfg)
            warm.append(time.perf_counter() - t0)
    c.results["load_cold_ms"] = statistics.median(cold) * 1000
    c.results["load_warm_ms"] = statistics.median(warm) * 1000


def run_research(c: Contender, dsn: str, threads: int) -> None:
    with c.opener(dsn) as saver:
        graph = research_graph(c.delta).compile(checkpointer=saver)

        def one(t: int) -> None:
            cfg = {"configurable": {"thread_id": f"research-{t}"}, "recursion_limit": 100}
            out = graph.invoke({"topic": f"topic-{t}"}, cfg, durability="sync")
            assert len(out["sources"]) == N_SOURCES and len(out["analyses"]) == N_ANALYSES

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(threads)))
    tables = storage_bytes(dsn)
    c.results["research_bytes"] = written_bytes(tables)
    c.results["research_tables"] = tables


def run_small(cs: Sequence[Contender], dsns: dict[str, str], rounds: int, steps: int) -> None:
    """Interleaved rounds (contenders alternate, order flipped each round) so machine
    noise hits all alike; one warm-up round is not counted. Per step: the time between
    two node calls (one superstep: the task's put_writes and the checkpoint's put, with
    durability "sync"). Also reported: the median over rounds of each round's ratio to
    the stock saver, which cancels slow drifts of a shared machine."""
    per_step: dict[str, list[float]] = {c.name: [] for c in cs}
    per_invoke: dict[str, list[float]] = {c.name: [] for c in cs}
    round_medians: dict[str, list[float]] = {c.name: [] for c in cs}
    stack = {}
    for c in cs:
        cm = c.opener(dsns[c.name])
        stack[c.name] = (cm, cm.__enter__())
    try:
        for r in range(rounds + 1):
            for c in cs if r % 2 == 0 else list(reversed(cs)):
                saver = stack[c.name][1]
                stamps: list[float] = []
                graph = small_graph(steps, stamps).compile(checkpointer=saver)
                cfg = {"configurable": {"thread_id": f"small-{r}"}, "recursion_limit": steps + 5}
                pygc.collect()
                t0 = time.perf_counter()
                graph.invoke({"n": 0}, cfg, durability="sync")
                elapsed = time.perf_counter() - t0
                if r == 0:
                    continue
                deltas = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
                per_invoke[c.name].append(elapsed)
                per_step[c.name].extend(deltas)
                round_medians[c.name].append(statistics.median(deltas))
    finally:
        for cm, _ in stack.values():
            cm.__exit__(None, None, None)
    base = round_medians[cs[0].name]
    for c in cs:
        c.results["small_step_ms"] = statistics.median(per_step[c.name]) * 1000
        c.results["small_invoke_ms"] = statistics.median(per_invoke[c.name]) * 1000
        c.results["small_step_ratio"] = statistics.median(
            x / y for x, y in zip(round_medians[c.name], base, strict=True)
        )


# --------------------------------------------------------------------------- report


def mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def report(cs: list[Contender], turns: int) -> str:
    by = {c.name: c.results for c in cs}
    s, d, p = by["stock"], by["delta"], by["durable"]
    mid = turns // 2
    quarter = turns // 4
    rows: list[tuple[str, str, str, str, str]] = []

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "-"

    for n in (quarter, mid, turns):
        rows.append(
            (
                f"chat {n} turns: bytes",
                mb(s["chat_bytes"][n]),
                mb(d["chat_bytes"][n]),
                mb(p["chat_bytes"][n]),
                f"stock/pkg {ratio(s['chat_bytes'][n], p['chat_bytes'][n])}",
            )
        )
    rows.append(
        (
            f"chat {turns} turns: all tables",
            mb(sum(s["chat_tables"].values())),
            mb(sum(d["chat_tables"].values())),
            mb(sum(p["chat_tables"].values())),
            "incl. empty bookkeeping tables: stock/pkg "
            + ratio(sum(s["chat_tables"].values()), sum(p["chat_tables"].values())),
        )
    )
    rows.append(
        (
            f"chat bytes({turns})/bytes({mid})",
            ratio(s["chat_bytes"][turns], s["chat_bytes"][mid]),
            ratio(d["chat_bytes"][turns], d["chat_bytes"][mid]),
            ratio(p["chat_bytes"][turns], p["chat_bytes"][mid]),
            "target pkg <= 2.2",
        )
    )
    rows.append(
        (
            "research, 10 threads: bytes",
            mb(s["research_bytes"]),
            mb(d["research_bytes"]),
            mb(p["research_bytes"]),
            f"stock/pkg {ratio(s['research_bytes'], p['research_bytes'])} (target >= 5)",
        )
    )
    rows.append(
        (
            "small state: median ms/step",
            f"{s['small_step_ms']:.2f}",
            f"{d['small_step_ms']:.2f}",
            f"{p['small_step_ms']:.2f}",
            f"pkg/stock {ratio(p['small_step_ms'], s['small_step_ms'])}, per round "
            f"{p['small_step_ratio']:.2f}x (target <= 1.10)",
        )
    )
    rows.append(
        (
            "small state: median ms/invoke",
            f"{s['small_invoke_ms']:.2f}",
            f"{d['small_invoke_ms']:.2f}",
            f"{p['small_invoke_ms']:.2f}",
            f"pkg/stock {ratio(p['small_invoke_ms'], s['small_invoke_ms'])} (lease in+out)",
        )
    )
    rows.append(
        (
            "chat: median ms per turn (last 25 turns)",
            f"{s['chat_turn_ms']:.1f}",
            f"{d['chat_turn_ms']:.1f}",
            f"{p['chat_turn_ms']:.1f}",
            f"pkg/stock {ratio(p['chat_turn_ms'], s['chat_turn_ms'])}",
        )
    )
    for key, what in (("load_cold_ms", "fresh saver"), ("load_warm_ms", "warm saver")):
        rows.append(
            (
                f"load latest ({turns} turns), {what}: ms",
                f"{s[key]:.1f}",
                f"{d[key]:.1f}",
                f"{p[key]:.1f}",
                f"pkg/stock {ratio(p[key], s[key])} (target <= 1.0)",
            )
        )
    head = ("", "stock", "DeltaChannel", "langgraph-durable", "")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def plot(cs: list[Contender], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for c, style in zip(cs, ("o-", "s-", "^-"), strict=True):
        pts = sorted(c.results["chat_bytes"].items())
        ax.plot([t for t, _ in pts], [b / 1e6 for _, b in pts], style, label=c.label, markersize=4)
    ax.set_xlabel("chat turns (1.5 KB messages, next to 50 x 20 KB documents)")
    ax.set_ylabel("MB on disk (tables written, after VACUUM)")
    ax.set_title("Checkpoint storage against chat length")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def run_once(cs: list[Contender], only: set[str], args: argparse.Namespace) -> None:
    dbs: list[str] = []
    try:
        if "chat" in only:
            for c in cs:
                dsn = make_db(args.dsn, f"chat_{c.name}")
                dbs.append(dsn)
                run_chat(c, dsn, args.turns, args.every, args.loads)
                print(f"chat {c.name}: {c.results['chat_bytes']}", file=sys.stderr)
        if "research" in only:
            for c in cs:
                dsn = make_db(args.dsn, f"research_{c.name}")
                dbs.append(dsn)
                run_research(c, dsn, args.threads)
                print(f"research {c.name}: {c.results['research_bytes']}", file=sys.stderr)
        if "small" in only:
            dsns = {}
            for c in cs:
                dsns[c.name] = make_db(args.dsn, f"small_{c.name}")
                dbs.append(dsns[c.name])
            run_small(cs, dsns, args.rounds, args.steps)
    finally:
        for dsn in dbs:
            drop_db(args.dsn, dsn)


def median_of(runs: list[list[Contender]]) -> list[Contender]:
    """Per contender, the median of every figure over the runs (bytes barely vary;
    times do, on a shared machine)."""
    out = contenders()
    for i, c in enumerate(out):
        results = [run[i].results for run in runs]
        for key, value in results[0].items():
            if isinstance(value, int | float):
                c.results[key] = statistics.median(r[key] for r in results)
            elif key == "chat_bytes":
                c.results[key] = {
                    n: statistics.median(r[key][n] for r in results) for n in value
                }
            else:
                c.results[key] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("LANGGRAPH_DURABLE_BENCH_DSN", DEFAULT_DSN))
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--loads", type=int, default=15)
    ap.add_argument("--threads", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=16, help="small-state rounds per contender")
    ap.add_argument("--steps", type=int, default=40, help="supersteps per small-state invoke")
    ap.add_argument("--only", default="", help="comma list of workloads: chat,research,small")
    ap.add_argument("--content", choices=("tokens", "prose"), default="tokens")
    ap.add_argument("--sweep", action="store_true", help="only the package, per artifact setting")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    ap.add_argument("--repeat", type=int, default=3, help="runs; the table shows medians")
    args = ap.parse_args(argv)
    if args.turns % 4 or args.turns % args.every:
        ap.error("--turns must be a multiple of 4 and of --every")
    only = set(filter(None, args.only.split(","))) or {"chat", "research", "small"}
    global CONTENT
    CONTENT = args.content
    if args.sweep:
        print(run_sweep(args.dsn, args.turns, args.loads, args.threads))
        return 0
    if args.plot_only:
        saved = json.loads((HERE / "storage_results.json").read_text())
        cs = contenders()
        for c in cs:
            c.results = saved[c.name]
            c.results["chat_bytes"] = {int(k): v for k, v in c.results["chat_bytes"].items()}
        plot(cs, HERE / "storage_bytes_vs_turns.png")
        return 0
    runs: list[list[Contender]] = []
    for rep in range(args.repeat):
        cs = contenders()
        run_once(cs, only, args)
        runs.append(cs)
        print(f"run {rep + 1}/{args.repeat} done", file=sys.stderr)
    cs = median_of(runs)
    out: dict[str, Any] = {c.name: c.results for c in cs}
    out["runs"] = [{c.name: c.results for c in run} for run in runs]
    out["settings"] = {k: v for k, v in vars(args).items() if k != "dsn"}
    if only == {"chat", "research", "small"}:
        print(f"median of {args.repeat} run(s), content={args.content}")
        print(report(cs, args.turns))
        name = "storage_results.json" if args.content == "tokens" else f"storage_results_{args.content}.json"
        (HERE / name).write_text(json.dumps(out, indent=2, default=str) + "\n")
        if not args.no_plot and args.content == "tokens":
            plot(cs, HERE / "storage_bytes_vs_turns.png")
    else:
        print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
