"""The cost of encryption at rest (issue 27): the package beside the stock saver, each with
and without the same encrypting serializer, in ONE run on the same PostgreSQL.

Contenders (each in a database of its own, taking turns in rounds so load from elsewhere
on a shared machine hits them alike):

* ``stock``           -- ``PostgresSaver`` with its default serializer;
* ``stock+aes``       -- ``PostgresSaver(serde=EncryptedSerializer.from_pycryptodome_aes(...))``;
* ``durable``         -- ``DurablePostgresSaver``;
* ``durable+aes``     -- ``DurablePostgresSaver`` with that same serializer (values, metadata
  user keys, inline values moved to blobs, the package's own columns sealed);
* ``durable+rotated`` -- ``DurableEncryptedSerializer(new, old=[old])`` (a rotation in
  progress: writes the new key, reads both).

Measured: ``put`` (a checkpoint of a chat step: messages, a dict, small strings, with user
metadata), ``get_tuple`` of the latest checkpoint, ``invoke`` (a 6-node graph, a new thread
each time: the run start, six puts, the writes, the run end), as median milliseconds, and
the storage bytes (``pg_total_relation_size`` of every table) after the same chat threads.

    PYTHONPATH=$PWD python bench/bench_encryption.py [--dsn ...] [--rounds 30] [--threads 20]
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from psycopg import conninfo as ci
from psycopg.rows import dict_row

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.keyring import DurableEncryptedSerializer

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
KEY, OLD = b"bench-key-0123456789abcdef012345", b"bench-old-0123456789abcdef012345"


class State(TypedDict, total=False):
    messages: Annotated[list, add_messages]
    notes: Annotated[list[str], operator.add]
    summary: str
    n: int


def graph() -> StateGraph:
    b = StateGraph(State)
    names = [f"step{i}" for i in range(6)]
    for i, name in enumerate(names):
        b.add_node(name, lambda s, i=i: {"messages": [AIMessage(f"answer {i} " + "lorem ipsum " * 20)],
                                          "notes": [f"note {i}"], "summary": f"after {i}", "n": i})
    b.add_edge(START, names[0])
    for a, c in zip(names, names[1:], strict=False):
        b.add_edge(a, c)
    b.add_edge(names[-1], END)
    return b


@contextmanager
def database(admin: str, name: str) -> Iterator[str]:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ci.make_conninfo(admin, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _contenders() -> dict[str, tuple[str, Any]]:
    aes = EncryptedSerializer.from_pycryptodome_aes(key=KEY)
    return {
        "stock": ("stock", None),
        "stock+aes": ("stock", aes),
        "durable": ("durable", None),
        "durable+aes": ("durable", aes),
        "durable+rotated": ("durable", DurableEncryptedSerializer(KEY, old=[OLD])),
    }


def _open(stack: ExitStack, kind: str, serde: Any, dsn: str) -> Any:
    if kind == "stock":
        conn = stack.enter_context(psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row))
        saver = PostgresSaver(conn, serde=serde)
    else:
        saver = stack.enter_context(DurablePostgresSaver.from_conn_string(dsn, serde=serde))
    saver.setup()
    return saver


def _chat_checkpoint(saver: Any, i: int) -> tuple[Any, dict[str, Any]]:
    values = {
        "messages": [HumanMessage(f"question {j} " + "dolor sit amet " * 15) for j in range(6)],
        "report": {"title": f"report {i}", "items": [f"item {k}" for k in range(20)]},
        "summary": f"summary {i}",
        "n": i,
    }
    cp = empty_checkpoint()
    cp["channel_values"] = values
    cp["channel_versions"] = {k: saver.get_next_version(None, None) for k in values}
    md = {"source": "loop", "step": i, "parents": {}, "customer": f"customer {i}"}
    return cp, md


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def _storage(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND n.nspname = 'public'"
        ).fetchone()
    return int(row[0] or 0) if row else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("LGD_BENCH_DSN", DEFAULT_DSN))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=20, help="chat threads written for the storage figure")
    args = ap.parse_args()
    contenders = _contenders()
    times: dict[str, dict[str, list[float]]] = {n: {"put": [], "get_tuple": [], "invoke": []} for n in contenders}
    storage: dict[str, int] = {}
    print(f"load average before: {os.getloadavg()}")
    with ExitStack() as stack:
        savers, dsns = {}, {}
        for name, (kind, serde) in contenders.items():
            dsns[name] = stack.enter_context(database(args.dsn, "lgd_bench_enc_" + name.replace("+", "_")))
            savers[name] = _open(stack, kind, serde, dsns[name])
        graphs = {name: graph().compile(checkpointer=s) for name, s in savers.items()}
        for r in range(args.rounds + 3):  # 3 warm-up rounds, not counted
            for name, saver in savers.items():
                thread = f"put-{uuid.uuid4().hex[:8]}"
                cp, md = _chat_checkpoint(saver, r)
                cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
                t_put = _timed(lambda: saver.put(cfg, cp, md, cp["channel_versions"]))  # noqa: B023
                t_get = _timed(lambda: saver.get_tuple(cfg))  # noqa: B023
                t_inv = _timed(lambda: graphs[name].invoke(  # noqa: B023
                    {"messages": [HumanMessage("go " + "x" * 200)]},
                    {"configurable": {"thread_id": f"inv-{uuid.uuid4().hex[:8]}"}, "metadata": {"user": "u"}},
                ))
                if r >= 3:
                    times[name]["put"].append(t_put)
                    times[name]["get_tuple"].append(t_get)
                    times[name]["invoke"].append(t_inv)
        for name, g in graphs.items():
            for i in range(args.threads):
                cfg = {"configurable": {"thread_id": f"store-{i}"}, "metadata": {"customer": f"c{i}"}}
                for turn in range(3):
                    g.invoke({"messages": [HumanMessage(f"turn {turn} " + "consectetur " * 30)]}, cfg)
            storage[name] = _storage(dsns[name])
    print(f"load average after: {os.getloadavg()}")
    print(f"\nmedian ms over {args.rounds} rounds (one call per contender per round, in turn)")
    print(f"{'contender':<17}{'put':>9}{'get_tuple':>11}{'invoke':>9}{'storage':>12}")
    for name in contenders:
        m = {k: statistics.median(v) for k, v in times[name].items()}
        print(f"{name:<17}{m['put']:>9.2f}{m['get_tuple']:>11.2f}{m['invoke']:>9.1f}{storage[name] / 1024:>9.0f} KiB")
    for base, enc in (("stock", "stock+aes"), ("durable", "durable+aes"), ("durable", "durable+rotated"),
                      ("stock+aes", "durable+aes")):
        ratios = {k: statistics.median(times[enc][k]) / statistics.median(times[base][k]) for k in times[base]}
        print(f"{enc} / {base}: put x{ratios['put']:.2f}  get_tuple x{ratios['get_tuple']:.2f}  "
              f"invoke x{ratios['invoke']:.2f}  storage x{storage[enc] / storage[base]:.2f}")


if __name__ == "__main__":
    main()
